"""Hostile Hub servers and hostile checkpoint folders: nothing a server says or a file holds
may make zoo write, delete, upload or run anything outside its own folders.

Each test reproduces one attack against ``tests/hubserver.py``'s LocalHub on 127.0.0.1, with
hostile answers switched on (``download_headers``, ``info_override``, ``trickle``...).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hubserver import LocalHub

import zoo
from zoo.testing import small_overrides


def small() -> torch.nn.Module:
    torch.manual_seed(0)
    return zoo.build("gpt2-124m", **small_overrides("gpt2-124m")).eval()


def repo_cache(tmp_path: Path, repo_id: str) -> Path:
    return tmp_path / "hf_home" / "hub" / f"models--{repo_id.replace('/', '--')}"


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


@pytest.fixture(autouse=True)
def _own_zoo_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "zoo-cache"))


# -- critical and high --------------------------------------------------------------------------
def test_an_etag_cannot_place_a_file_outside_the_cache(local_hub: LocalHub, tmp_path: Path):
    """ETag "../../../site-packages/x.pth" made huggingface_hub write the download there (a
    .pth file runs at the next Python start)."""
    zoo.push(small(), "org/m")
    target = tmp_path / "site-packages" / "evil.pth"
    target.parent.mkdir()
    blobs = repo_cache(tmp_path, "org/m") / "blobs"
    blobs.mkdir(parents=True)
    local_hub.download_headers["config.json"] = {"ETag": f'"{os.path.relpath(target, blobs)}"'}
    with pytest.raises(zoo.UnsafeCheckpointError, match="ETag"):
        zoo.load("hf:org/m")
    assert not target.exists() and list(target.parent.iterdir()) == []
    assert not [f for f in files_under(blobs) if not f.startswith(".zoo-")]


def test_an_etag_cannot_make_eviction_delete_a_user_file(local_hub: LocalHub, tmp_path: Path):
    """With the ETag pointing at an existing file, zoo's eviction followed the link and deleted
    that file."""
    zoo.push(small(), "org/m")
    victim = tmp_path / "important.txt"
    victim.write_text("keep me")
    blobs = repo_cache(tmp_path, "org/m") / "blobs"
    blobs.mkdir(parents=True)
    local_hub.download_headers["config.json"] = {"ETag": f'"{os.path.relpath(victim, blobs)}"'}
    with pytest.raises(zoo.ZooError):
        zoo.load("hf:org/m")
    assert victim.read_text() == "keep me"


def test_eviction_never_follows_a_link_out_of_the_cache(tmp_path: Path):
    from zoo.hub.download import evict

    victim = tmp_path / "important.txt"
    victim.write_text("keep me")
    snapshot = tmp_path / "models--org--m" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(victim)
    evict(snapshot / "config.json")
    assert victim.read_text() == "keep me" and not (snapshot / "config.json").exists()


def test_a_commit_id_must_be_40_hex(local_hub: LocalHub, tmp_path: Path):
    """repo_info answered {"sha": "../../x"}; it became the revision and huggingface_hub wrote
    refs/<revision>, overwriting a file outside the cache."""
    zoo.push(small(), "org/m")
    victim = tmp_path / "hf_home" / "victim"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text("keep me")
    local_hub.info_override["sha"] = "../../../victim"
    with pytest.raises(zoo.UnsafeCheckpointError, match="40 hexadecimal"):
        zoo.load("hf:org/m")
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize("kind", ["absolute", "link"])
def test_push_uploads_nothing_from_outside_the_checkpoint(
    local_hub: LocalHub, tmp_path: Path, kind: str
):
    """config.json listing "/etc/hostname" as a tokenizer file made zoo push upload it."""
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    ckpt = tmp_path / "ckpt"
    zoo.save(small(), ckpt)
    manifest = json.loads((ckpt / "config.json").read_text())
    if kind == "absolute":
        listed = str(secret)
    else:
        listed = "vocab.txt"
        (ckpt / listed).symlink_to(secret)
    manifest["tokenizer"] = {"name": "gpt2-bpe", "files": [listed]}
    (ckpt / "config.json").write_text(json.dumps(manifest))
    with pytest.raises(zoo.UnsafeCheckpointError):
        zoo.push(ckpt, "org/leak")
    assert not any(r.method == "POST" and "commit" in r.path for r in local_hub.requests)


# -- medium -------------------------------------------------------------------------------
def test_a_corrupt_download_is_refused_when_the_metadata_call_fails(local_hub: LocalHub):
    """With the file-metadata endpoint answering 503 and one weight byte flipped, the load
    succeeded silently: the bytes are now always checked against the download's ETag."""
    zoo.push(small(), "org/m")
    local_hub.info_status = 503
    local_hub.corrupt_file("org/m", "model.safetensors")
    with pytest.raises(zoo.ChecksumMismatchError, match="LFS sha256"):
        zoo.load("hf:org/m")


def test_a_trickling_server_hits_the_deadline(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """One byte every 5 s made zoo.load hang with no deadline, leaving a 0-byte .incomplete."""
    zoo.push(small(), "org/m")
    monkeypatch.setenv("ZOO_HUB_DEADLINE", "1.5")
    local_hub.trickle = 0.1
    with pytest.raises(zoo.HubUnavailableError, match="ZOO_HUB_DEADLINE"):
        zoo.load("hf:org/m")
    assert not [f for f in files_under(repo_cache(tmp_path, "org/m")) if "incomplete" in f]


def test_a_silent_server_hits_the_stall_timeout(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    zoo.push(small(), "org/m")
    monkeypatch.setenv("ZOO_HUB_STALL_TIMEOUT", "0.5")
    local_hub.trickle = 2.0
    with pytest.raises(zoo.HubUnavailableError, match="ZOO_HUB_STALL_TIMEOUT"):
        zoo.load("hf:org/m")
    assert not [f for f in files_under(repo_cache(tmp_path, "org/m")) if "incomplete" in f]


def test_bad_limits_are_clear_errors(monkeypatch: pytest.MonkeyPatch):
    from zoo.hub.transfer import Limits

    monkeypatch.setenv("ZOO_HUB_DEADLINE", "soon")
    with pytest.raises(ValueError, match="ZOO_HUB_DEADLINE"):
        Limits.from_env()


# -- low ----------------------------------------------------------------------------------------
def test_429_is_retried_with_back_off(local_hub: LocalHub):
    model = small()
    zoo.push(model, "org/m")
    local_hub.throttle = 2
    loaded = zoo.load("hf:org/m")
    assert torch.equal(loaded.state_dict()["head.weight"], model.state_dict()["head.weight"])
    assert sum(r.method == "GET" and "/resolve/" in r.path for r in local_hub.requests) >= 3


@pytest.mark.parametrize("name", ["a\x00b.json", "../outside.json", "/etc/passwd", "sub/dir.json"])
def test_file_names_from_a_repo_must_be_plain(local_hub: LocalHub, tmp_path: Path, name: str):
    ckpt = tmp_path / "ckpt"
    zoo.save(small(), ckpt)
    manifest = json.loads((ckpt / "config.json").read_text())
    manifest["tokenizer"] = {"name": "gpt2-bpe", "files": [name]}
    local_hub.add_files(
        "org/odd",
        {"config.json": json.dumps(manifest), "model.safetensors": ckpt / "model.safetensors"},
    )
    with pytest.raises(zoo.UnsafeCheckpointError, match="not a plain file name"):
        zoo.load("hf:org/odd")


def test_an_etag_cannot_place_a_tokenizer_file_outside_the_cache(
    local_hub: LocalHub, tmp_path: Path
):
    """The GPT-1 vocabulary files were fetched with hf_hub_download, which names the blob after
    the server's ETag: the same traversal wrote a file outside the cache."""
    vocab = Path(__file__).parent / "data" / "gpt1"
    local_hub.add_files(
        "openai-community/openai-gpt",
        {"vocab.json": vocab / "encoder_bpe_40000.json", "merges.txt": vocab / "vocab_40000.bpe"},
    )
    target = tmp_path / "site-packages" / "evil.pth"
    target.parent.mkdir()
    blobs = repo_cache(tmp_path, "openai-community/openai-gpt") / "blobs"
    blobs.mkdir(parents=True)
    local_hub.download_headers["vocab.json"] = {"ETag": f'"{os.path.relpath(target, blobs)}"'}
    with pytest.raises(zoo.UnsafeCheckpointError, match="ETag"):
        zoo.tokenizer("gpt1")
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_no_zoo_code_downloads_through_huggingface_hub():
    """Every zoo download goes through zoo/hub/transfer.py: huggingface_hub's download functions
    name cache files after the server's ETag and X-Repo-Commit unchecked."""
    import re

    root = Path(zoo.__file__).parent
    calls = re.compile(r"\b(hf_hub_download|snapshot_download|HfFileSystem)\s*\(")
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in root.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if calls.search(line)
    ]
    assert found == []


# -- bounds on small files, metadata calls and Retry-After -------------------------------------
def _padded_config(tmp_path: Path, size: int) -> dict[str, object]:
    """The files of a zoo checkpoint whose config.json is padded with spaces to ``size`` bytes."""
    ckpt = tmp_path / "ckpt"
    zoo.save(small(), ckpt)
    text = (ckpt / "config.json").read_text()
    return {
        "config.json": text + " " * (size - len(text)),
        "model.safetensors": ckpt / "model.safetensors",
    }


def _no_blob_over(root: Path, cap: int) -> bool:
    return all(
        p.stat().st_size <= cap for p in root.rglob("*") if p.is_file() and not p.is_symlink()
    )


def test_an_oversized_config_json_is_refused_and_not_kept(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A 1 GiB config.json was downloaded whole and kept in the cache (cap scaled to 8 KB)."""
    local_hub.add_files("org/big", _padded_config(tmp_path, 40_000))
    monkeypatch.setenv("ZOO_HUB_MAX_FILE_BYTES", "8000")
    with pytest.raises(
        zoo.UnsafeCheckpointError,
        match=r"config\.json: the Hub's file metadata declares 40,000 bytes, over the 8,000-byte",
    ):
        zoo.load("hf:org/big")
    cache = repo_cache(tmp_path, "org/big")
    assert _no_blob_over(cache, 8000) and not any("config.json" in f for f in files_under(cache))


def test_a_config_json_without_a_length_is_stopped_at_the_cap(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The cap counts the bytes received: a server that sends no Content-Length (or a false
    one) cannot stream past it. (No file metadata either: it would bound the file first.)"""
    local_hub.add_files("org/big", _padded_config(tmp_path, 40_000))
    local_hub.unsized.add("config.json")
    local_hub.info_status = 503
    monkeypatch.setenv("ZOO_HUB_MAX_FILE_BYTES", "8000")
    with pytest.raises(
        zoo.UnsafeCheckpointError,
        match=r"config\.json: more than 8,000 bytes arrived \(the server announced no size\)",
    ):
        zoo.load("hf:org/big")
    cache = repo_cache(tmp_path, "org/big")
    assert _no_blob_over(cache, 8000) and not any("config.json" in f for f in files_under(cache))


def test_an_oversized_tokenizer_file_is_refused(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Tokenizer files fetched from the Hub are capped like config.json (cap scaled down)."""
    vocab = Path(__file__).parent / "data" / "gpt1"
    local_hub.add_files(
        "openai-community/openai-gpt",
        {"vocab.json": vocab / "encoder_bpe_40000.json", "merges.txt": vocab / "vocab_40000.bpe"},
    )
    monkeypatch.setenv("ZOO_HUB_MAX_FILE_BYTES", "100000")
    with pytest.raises(zoo.UnsafeCheckpointError, match=r"vocab\.json.*ZOO_HUB_MAX_FILE_BYTES"):
        zoo.tokenizer("gpt1")
    assert _no_blob_over(repo_cache(tmp_path, "openai-community/openai-gpt"), 100_000)


def test_a_dripping_api_hits_the_deadline(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A 0.2 s/byte drip on the API made a 5 s ZOO_HUB_DEADLINE take 133 s: the load waited
    for the whole answer. An ordering, not a wall-clock window: the load gives up while the
    drip (a minute and more of it) is still going, not after it."""
    zoo.push(small(), "org/m")
    monkeypatch.setenv("ZOO_HUB_DEADLINE", "1")
    local_hub.api_trickle = 0.2
    with pytest.raises(zoo.HubUnavailableError, match="ZOO_HUB_DEADLINE"):
        zoo.load("hf:org/m")
    assert local_hub.api_dripped == 0, "the load waited for a dripped answer to end"
    local_hub.api_trickle = None  # the abandoned drip ends at once


def test_a_retry_after_past_the_deadline_fails_at_once(
    local_hub: LocalHub, monkeypatch: pytest.MonkeyPatch
):
    """Retry-After: 30 was waited three times (90 s) whatever ZOO_HUB_DEADLINE said. The
    transfer's sleep is recorded, not timed: none is taken."""
    import time
    from types import SimpleNamespace

    from zoo.hub import transfer

    slept: list[float] = []
    clock = SimpleNamespace(monotonic=time.monotonic, time=time.time, sleep=slept.append)
    monkeypatch.setattr(transfer, "time", clock)
    zoo.push(small(), "org/m")
    monkeypatch.setenv("ZOO_HUB_DEADLINE", "5")
    local_hub.throttle, local_hub.retry_after = 10, "30"
    with pytest.raises(zoo.HubUnavailableError, match=r"Retry-After.*ZOO_HUB_DEADLINE"):
        zoo.load("hf:org/m")
    assert slept == [], f"waited {slept} s past a 5 s deadline"


@pytest.mark.parametrize("header", ["nan", "-5", "1e999", "soon", "Wed, 21 Oct 2015 07:28:00 GMT"])
def test_a_senseless_retry_after_is_treated_safely(local_hub: LocalHub, header: str):
    """Retry-After: nan crashed in time.sleep (ValueError); garbage gets the usual back-off."""
    model = small()
    zoo.push(model, "org/m")
    local_hub.throttle, local_hub.retry_after = 1, header
    loaded = zoo.load("hf:org/m")
    assert torch.equal(loaded.state_dict()["head.weight"], model.state_dict()["head.weight"])


def test_retry_after_parsing():
    from zoo.hub.transfer import retry_after

    assert retry_after("3") == 3.0 and retry_after(" 0.5 ") == 0.5
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a past date: now
    for bad in ("nan", "inf", "-1", "1e999", "", None, "soon", "Wed, 99 Foo 2015"):
        assert retry_after(bad) is None
