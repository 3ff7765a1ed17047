"""zoo.push / zoo.pull / zoo.load("hf:...") against a local Hub-compatible server.

Every test talks to ``LocalHub`` (``tests/hubserver.py``) on 127.0.0.1 through the real
``huggingface_hub`` client (the ``local_hub`` fixture points it there, with an empty cache
under ``tmp_path / "hf_home"``); nothing touches the internet.

Official weights: the registry points ``gpt2-124m`` and ``gpt1`` at ``openai-community/gpt2``
and ``openai-community/openai-gpt``. The server is seeded with *tiny* random checkpoints written
by ``transformers.save_pretrained`` under those repo names, not full-size ones: a Hugging Face
checkpoint carries its own ``config.json`` and zoo builds the model from it (the registry's
config only drives ``zoo.build``), so the tiny files go through exactly the code path the real
ones do (registry entry -> repo -> layout -> key map) at a few MB instead of ~500 MB per test.
The vocabulary stays full size so the registered tokenizers attach. The full-size pull is
measured by ``benchmarks/bench_hub.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from hub_fixtures import HUB_TOKEN, hub_client_env, point_client_at
from hubserver import LocalHub

import zoo
from zoo.checkpoint import sha256_file
from zoo.cli import main
from zoo.testing import assert_logits_close, small_overrides

transformers = pytest.importorskip("transformers")

GPT1_FILES = Path(__file__).parent / "data" / "gpt1"  # vendored, see its README.md
GPT2_REPO = "openai-community/gpt2"
GPT1_REPO = "openai-community/openai-gpt"
TINY_HF = {"n_embd": 32, "n_head": 2, "n_layer": 2, "n_positions": 64}


@pytest.fixture(autouse=True)
def _own_zoo_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep zoo's verification memory out of the developer's home."""
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "zoo-cache"))


# -- helpers --------------------------------------------------------------------------------
def small(name: str, seed: int = 0, **overrides: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return zoo.build(name, **{**small_overrides(name), **overrides}).eval()


def logits(model: torch.nn.Module) -> torch.Tensor:
    inputs = model.example_inputs(
        batch_size=2, seq_len=8, generator=torch.Generator().manual_seed(7)
    )
    with torch.no_grad():
        return model(**inputs)


def assert_same_model(actual: torch.nn.Module, expected: torch.nn.Module) -> None:
    theirs = expected.state_dict()
    ours = actual.state_dict()
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key
    torch.testing.assert_close(logits(actual), logits(expected), rtol=0, atol=0, equal_nan=True)


def repo_cache(tmp_path: Path, repo_id: str) -> Path:
    return tmp_path / "hf_home" / "hub" / f"models--{repo_id.replace('/', '--')}"


def cached_files(tmp_path: Path, repo_id: str) -> list[str]:
    root = repo_cache(tmp_path, repo_id)
    return sorted(p.name for p in root.rglob("*") if p.is_file() or p.is_symlink())


def resolved_revisions(hub: LocalHub, repo_id: str) -> set[str]:
    """The revision segment of every file download request for ``repo_id``."""
    prefix = f"/{repo_id}/resolve/"
    return {r.path[len(prefix) :].split("/")[0] for r in hub.requests if r.path.startswith(prefix)}


def front_matter(card: str) -> dict:
    match = re.match(r"^---\n(.*?)\n---\n", card, flags=re.DOTALL)
    assert match, "the model card has no YAML front matter"
    return yaml.safe_load(match.group(1))


def zoo_hub_file(repo: str, filename: str) -> str:
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo, filename)


# -- round trip: every registered architecture ----------------------------------------------
@pytest.mark.parametrize("name", zoo.list_models())
def test_round_trip(name: str, local_hub: LocalHub, tmp_path: Path) -> None:
    model = small(name)
    repo = f"org/{name}"
    ref = zoo.push(model, repo)
    assert ref.sha == local_hub.resolve(repo) and ref.source == f"hf:{repo}@{ref.sha}"
    assert not repo_cache(tmp_path, repo).exists()  # pushing leaves the cache empty

    directory = zoo.pull(repo)
    assert directory.name == ref.sha
    names = sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
    assert names == ["config.json", "model.safetensors"]
    manifest = json.loads((directory / "config.json").read_text())
    assert manifest["format"] == "zoo" and manifest["model_name"] == name
    assert manifest["architecture"] == type(model.config).architecture
    assert manifest["config"] == json.loads(json.dumps(model.config.to_dict()))  # tuples: lists
    assert manifest["weights"]["sha256"] == sha256_file(directory / "model.safetensors")
    assert manifest["weights"]["parameters"] == model.num_parameters()

    loaded = zoo.load(f"hf:{repo}")
    assert loaded.name == name and not loaded.training
    assert_same_model(loaded, model)

    card = Path(zoo_hub_file(repo, "README.md")).read_text()
    meta = front_matter(card)
    assert meta["library_name"] == "zoo" and meta["license"]
    assert {"zoo", manifest["architecture"]} <= set(meta["tags"])
    assert f"{model.num_parameters():,}" in card
    assert f'zoo.load("hf:{repo}")' in card and f"`{manifest['architecture']}`" in card
    for block in zoo.get_registry().architecture(manifest["architecture"]).blocks:
        assert block in card


def test_trained_tokenizer_travels_with_the_weights(local_hub: LocalHub, tmp_path: Path) -> None:
    from zoo.tokenizers import SubwordBPE

    texts = ["the cat sat on the mat", "a dog sat on a log", "the cat and the dog"] * 20
    tok = SubwordBPE.train(texts, vocab_size=300)
    model = small("transformer-encdec-tiny", vocab_size=tok.vocab_size)
    zoo.save(model, tmp_path / "ckpt", tokenizer=tok)
    ref = zoo.push(tmp_path / "ckpt", "org/with-tokenizer", commit_message="a directory")

    directory = zoo.pull(ref.source)
    files = json.loads((directory / "config.json").read_text())["tokenizer"]["files"]
    assert files and all((directory / f).is_file() for f in files)
    loaded = zoo.load("hf:org/with-tokenizer")
    assert loaded.tokenizer.encode("the cat sat") == tok.encode("the cat sat")
    assert_same_model(loaded, model)
    card = Path(zoo_hub_file("org/with-tokenizer", "README.md")).read_text()
    assert "subword-bpe" in card and files[0] in card


def test_push_refuses_what_is_not_a_zoo_checkpoint(local_hub: LocalHub, tmp_path: Path) -> None:
    with pytest.raises(zoo.CheckpointError, match=r"zoo\.save"):
        zoo.push(tmp_path, "org/nothing")
    zoo.save(small("gpt2-124m"), tmp_path / "ckpt")
    with open(tmp_path / "ckpt" / "model.safetensors", "r+b") as f:  # damage it after saving
        f.seek(-1, os.SEEK_END)
        f.write(b"\x00" if f.read(1) != b"\x00" else b"\x01")
    with pytest.raises(zoo.ChecksumMismatchError, match="refusing to publish"):
        zoo.push(tmp_path / "ckpt", "org/damaged")
    assert not [r for r in local_hub.requests if "commit" in r.path]


@pytest.mark.parametrize("inner", ["model", "checkpoint/model"])
def test_push_takes_a_training_run_folder(inner: str, local_hub: LocalHub, tmp_path: Path) -> None:
    """``zoo push runs/mine org/name`` (the README's quickstart): a run's folder stands for its
    final ``model/``, or for ``checkpoint/model`` when the run stopped early, as in zoo.load."""
    model = small("gpt2-124m")
    zoo.save(model, tmp_path / "runs" / "mine" / inner)
    assert main(["push", str(tmp_path / "runs" / "mine"), "org/from-a-run"]) == 0
    assert_same_model(zoo.load("hf:org/from-a-run"), model)


def test_push_of_a_hugging_face_folder_names_the_convert_command(
    local_hub: LocalHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An exported Hugging Face folder is not published as if zoo had written it: the error
    names the exact commands that do it, and those commands work."""
    import shlex

    model = small("gpt2-124m", vocab_size=50257)  # the size of the tokenizer exported with it
    model.tokenizer = zoo.tokenizer("gpt2-124m")
    zoo.export(model, tmp_path / "mine-hf")
    assert main(["push", str(tmp_path / "mine-hf"), "org/exported"]) == 2
    error = capsys.readouterr().err
    assert "is a Hugging Face checkpoint (model_type 'gpt2')" in error, error
    assert not [r for r in local_hub.requests if "commit" in r.path]
    commands = re.search(r"Convert it first, then push the result: (.*) \(in Python", error)
    assert commands, error
    for command in commands.group(1).split(" && "):
        argv = shlex.split(command)
        assert argv[0] == "zoo" and main(argv[1:]) == 0, command
    loaded = zoo.load("hf:org/exported")
    assert_same_model(loaded, model)
    assert loaded.tokenizer.encode("Every effort moves you") == [6109, 3626, 6100, 345]


# -- official weights by name ---------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    """Tiny random GPT-2 and GPT-1 in the Hugging Face layouts (full vocabularies), with the
    GPT-1 BPE files, as ``transformers`` writes them."""
    root = tmp_path_factory.mktemp("hf-checkpoints")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY_HF)).eval()
    gpt2.save_pretrained(root / "gpt2")
    gpt1 = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(**TINY_HF)).eval()
    gpt1.save_pretrained(root / "gpt1")
    shutil.copy(GPT1_FILES / "encoder_bpe_40000.json", root / "gpt1" / "vocab.json")
    shutil.copy(GPT1_FILES / "vocab_40000.bpe", root / "gpt1" / "merges.txt")
    return {"gpt2-124m": (root / "gpt2", gpt2), "gpt1": (root / "gpt1", gpt1)}


OFFICIAL_GPT2_SHA256 = "248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707"


@pytest.fixture
def unpinned_gpt2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt2-124m as registry.toml has it but without the sha256 pin (the local Hub serves
    random weights under the official repo id), chosen with ZOO_PREFER as a user would."""
    text = (Path(__file__).parents[1] / "registry.toml").read_text()
    section = text[text.index("[models.gpt2-124m]") : text.index("[models.wiki-gpt-wordpiece]")]
    stand_in = tmp_path / "unpinned.toml"
    stand_in.write_text(section.replace(f'sha256 = "{OFFICIAL_GPT2_SHA256}"', ""))
    monkeypatch.setenv("ZOO_REGISTRY_PATH", str(stand_in))
    monkeypatch.setenv("ZOO_PREFER", str(stand_in))
    zoo.reset_registry()
    yield
    zoo.reset_registry()


def test_the_official_gpt2_pin_refuses_other_weights(local_hub: LocalHub, hf_checkpoints: dict):
    """registry.toml pins the official file's sha256: the local Hub's random weights under the
    official repo id are refused before they are downloaded."""
    seed_official(local_hub, hf_checkpoints, "gpt2-124m")
    with pytest.raises(zoo.ChecksumMismatchError, match=OFFICIAL_GPT2_SHA256) as err:
        zoo.pull("gpt2-124m")
    assert "the registry pin" in str(err.value) and "Nothing was downloaded" in str(err.value)


def seed_official(hub: LocalHub, checkpoints: dict, name: str) -> str:
    directory, _ = checkpoints[name]
    repo = {"gpt2-124m": GPT2_REPO, "gpt1": GPT1_REPO}[name]
    hub.add_files(repo, {p.name: p for p in directory.iterdir()}, message="seed")
    return repo


@pytest.mark.parametrize("name", ["gpt2-124m", "gpt1"])
def test_official_weights_by_name(
    name: str, local_hub: LocalHub, hf_checkpoints: dict, tmp_path: Path, unpinned_gpt2: None
) -> None:
    repo = seed_official(local_hub, hf_checkpoints, name)
    seen = len(local_hub.requests)
    zoo.build(name, device="meta")  # zoo.build stays random-init and offline
    assert len(local_hub.requests) == seen

    model = zoo.load(name)
    assert model.name == name
    reference = hf_checkpoints[name][1]
    ids = torch.randint(
        0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3)
    )
    directory = zoo.pull(name)  # the very files zoo loaded, read by transformers
    from_files = type(reference).from_pretrained(directory).eval()
    with torch.no_grad():
        ours = model(ids)
        assert_logits_close(ours, reference(ids).logits, atol=1e-5)
        assert_logits_close(ours, from_files(ids).logits, atol=1e-5)

    commit = local_hub.resolve(repo)
    assert resolved_revisions(local_hub, repo) == {commit}  # main resolved once, then the sha
    assert "pytorch_model.bin" not in cached_files(tmp_path, repo)
    if name == "gpt2-124m":
        assert model.tokenizer.encode("Hello world") == [15496, 995]
    else:  # the GPT-1 BPE files come from the same repo and commit
        assert {"vocab.json", "merges.txt"} <= set(cached_files(tmp_path, repo))
        reference_tok = transformers.OpenAIGPTTokenizer(
            str(GPT1_FILES / "encoder_bpe_40000.json"), str(GPT1_FILES / "vocab_40000.bpe")
        )
        text = "Hello world! Every effort moves you"
        assert model.tokenizer.encode(text) == reference_tok.encode(text)


def test_pinned_sha256_is_verified(
    local_hub: LocalHub, hf_checkpoints: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_official(local_hub, hf_checkpoints, "gpt2-124m")
    good = sha256_file(hf_checkpoints["gpt2-124m"][0] / "model.safetensors")
    weights = 'repo = "openai-community/gpt2", layout = "hf-gpt2"'
    registry = tmp_path / "registry.toml"
    registry.write_text(
        f'[models.pinned-gpt2]\narchitecture = "gpt2"\n'
        f'weights = {{{weights}, sha256 = "{good}"}}\n'
        f'[models.wrong-pin]\narchitecture = "gpt2"\n'
        f'weights = {{{weights}, sha256 = "{"0" * 64}"}}\n'
    )
    monkeypatch.setenv("ZOO_REGISTRY_PATH", str(registry))
    zoo.reset_registry()
    try:
        with pytest.raises(zoo.ChecksumMismatchError, match="registry pin") as err:
            zoo.load("wrong-pin")
        assert "Nothing was downloaded" in str(err.value)
        assert "model.safetensors" not in cached_files(tmp_path, GPT2_REPO)
        assert zoo.load("pinned-gpt2").name == "pinned-gpt2"
        assert zoo.pull("pinned-gpt2").name == local_hub.resolve(GPT2_REPO)
    finally:
        monkeypatch.delenv("ZOO_REGISTRY_PATH")
        zoo.reset_registry()


def test_corrupted_official_weights_are_refused(
    local_hub: LocalHub, hf_checkpoints: dict, tmp_path: Path, unpinned_gpt2: None
) -> None:
    seed_official(local_hub, hf_checkpoints, "gpt2-124m")
    local_hub.corrupt_file(GPT2_REPO, "model.safetensors")
    with pytest.raises(zoo.ChecksumMismatchError, match="LFS"):
        zoo.load("gpt2-124m")
    assert "model.safetensors" not in cached_files(tmp_path, GPT2_REPO)


# -- revisions ------------------------------------------------------------------------------
def test_revisions(local_hub: LocalHub) -> None:
    first, second = small("gpt2-124m", seed=1), small("gpt2-124m", seed=2)
    one = zoo.push(first, "org/versions")
    two = zoo.push(second, "org/versions", commit_message="second")
    branch = zoo.push(first, "org/versions", revision="v1")
    assert len({one.sha, two.sha, branch.sha}) == 3 and branch.revision == "v1"

    assert_same_model(zoo.load(f"hf:org/versions@{one.sha}"), first)
    assert_same_model(zoo.load(two.source), second)
    assert_same_model(zoo.load("hf:org/versions"), second)  # main
    assert_same_model(zoo.load("hf:org/versions@v1"), first)
    assert zoo.pull("org/versions", revision=one.sha).name == one.sha
    assert zoo.pull("hf:org/versions@v1").name == branch.sha
    assert zoo.pull("org/versions").name == two.sha
    # every file was fetched at a commit sha, never by branch name
    assert resolved_revisions(local_hub, "org/versions") <= {one.sha, two.sha, branch.sha}
    with pytest.raises(zoo.HubNotFoundError, match="revision"):
        zoo.load("hf:org/versions@no-such-branch")
    with pytest.raises(zoo.HubError, match="commit sha"):
        zoo.push(first, "org/versions", revision=one.sha)


# -- offline, auth and failures -------------------------------------------------------------
def test_offline_warm_cache_works_cold_cache_says_what_to_do(
    local_hub: LocalHub, hub_offline: Callable[[bool], None]
) -> None:
    model = small("gpt2-124m")
    zoo.push(model, "org/warm")
    zoo.push(model, "org/cold")
    zoo.load("hf:org/warm")
    seen = len(local_hub.requests)

    hub_offline(True)
    assert_same_model(zoo.load("hf:org/warm"), model)
    assert zoo.pull("org/warm").name == local_hub.resolve("org/warm")
    with pytest.raises(zoo.HubOfflineError, match="HF_HUB_OFFLINE") as err:
        zoo.load("hf:org/cold")
    assert "zoo pull" in str(err.value)
    assert len(local_hub.requests) == seen  # offline means no traffic at all


def test_gpt1_tokenizer_with_the_hub_unreachable_is_quick_and_quiet(
    local_hub: LocalHub,
    hf_checkpoints: dict,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No network: the cache answers, or one clear error; never huggingface_hub's retry
    back-off (six "Retrying in 8s" lines and 23 s)."""
    import huggingface_hub.utils._http

    def no_backoff(seconds: float) -> None:
        raise AssertionError(f"huggingface_hub backed off for {seconds} s")

    seed_official(local_hub, hf_checkpoints, "gpt1")
    (tmp_path / "files").mkdir()
    shutil.copy(GPT1_FILES / "encoder_bpe_40000.json", tmp_path / "files" / "vocab.json")
    shutil.copy(GPT1_FILES / "vocab_40000.bpe", tmp_path / "files" / "merges.txt")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: connection refused
    point_client_at(monkeypatch, f"http://127.0.0.1:{port}", HUB_TOKEN, tmp_path / "cold")
    monkeypatch.setattr(huggingface_hub.utils._http.time, "sleep", no_backoff)
    with pytest.raises(zoo.tokenizers.TokenizerUnavailableError) as err:
        zoo.tokenizer("gpt1")
    assert "cannot be reached" in str(err.value) and "zoo.tokenizer('gpt1', directory=" in str(
        err.value
    )
    assert "Retrying" not in caplog.text

    point_client_at(monkeypatch, local_hub.endpoint, HUB_TOKEN, tmp_path / "warm")
    zoo.tokenizer("gpt1")  # reachable: fetched and cached
    point_client_at(monkeypatch, f"http://127.0.0.1:{port}", HUB_TOKEN, tmp_path / "warm")
    monkeypatch.setattr(huggingface_hub.utils._http.time, "sleep", no_backoff)
    cached = zoo.tokenizer("gpt1")  # from the cache
    assert cached.encode("hello world") == zoo.tokenizer(
        "gpt1", directory=tmp_path / "files"
    ).encode("hello world")


def test_bad_token(local_hub: LocalHub, monkeypatch: pytest.MonkeyPatch) -> None:
    model = small("gpt2-124m")
    zoo.push(model, "org/model")
    with pytest.raises(zoo.HubAuthError, match="refused the token") as err:
        zoo.push(model, "org/model", token="hf_wrong")
    assert "HF_TOKEN" in str(err.value)
    with pytest.raises(zoo.HubAuthError):
        zoo.push(model, "org/other", token=False)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(zoo.HubAuthError, match="HF_TOKEN"):
        zoo.load("hf:org/model")
    with pytest.raises(zoo.HubAuthError):
        zoo.pull("org/model")


def test_private_repo(local_hub: LocalHub) -> None:
    model = small("gpt2-124m")
    zoo.push(model, "org/secret", private=True)
    with pytest.raises(zoo.HubNotFoundError, match="private"):
        zoo.pull("org/secret", token=False)
    assert zoo.pull("org/secret").is_dir()  # HF_TOKEN grants access


def test_server_down(local_hub: LocalHub) -> None:
    model = small("gpt2-124m")
    zoo.push(model, "org/model")
    zoo.push(model, "org/other")
    zoo.pull("org/model")
    local_hub.stop()
    try:
        assert_same_model(zoo.load("hf:org/model"), model)  # a warm cache needs no Hub
        with pytest.raises(zoo.HubUnavailableError, match=re.escape(local_hub.endpoint)) as err:
            zoo.load("hf:org/other")
        assert not isinstance(err.value, zoo.HubOfflineError)
    finally:
        local_hub.start()
    local_hub.outage_status = 503
    with pytest.raises(zoo.HubUnavailableError, match="503"):
        zoo.pull("org/other")


def test_a_failed_push_talks_about_pushing(local_hub: LocalHub) -> None:
    """A failed push once said "downloads resume where they stopped": it must say the
    push failed, that no partial commit was made, and how to retry."""
    model = small("gpt2-124m")
    local_hub.stop()
    try:
        with pytest.raises(zoo.HubUnavailableError, match="during the push") as err:
            zoo.push(model, "org/model")
    finally:
        local_hub.start()
    local_hub.outage_status = 503
    with pytest.raises(zoo.HubUnavailableError, match="503") as err_503:
        zoo.push(model, "org/model")
    local_hub.outage_status = None
    for message in (str(err.value), str(err_503.value)):
        assert "download" not in message and "cache" not in message
        assert "no partial commit was made" in message and "push again" in message
    assert zoo.push(model, "org/model").sha  # the retry works


def test_dropped_connection_loads_nothing(local_hub: LocalHub, tmp_path: Path) -> None:
    model = small("gpt2-124m")
    zoo.push(model, "org/model")
    local_hub.drop_connection("org/model", "model.safetensors", at_byte=1000, times=None)
    with pytest.raises(zoo.HubUnavailableError, match=r"model\.safetensors") as err:
        zoo.load("hf:org/model")
    assert "Nothing incomplete was kept" in str(err.value)
    weights_sha = local_hub.file_entry("org/model", "model.safetensors").sha256
    left = cached_files(tmp_path, "org/model")
    assert "model.safetensors" not in left and weights_sha not in left
    assert not [f for f in left if f.endswith(".incomplete")]
    local_hub.clear_faults()
    assert_same_model(zoo.load("hf:org/model"), model)


def test_corrupted_download_is_refused(local_hub: LocalHub, tmp_path: Path) -> None:
    model = small("gpt2-124m")
    zoo.push(model, "org/model")
    weights_sha = local_hub.file_entry("org/model", "model.safetensors").sha256
    local_hub.corrupt_file("org/model", "model.safetensors")
    with pytest.raises(zoo.ChecksumMismatchError, match="deleted") as err:
        zoo.load("hf:org/model")
    assert weights_sha in str(err.value)
    assert "model.safetensors" not in cached_files(tmp_path, "org/model")
    assert weights_sha not in cached_files(tmp_path, "org/model")
    with pytest.raises(zoo.ChecksumMismatchError, match="deleted"):
        zoo.pull("org/model")
    assert weights_sha not in cached_files(tmp_path, "org/model")

    local_hub.clear_faults()
    assert_same_model(zoo.load("hf:org/model"), model)


def test_corrupted_config_is_refused(local_hub: LocalHub, tmp_path: Path) -> None:
    zoo.push(small("gpt2-124m"), "org/model")
    local_hub.corrupt_file("org/model", "config.json")
    with pytest.raises(zoo.ChecksumMismatchError, match=r"config\.json"):
        zoo.pull("org/model")
    assert "config.json" not in cached_files(tmp_path, "org/model")


# -- no code from the repo, no pickles ------------------------------------------------------
def test_unknown_architecture_names_what_to_install(local_hub: LocalHub, tmp_path: Path) -> None:
    zoo.save(small("gpt2-124m"), tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    manifest["architecture"] = "martian"
    manifest["plugin"] = {"name": "martian", "distribution": "zoo-martian 1.0"}
    manifest["auto_map"] = {"AutoModel": "modeling_martian.Martian"}  # ignored, never imported
    local_hub.add_files(
        "org/martian",
        {
            "config.json": json.dumps(manifest),
            "model.safetensors": tmp_path / "ckpt" / "model.safetensors",
            "modeling_martian.py": "raise SystemExit('repo code was executed')\n",
        },
    )
    with pytest.raises(zoo.UnknownArchitectureError, match="zoo-martian"):
        zoo.load("hf:org/martian")
    assert not [f for f in cached_files(tmp_path, "org/martian") if f.endswith(".py")]


def test_pickle_only_repo_is_refused(local_hub: LocalHub, tmp_path: Path) -> None:
    config = {"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 2}
    local_hub.add_files(
        "org/pickled", {"config.json": json.dumps(config), "pytorch_model.bin": os.urandom(4096)}
    )
    with pytest.raises(zoo.HubNotFoundError, match="pickle"):
        zoo.load("hf:org/pickled")
    assert "pytorch_model.bin" not in cached_files(tmp_path, "org/pickled")


def test_bad_names(local_hub: LocalHub) -> None:
    for source in ("hf:", "hf:org/x@", "hf:org/two words"):
        with pytest.raises(zoo.HubError):
            zoo.load(source)
    with pytest.raises(zoo.UnknownModelError, match="gpt2"):
        zoo.pull("gpt3-124m")
    with pytest.raises(zoo.HubError, match="no weights on the Hub"):
        zoo.pull("wiki-gpt-wordpiece")
    with pytest.raises(zoo.HubNotFoundError, match="org/missing"):
        zoo.load("hf:org/missing")
    local_hub.add_files("org/not-a-checkpoint", {"notes.txt": "hello"})
    with pytest.raises(zoo.HubNotFoundError, match=r"no config\.json"):
        zoo.pull("org/not-a-checkpoint")


# -- CLI ------------------------------------------------------------------------------------
def test_cli_push_and_pull(
    local_hub: LocalHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = small("gpt2-124m")
    zoo.save(model, tmp_path / "ckpt")
    assert main(["push", str(tmp_path / "ckpt"), "org/cli", "--message", "from the CLI"]) == 0
    sha = local_hub.resolve("org/cli")
    assert sha in capsys.readouterr().out
    assert main(["pull", "org/cli", "--revision", "main"]) == 0
    assert Path(capsys.readouterr().out.strip().splitlines()[-1]).name == sha

    assert main(["pull", "org/missing"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zoo: error:") and len(err.strip().splitlines()) == 1


def test_cli_in_a_subprocess_honours_the_hf_environment(
    local_hub: LocalHub, tmp_path: Path
) -> None:
    """No patched constants: HF_ENDPOINT, HF_HOME/HF_HUB_CACHE and HF_TOKEN as a user sets them."""
    zoo.save(small("gpt2-124m"), tmp_path / "ckpt")
    home = tmp_path / "elsewhere"
    env = {**os.environ, **hub_client_env(local_hub.endpoint, HUB_TOKEN, home)}
    env["ZOO_CACHE_DIR"] = str(tmp_path / "zoo-cache")
    zoo_cli = [sys.executable, "-m", "zoo.cli"]
    push = subprocess.run(
        [*zoo_cli, "push", str(tmp_path / "ckpt"), "org/sub", "--private"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert push.returncode == 0, push.stderr
    pull = subprocess.run(
        [*zoo_cli, "pull", "org/sub"], env=env, capture_output=True, text=True, timeout=120
    )
    assert pull.returncode == 0, pull.stderr
    path = Path(pull.stdout.strip().splitlines()[-1])
    assert path.is_relative_to(home / "hub") and path.name == local_hub.resolve("org/sub")
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest == sha256_file(tmp_path / "ckpt" / "model.safetensors")


def test_a_hugging_face_repo_brings_its_generation_defaults(
    local_hub: LocalHub, hf_checkpoints: dict, tmp_path: Path
) -> None:
    """``generation_config.json`` beside the weights is fetched with them, so a model from
    ``hf:`` decodes with its repo's defaults (Marian's beams, its bad words), as a folder does."""
    directory, _ = hf_checkpoints["gpt2-124m"]
    files = {p.name: p for p in directory.iterdir() if p.name != "generation_config.json"}
    (tmp_path / "generation_config.json").write_text('{"num_beams": 3, "length_penalty": 0.5}')
    local_hub.add_files(
        "org/with-defaults",
        {**files, "generation_config.json": tmp_path / "generation_config.json"},
        message="seed",
    )
    model = zoo.load("hf:org/with-defaults")
    assert model.generation_config is not None
    assert (model.generation_config.num_beams, model.generation_config.length_penalty) == (3, 0.5)
