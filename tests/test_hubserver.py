"""The local Hub server (``hubserver.LocalHub``) driven by the real ``huggingface_hub`` client."""

from __future__ import annotations

import hashlib
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import httpx2
import huggingface_hub
import pytest
from hubserver import LocalHub
from huggingface_hub import CommitOperationDelete, HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

pytest_plugins = ["hub_fixtures"]

README = b"---\nlicense: mit\nlibrary_name: zoo\ntags:\n- zoo\n---\n# A model\n"
WEIGHTS = bytes(range(256)) * 16  # 4 KiB with NUL bytes: a binary, LFS-tracked file
CONFIG = b'{"architecture": "gpt2", "n_layer": 2}\n'


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cache_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() or p.is_symlink()]


def _push(api: HfApi, repo_id: str, folder: Path, weights: bytes) -> str:
    """Upload README (upload_file) and weights + config (upload_folder); return the last sha."""
    api.create_repo(repo_id, exist_ok=True)
    api.upload_file(path_or_fileobj=README, path_in_repo="README.md", repo_id=repo_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "config.json").write_bytes(CONFIG)
    return api.upload_folder(folder_path=folder, repo_id=repo_id, commit_message="weights").oid


def test_push_then_pull_into_empty_cache(local_hub: LocalHub, tmp_path: Path) -> None:
    api = HfApi()
    url = api.create_repo("org/model")
    assert url.repo_id == "org/model" and url.endpoint == local_hub.endpoint
    sha = _push(api, "org/model", tmp_path / "push", WEIGHTS)

    # The safetensors file went through the LFS batch API and a signed PUT; all writes had auth.
    paths = [(r.method, r.path) for r in local_hub.requests]
    assert ("POST", "/org/model.git/info/lfs/objects/batch") in paths
    assert any(m == "PUT" and p.startswith("/_lfs/") for m, p in paths)
    assert all(r.auth == "valid" for r in local_hub.requests if r.path.startswith("/api/"))
    assert local_hub.file_entry("org/model", "model.safetensors").lfs
    assert not local_hub.file_entry("org/model", "config.json").lfs

    info = api.model_info("org/model")
    assert info.sha == sha == local_hub.resolve("org/model")
    assert {s.rfilename for s in info.siblings} == {
        ".gitattributes",
        "README.md",
        "config.json",
        "model.safetensors",
    }

    weights = Path(hf_hub_download("org/model", "model.safetensors"))
    assert weights.read_bytes() == WEIGHTS
    assert weights.parent.name == sha  # snapshots/<commit sha>/
    assert weights.resolve().name == _sha256(WEIGHTS)  # blobs/<sha256>: ETag of an LFS file
    assert Path(hf_hub_download("org/model", "README.md")).read_bytes() == README

    snapshot = Path(snapshot_download("org/model", cache_dir=tmp_path / "fresh"))
    assert snapshot.name == sha
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS
    assert (snapshot / "config.json").read_bytes() == CONFIG
    assert huggingface_hub.ModelCard.load(snapshot / "README.md").data.library_name == "zoo"


def test_invalid_readme_metadata_is_refused(local_hub: LocalHub) -> None:
    HfApi().create_repo("org/model")
    with pytest.raises(ValueError, match=r"Invalid metadata in README\.md"):
        HfApi().upload_file(
            path_or_fileobj=b"---\nlicense: mit\n", path_in_repo="README.md", repo_id="org/model"
        )


def test_old_commits_stay_downloadable(local_hub: LocalHub, tmp_path: Path) -> None:
    api = HfApi()
    first = _push(api, "org/model", tmp_path / "v1", WEIGHTS)
    new_weights = WEIGHTS[::-1]
    second = _push(api, "org/model", tmp_path / "v2", new_weights)
    assert len({first, second}) == 2 and api.model_info("org/model").sha == second
    assert api.model_info("org/model", revision=first).sha == first

    assert Path(hf_hub_download("org/model", "model.safetensors")).read_bytes() == new_weights
    old = Path(hf_hub_download("org/model", "model.safetensors", revision=first))
    assert old.read_bytes() == WEIGHTS
    old_snapshot = Path(snapshot_download("org/model", revision=first))
    assert (old_snapshot / "model.safetensors").read_bytes() == WEIGHTS
    tree = {f.path: f for f in api.list_repo_tree("org/model", revision=first, recursive=True)}
    assert tree["model.safetensors"].lfs.sha256 == _sha256(WEIGHTS)

    # A branch at the old commit; re-uploading identical content makes no new commit.
    api.create_branch("org/model", branch="v1", revision=first)
    assert api.model_info("org/model", revision="v1").sha == first
    again = api.upload_file(
        path_or_fileobj=new_weights, path_in_repo="model.safetensors", repo_id="org/model"
    )
    assert again.oid == second

    # Deletes are commits too; the file stays reachable through the older commit.
    api.create_commit(
        "org/model", [CommitOperationDelete("config.json")], commit_message="drop config"
    )
    assert "config.json" not in api.list_repo_files("org/model")
    assert Path(hf_hub_download("org/model", "config.json", revision=second)).read_bytes() == CONFIG


def test_bad_token_is_refused(local_hub: LocalHub, monkeypatch: pytest.MonkeyPatch) -> None:
    local_hub.add_files("org/model", {"config.json": CONFIG})
    with pytest.raises(HfHubHTTPError) as write:
        HfApi(token="hf_wrong").create_repo("org/other")
    assert write.value.response.status_code == 401
    assert "Invalid credentials" in str(write.value)
    with pytest.raises(HfHubHTTPError) as anonymous_write:
        HfApi(token=False).create_repo("org/other")
    assert anonymous_write.value.response.status_code == 401

    # A wrong HF_TOKEN breaks even public reads, as on the Hub.
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HfHubHTTPError) as read:
        hf_hub_download("org/model", "config.json")
    assert read.value.response.status_code == 401
    assert [r.auth for r in local_hub.requests][-1] == "invalid"


def test_private_repo_needs_the_token(local_hub: LocalHub) -> None:
    local_hub.add_files("org/secret", {"config.json": CONFIG}, private=True)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/secret", "config.json", token=False)
    with pytest.raises(RepositoryNotFoundError):
        HfApi(token=False).model_info("org/secret")
    assert (
        Path(hf_hub_download("org/secret", "config.json", token=local_hub.token)).read_bytes()
        == CONFIG
    )


def test_missing_repo_file_and_revision(local_hub: LocalHub) -> None:
    local_hub.add_files("org/model", {"config.json": CONFIG})
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/nope", "config.json")
    with pytest.raises(RepositoryNotFoundError):
        HfApi().model_info("org/nope")
    with pytest.raises(RemoteEntryNotFoundError) as entry:
        hf_hub_download("org/model", "missing.json")
    assert isinstance(entry.value, EntryNotFoundError)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download("org/model", "config.json", revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        HfApi().model_info("org/model", revision="0" * 40)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download("org/model", revision="no-such-branch")


def test_offline_uses_the_warm_cache(
    local_hub: LocalHub, hub_offline: Callable[[bool], None]
) -> None:
    local_hub.add_files("org/model", {"config.json": CONFIG, "model.safetensors": WEIGHTS})
    local_hub.add_files("org/cold", {"config.json": CONFIG})
    warm_file = hf_hub_download("org/model", "config.json")
    warm_snapshot = snapshot_download("org/model")
    seen = len(local_hub.requests)

    hub_offline(True)
    assert hf_hub_download("org/model", "config.json") == warm_file
    assert snapshot_download("org/model") == warm_snapshot
    with pytest.raises(LocalEntryNotFoundError):
        hf_hub_download("org/cold", "config.json")
    with pytest.raises(LocalEntryNotFoundError):
        snapshot_download("org/cold")
    assert len(local_hub.requests) == seen  # offline means no traffic at all


def test_server_down_then_back(local_hub: LocalHub) -> None:
    local_hub.add_files("org/model", {"config.json": CONFIG, "model.safetensors": WEIGHTS})
    warm = hf_hub_download("org/model", "config.json")
    local_hub.stop()
    assert hf_hub_download("org/model", "config.json") == warm  # refs/main -> cached snapshot
    with pytest.raises(LocalEntryNotFoundError):
        hf_hub_download("org/model", "model.safetensors")
    local_hub.start()  # same port, same repos
    assert Path(hf_hub_download("org/model", "model.safetensors")).read_bytes() == WEIGHTS


def test_outage_status(local_hub: LocalHub) -> None:
    local_hub.add_files("org/model", {"config.json": CONFIG})
    local_hub.outage_status = 503
    with pytest.raises(HfHubHTTPError) as outage:
        HfApi().model_info("org/model")
    assert outage.value.response.status_code == 503
    local_hub.clear_faults()
    assert HfApi().model_info("org/model").sha == local_hub.resolve("org/model")


def test_single_drop_is_resumed_with_range(local_hub: LocalHub) -> None:
    # The client writes 10 MiB chunks and resumes from what it wrote: cut after the first one.
    big = os.urandom(11 * 1024 * 1024)
    local_hub.add_files("org/model", {"model.safetensors": big})
    cut = 10 * 1024 * 1024 + 1234
    local_hub.drop_connection("org/model", "model.safetensors", at_byte=cut, times=1)
    assert Path(hf_hub_download("org/model", "model.safetensors")).read_bytes() == big
    ranges = [r.range for r in local_hub.requests if r.method == "GET"]
    assert ranges == [None, f"bytes={10 * 1024 * 1024}-"]


def test_persistent_drop_fails_and_leaves_no_file(local_hub: LocalHub, tmp_path: Path) -> None:
    local_hub.add_files("org/model", {"model.safetensors": WEIGHTS})
    local_hub.drop_connection("org/model", "model.safetensors", at_byte=1000, times=None)
    with pytest.raises(httpx2.RemoteProtocolError, match="peer closed connection"):
        hf_hub_download("org/model", "model.safetensors")
    cache = tmp_path / "hf_home" / "hub" / "models--org--model"
    assert not (cache / "blobs" / _sha256(WEIGHTS)).exists()
    assert not list((cache / "snapshots").rglob("model.safetensors"))
    assert not [p for p in _cache_files(cache) if p.name.endswith(".incomplete")]


def test_corrupted_bytes_are_detectable(local_hub: LocalHub) -> None:
    local_hub.add_files("org/model", {"model.safetensors": WEIGHTS})
    local_hub.corrupt_file("org/model", "model.safetensors")
    path = Path(hf_hub_download("org/model", "model.safetensors"))
    served = path.read_bytes()
    assert len(served) == len(WEIGHTS) and served != WEIGHTS
    tree = {f.path: f for f in HfApi().list_repo_tree("org/model", recursive=True)}
    expected = huggingface_hub.get_hf_file_metadata(
        huggingface_hub.hf_hub_url("org/model", "model.safetensors")
    ).etag
    assert expected == tree["model.safetensors"].lfs.sha256 == _sha256(WEIGHTS) != _sha256(served)


def test_raw_http_headers(local_hub: LocalHub) -> None:
    sha = local_hub.add_files("org/model", {"model.safetensors": WEIGHTS, "config.json": CONFIG})
    base = f"{local_hub.endpoint}/org/model/resolve/main"

    head_request = urllib.request.Request(f"{base}/model.safetensors", method="HEAD")
    with urllib.request.urlopen(head_request) as head:
        assert head.headers["X-Repo-Commit"] == sha
        assert head.headers["ETag"] == f'"{_sha256(WEIGHTS)}"' == head.headers["X-Linked-Etag"]
        assert head.headers["Content-Length"] == head.headers["X-Linked-Size"] == str(len(WEIGHTS))
    git_oid = hashlib.sha1(b"blob %d\0" % len(CONFIG) + CONFIG).hexdigest()
    with urllib.request.urlopen(f"{base}/config.json") as config:
        assert config.headers["ETag"] == f'"{git_oid}"' and config.read() == CONFIG

    ranged = urllib.request.Request(f"{base}/model.safetensors", headers={"Range": "bytes=10-19"})
    with urllib.request.urlopen(ranged) as part:
        assert part.status == 206 and part.read() == WEIGHTS[10:20]
        assert part.headers["Content-Range"] == f"bytes 10-19/{len(WEIGHTS)}"

    for url, code in [
        (f"{base}/missing", "EntryNotFound"),
        (f"{local_hub.endpoint}/org/model/resolve/nope/config.json", "RevisionNotFound"),
        (f"{local_hub.endpoint}/org/nope/resolve/main/config.json", "RepoNotFound"),
    ]:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url)
        assert err.value.headers["X-Error-Code"] == code
        assert err.value.code in (401, 404)


def test_seeding_from_local_files(local_hub: LocalHub, tmp_path: Path) -> None:
    big = tmp_path / "pytorch_model.bin"
    big.write_bytes(os.urandom(64 * 1024))
    sha = local_hub.add_files(
        "openai-community/gpt2",
        {"pytorch_model.bin": big, "vocab.json": '{"a": 0}', "merges.txt": b"#version: 0.2\n"},
        message="seed",
    )
    assert local_hub.list_files("openai-community/gpt2", sha) == [
        ".gitattributes",
        "merges.txt",
        "pytorch_model.bin",
        "vocab.json",
    ]
    assert local_hub.file_entry("openai-community/gpt2", "pytorch_model.bin").lfs
    assert not local_hub.file_entry("openai-community/gpt2", "vocab.json").lfs
    snapshot = Path(snapshot_download("openai-community/gpt2"))
    assert snapshot.name == sha
    assert (snapshot / "pytorch_model.bin").read_bytes() == big.read_bytes()
    assert (snapshot / "vocab.json").read_text() == '{"a": 0}'


def test_no_threads_outlive_the_hub(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    with LocalHub(token="hf_x") as hub:
        hub.add_files("org/model", {"config.json": CONFIG})
        for _ in range(3):
            with urllib.request.urlopen(f"{hub.endpoint}/org/model/resolve/main/config.json") as r:
                assert r.read() == CONFIG
        root = hub._root
    assert set(threading.enumerate()) <= before
    assert not root.exists()
