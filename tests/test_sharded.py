"""Sharded safetensors: ``model.safetensors.index.json`` and its shards.

Saving, exporting and pushing with ``max_shard_size`` split as transformers does (through
``huggingface_hub.split_torch_state_dict_into_shards``), with its file names and index; the
result loads back exactly, in zoo and in ``transformers.from_pretrained``. Loading treats the
index as hostile: every refusal below names the key, shard or file at fault. The Hub tests
push to and pull from the local Hub-compatible server (``local_hub``), attacks included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from hubserver import LocalHub

import zoo
from zoo.checkpoint.files import sha256_file
from zoo.checkpoint.reshard import reshard
from zoo.checkpoint.shards import INDEX_FILE, parse_max_shard_size
from zoo.cli import main
from zoo.errors import (
    CheckpointError,
    ChecksumMismatchError,
    HubNotFoundError,
    UnsafeCheckpointError,
)

transformers = pytest.importorskip("transformers")

SHARD = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")
#: llama-tiny is 0.5 MB of float32: 30 kB shards make about ten of them.
SMALL_SHARDS = 30_000


@pytest.fixture(autouse=True)
def _own_zoo_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with an empty verification memory, outside the developer's home."""
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "zoo-cache"))


@pytest.fixture
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return zoo.build("llama-tiny").eval()


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(0, 320, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return model(ids)


def assert_same_model(actual: torch.nn.Module, expected: torch.nn.Module) -> None:
    ours, theirs = actual.state_dict(), expected.state_dict()
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key
    assert torch.equal(logits(actual), logits(expected))


def shard_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if SHARD.fullmatch(p.name))


def index_of(directory: Path) -> dict:
    return json.loads((directory / INDEX_FILE).read_text())


def write_index(directory: Path, index: dict) -> None:
    (directory / INDEX_FILE).unlink()  # a link into the version folder: replace, never edit
    (directory / INDEX_FILE).write_text(json.dumps(index))


# -- save and load --------------------------------------------------------------------------
def test_save_splits_as_transformers_does_and_loads_back(model, tmp_path: Path) -> None:
    zoo.save(model, tmp_path / "ckpt", max_shard_size=SMALL_SHARDS)
    shards = shard_files(tmp_path / "ckpt")
    assert len(shards) >= 3 and not (tmp_path / "ckpt" / "model.safetensors").exists()
    assert [SHARD.fullmatch(s).groups() for s in shards] == [  # type: ignore[union-attr]
        (f"{i:05d}", f"{len(shards):05d}") for i in range(1, len(shards) + 1)
    ]
    index = index_of(tmp_path / "ckpt")
    assert set(index) == {"metadata", "weight_map"}
    assert set(index["weight_map"].values()) == set(shards)
    assert set(index["weight_map"]) == set(model.state_dict())  # no tied weights here
    params = sum(p.numel() for p in model.parameters())
    assert index["metadata"] == {"total_parameters": params, "total_size": 4 * params}
    for name in shards:  # each shard holds what the index says, no shard above the limit
        on_disk = safetensors.torch.load_file(tmp_path / "ckpt" / name)
        assert set(on_disk) == {k for k, v in index["weight_map"].items() if v == name}
        assert len(on_disk) == 1 or sum(t.nbytes for t in on_disk.values()) <= SMALL_SHARDS

    manifest = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert manifest["format_version"] == 2
    weights = manifest["weights"]
    assert weights["file"] == INDEX_FILE
    assert weights["sha256"] == sha256_file(tmp_path / "ckpt" / INDEX_FILE)
    assert weights["shards"] == {s: sha256_file(tmp_path / "ckpt" / s) for s in shards}

    loaded = zoo.load(tmp_path / "ckpt", verify=True)
    assert_same_model(loaded, model)
    assert loaded.load_report.ok


def test_the_split_is_huggingface_hub_s(model, tmp_path: Path) -> None:
    """The weight map is what ``split_torch_state_dict_into_shards`` gives for the state dict
    zoo writes, with the size string parsed as it parses it (powers of 1000)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    from zoo.checkpoint.state import unique_state

    zoo.save(model, tmp_path / "ckpt", max_shard_size="0.1MB")
    split = split_torch_state_dict_into_shards(unique_state(model), max_shard_size="0.1MB")
    assert index_of(tmp_path / "ckpt")["weight_map"] == split.tensor_to_filename
    assert parse_max_shard_size("5GB") == 5 * 10**9 and parse_max_shard_size(" 500mb") == 5 * 10**8


def test_the_default_and_a_model_that_fits_stay_one_file(model, tmp_path: Path) -> None:
    zoo.save(model, tmp_path / "default")
    zoo.save(model, tmp_path / "fits", max_shard_size="5GB")
    for folder in ("default", "fits"):
        names = sorted(p.name for p in (tmp_path / folder).iterdir() if p.name[0] != ".")
        assert names == ["config.json", "model.safetensors"]
        manifest = json.loads((tmp_path / folder / "config.json").read_text())
        assert manifest["format_version"] == 1 and "shards" not in manifest["weights"]
    default, fits = (tmp_path / d / "model.safetensors" for d in ("default", "fits"))
    assert header(default) == header(fits)  # (safetensors orders the metadata at random)
    assert_same_tensors(safetensors.torch.load_file(default), safetensors.torch.load_file(fits))


def header(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {"metadata": f.metadata(), "keys": sorted(f.keys())}


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("size", ["5GiB", "5 bytes", "", 0, -1, True, 1.5, "0MB"])
def test_a_bad_max_shard_size_writes_nothing(model, tmp_path: Path, size) -> None:
    for write in (zoo.save, lambda m, d, **kw: zoo.export(m, d, layout="hf-llama", **kw)):
        with pytest.raises(ValueError):
            write(model, tmp_path / "out", max_shard_size=size)
        assert not (tmp_path / "out").exists()


def test_a_tensor_larger_than_the_limit_gets_a_shard_of_its_own(model, tmp_path: Path) -> None:
    zoo.save(model, tmp_path / "ckpt", max_shard_size=1)
    weight_map = index_of(tmp_path / "ckpt")["weight_map"]
    assert len(shard_files(tmp_path / "ckpt")) == len(weight_map)
    assert_same_model(zoo.load(tmp_path / "ckpt"), model)


def test_resaving_switches_between_one_file_and_shards_atomically(model, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    zoo.save(model, ckpt)
    zoo.save(model, ckpt, max_shard_size=SMALL_SHARDS)
    assert not (ckpt / "model.safetensors").exists() and shard_files(ckpt)
    zoo.save(model, ckpt, max_shard_size=3 * SMALL_SHARDS)  # fewer shards: none left over
    assert shard_files(ckpt) == sorted(set(index_of(ckpt)["weight_map"].values()))
    zoo.save(model, ckpt)
    assert not shard_files(ckpt) and not (ckpt / INDEX_FILE).exists()
    assert_same_model(zoo.load(ckpt), model)


def test_a_save_failing_at_a_later_shard_keeps_the_old_checkpoint(
    model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "ckpt"
    zoo.save(model, ckpt, max_shard_size=SMALL_SHARDS)
    before = {p.name: p.read_bytes() for p in ckpt.iterdir() if p.name[0] != "."}
    real = safetensors.torch.save_file
    written: list[str] = []

    def disk_full_at_the_third(tensors, filename, metadata=None):  # type: ignore[no-untyped-def]
        written.append(filename)
        if len(written) == 3:
            raise OSError(28, "No space left on device")
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full_at_the_third)
    torch.manual_seed(1)
    other = zoo.build("llama-tiny")
    with pytest.raises(CheckpointError, match="unchanged"):
        zoo.save(other, ckpt, max_shard_size=SMALL_SHARDS)
    assert {p.name: p.read_bytes() for p in ckpt.iterdir() if p.name[0] != "."} == before
    assert_same_model(zoo.load(ckpt), model)


# -- verification covers every shard ----------------------------------------------------------
def flip_a_weight_byte(path: Path) -> None:
    """Change one byte of tensor data (the header stays valid): only a hash can tell."""
    header = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    with open(path, "r+b") as f:
        f.seek(header + 1)
        byte = f.read(1)
        f.seek(header + 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def real_file(link: Path) -> Path:
    """The file behind a checkpoint name (names are links into the current version)."""
    return link.resolve()


def test_every_shard_is_verified_and_remembered(
    model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zoo.checkpoint.files import BackgroundHash

    ckpt = tmp_path / "ckpt"
    zoo.save(model, ckpt, max_shard_size=SMALL_SHARDS)
    names = shard_files(ckpt)
    for name in [*names, INDEX_FILE]:  # settled: old enough to be remembered once verified
        os.utime(real_file(ckpt / name), (1e9, 1e9))
    hashed: list[list[str]] = []

    class Counting(BackgroundHash):
        def __init__(self, expected, **kwargs):  # type: ignore[no-untyped-def]
            hashed.append(sorted(p.name for p in expected))
            super().__init__(expected, **kwargs)

    monkeypatch.setattr("zoo.checkpoint.load.BackgroundHash", Counting)
    zoo.load(ckpt)
    assert hashed == [names]  # every shard, on one hasher
    zoo.load(ckpt)
    assert len(hashed) == 1  # remembered: not hashed again while unchanged
    zoo.load(ckpt, verify=True)
    assert hashed[-1] == names

    middle = names[len(names) // 2]
    flip_a_weight_byte(real_file(ckpt / middle))
    with pytest.raises(ChecksumMismatchError, match=re.escape(middle)) as err:
        zoo.load(ckpt)
    assert sum(name in str(err.value) for name in names) == 1  # only the damaged one named
    assert hashed[-1] == [middle]  # the others are still remembered
    unchecked = zoo.load(ckpt, verify=False)  # the opt-out, at the user's risk
    assert not torch.equal(logits(unchecked), logits(model))


def test_a_swapped_shard_or_index_is_refused(model, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    zoo.save(model, ckpt, max_shard_size=SMALL_SHARDS)
    torch.manual_seed(1)
    zoo.save(zoo.build("llama-tiny"), tmp_path / "other", max_shard_size=SMALL_SHARDS)
    first = shard_files(ckpt)[0]  # same keys, other values: a valid file, the wrong one
    (ckpt / first).unlink()
    shutil.copy(tmp_path / "other" / first, ckpt / first)
    with pytest.raises(ChecksumMismatchError, match=re.escape(first)):
        zoo.load(ckpt)

    zoo.save(model, ckpt, max_shard_size=SMALL_SHARDS)
    index = index_of(ckpt)
    index["metadata"]["total_size"] += 1
    write_index(ckpt, index)
    with pytest.raises(ChecksumMismatchError, match="the index is damaged"):
        zoo.load(ckpt)


def test_config_json_and_the_index_must_name_the_same_shards(model, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    zoo.save(model, ckpt, max_shard_size=SMALL_SHARDS)
    path = ckpt / "config.json"
    manifest = json.loads(path.read_text())
    manifest["weights"]["shards"].pop(shard_files(ckpt)[-1])
    path.unlink()
    path.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="records"):
        zoo.load(ckpt)


def test_verify_true_needs_every_shard_s_hash(model, tmp_path: Path) -> None:
    zoo.export(model, tmp_path / "hf", layout="hf-llama", max_shard_size=SMALL_SHARDS)
    with pytest.raises(CheckpointError, match="verify=True but no sha256"):
        zoo.load(tmp_path / "hf", verify=True)
    assert_same_model(zoo.load(tmp_path / "hf"), model)


# -- a hostile index ------------------------------------------------------------------------
@pytest.fixture
def hf_sharded(model, tmp_path: Path) -> Path:
    """An export in the hf-llama layout (no hashes recorded: the index alone says where the
    tensors are, as in any transformers folder)."""
    return zoo.export(model, tmp_path / "hf", layout="hf-llama", max_shard_size=SMALL_SHARDS)


def outside_file(tmp_path: Path, source: Path) -> Path:
    """A valid shard lying outside the checkpoint folder, which no index may reach."""
    target = tmp_path / "outside" / "evil.safetensors"
    target.parent.mkdir()
    shutil.copy(source, target)
    return target


@pytest.mark.parametrize(
    "name",
    [
        "../outside/evil.safetensors",
        "ABSOLUTE",
        "sub/evil.safetensors",
        "..",
        ".hidden.safetensors",
        "evil.bin",
        "evil\x00.safetensors",
    ],
)
def test_shard_names_must_be_plain_names_in_the_folder(
    hf_sharded: Path, tmp_path: Path, name: str
) -> None:
    index = index_of(hf_sharded)
    key, shard = next(iter(index["weight_map"].items()))
    evil = outside_file(tmp_path, hf_sharded / shard)
    index["weight_map"][key] = str(evil) if name == "ABSOLUTE" else name
    write_index(hf_sharded, index)
    with pytest.raises(UnsafeCheckpointError, match=r"plain \.safetensors file name") as err:
        zoo.load(hf_sharded)
    assert key in str(err.value)


def test_a_missing_shard_file_is_named(hf_sharded: Path) -> None:
    shards = shard_files(hf_sharded)
    for gone in (shards[1], shards[-1]):
        (hf_sharded / gone).unlink()
    with pytest.raises(CheckpointError, match="2 shard") as err:
        zoo.load(hf_sharded)
    assert shards[1] in str(err.value) and shards[-1] in str(err.value)


def test_a_key_of_the_map_missing_from_its_shard_is_named(hf_sharded: Path) -> None:
    index = index_of(hf_sharded)
    shard = shard_files(hf_sharded)[0]
    index["weight_map"]["model.layers.0.mlp.ghost.weight"] = shard
    write_index(hf_sharded, index)
    with pytest.raises(CheckpointError, match="not in the shard it names") as err:
        zoo.load(hf_sharded)
    assert "model.layers.0.mlp.ghost.weight" in str(err.value) and shard in str(err.value)


def test_a_tensor_missing_from_the_map_is_named(hf_sharded: Path) -> None:
    index = index_of(hf_sharded)
    key, shard = sorted(index["weight_map"].items())[-1]
    del index["weight_map"][key]
    write_index(hf_sharded, index)
    with pytest.raises(CheckpointError, match="does not list it") as err:
        zoo.load(hf_sharded)
    assert key in str(err.value) and shard in str(err.value)


def test_a_tensor_in_another_shard_than_the_map_says_is_refused(hf_sharded: Path) -> None:
    index = index_of(hf_sharded)
    weight_map = index["weight_map"]
    keys_of = {s: [k for k, v in weight_map.items() if v == s] for s in shard_files(hf_sharded)}
    crowded = next(s for s, keys in keys_of.items() if len(keys) > 1)  # still read afterwards
    elsewhere = next(s for s in keys_of if s != crowded)
    index["weight_map"][keys_of[crowded][0]] = elsewhere
    write_index(hf_sharded, index)
    with pytest.raises(CheckpointError, match=f"puts it in {re.escape(elsewhere)}") as err:
        zoo.load(hf_sharded)
    assert keys_of[crowded][0] in str(err.value) and crowded in str(err.value)


def test_a_tensor_in_two_shards_is_refused(hf_sharded: Path) -> None:
    shards = shard_files(hf_sharded)
    first = safetensors.torch.load_file(hf_sharded / shards[0])
    second = safetensors.torch.load_file(hf_sharded / shards[1])
    key = next(iter(first))
    (hf_sharded / shards[1]).unlink()
    safetensors.torch.save_file({**second, key: first[key]}, hf_sharded / shards[1])
    with pytest.raises(CheckpointError, match="more than one shard") as err:
        zoo.load(hf_sharded)
    assert key in str(err.value) and shards[0] in str(err.value) and shards[1] in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{}", "no 'weight_map'"),
        ('{"weight_map": []}', "no 'weight_map'"),
        ('{"weight_map": {}}', "no 'weight_map'"),
        ("not json", "not valid"),
        ('{"weight_map": {"a": "model-00001-of-00002.safetensors", '
         '"a": "model-00002-of-00002.safetensors"}}', "appears twice"),
        ('{"weight_map": {"a": 3}}', r"plain \.safetensors"),
    ],
)  # fmt: skip
def test_a_damaged_index_is_a_checkpoint_error(hf_sharded: Path, text: str, message: str) -> None:
    (hf_sharded / INDEX_FILE).unlink()
    (hf_sharded / INDEX_FILE).write_text(text)
    with pytest.raises(CheckpointError, match=message):
        zoo.load(hf_sharded)


# -- transformers' folders, both ways -------------------------------------------------------
def test_a_sharded_export_loads_in_transformers(model, tmp_path: Path) -> None:
    zoo.export(model, tmp_path / "hf", layout="hf-llama", max_shard_size=SMALL_SHARDS)
    assert len(shard_files(tmp_path / "hf")) >= 3
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, 320, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        diff = (theirs(ids).logits - model(ids)).abs().max().item()
    assert diff <= 1e-5, diff
    assert_same_model(zoo.load(tmp_path / "hf"), model)


def transformers_sharded_llama(folder: Path) -> Any:
    """A small Llama saved by transformers into ``folder`` in shards of 100 KB; returned."""
    config = transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    theirs = transformers.LlamaForCausalLM(config).eval()
    theirs.save_pretrained(folder, max_shard_size="100KB")
    return theirs


def test_a_transformers_sharded_folder_loads(tmp_path: Path) -> None:
    theirs = transformers_sharded_llama(tmp_path / "hf")
    assert len(shard_files(tmp_path / "hf")) >= 3
    ours = zoo.load(tmp_path / "hf")
    ids = torch.randint(0, 320, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        diff = (theirs(ids).logits - ours(ids)).abs().max().item()
    assert diff <= 1e-5, diff
    # the index file itself, or one of the shards, given as the path loads the same folder
    for path in (tmp_path / "hf" / INDEX_FILE,):
        assert torch.equal(logits(zoo.load(path)), logits(ours))


def test_zoo_shards_without_config_json_load_from_their_metadata(model, tmp_path: Path) -> None:
    zoo.save(model, tmp_path / "ckpt", max_shard_size=SMALL_SHARDS)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in [*shard_files(tmp_path / "ckpt"), INDEX_FILE]:
        shutil.copy(tmp_path / "ckpt" / name, bare / name)
    assert_same_model(zoo.load(bare), model)


# -- resharding a saved folder, the CLI -----------------------------------------------------
def test_reshard_keeps_every_tensor_and_checks_the_source(model, tmp_path: Path) -> None:
    zoo.save(model, tmp_path / "one")
    reshard(tmp_path / "one", tmp_path / "many", max_shard_size=SMALL_SHARDS)
    assert len(shard_files(tmp_path / "many")) >= 3
    assert_same_model(zoo.load(tmp_path / "many", verify=True), model)
    reshard(tmp_path / "many", tmp_path / "back", max_shard_size=None)
    assert (tmp_path / "back" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "back" / "config.json").read_text())["format_version"] == 1
    assert_same_model(zoo.load(tmp_path / "back", verify=True), model)

    flip_a_weight_byte(real_file(tmp_path / "many" / shard_files(tmp_path / "many")[0]))
    with pytest.raises(ChecksumMismatchError, match="refusing to rewrite"):
        reshard(tmp_path / "many", tmp_path / "never", max_shard_size=None)
    assert not (tmp_path / "never").exists()


def test_cli_convert_takes_max_shard_size(model, tmp_path: Path, capsys) -> None:
    zoo.save(model, tmp_path / "ckpt")
    out = tmp_path / "hf"
    args = ["convert", str(tmp_path / "ckpt"), str(out), "--to", "hf-llama"]
    assert main([*args, "--max-shard-size", str(SMALL_SHARDS)]) == 0
    assert len(shard_files(out)) >= 3 and (out / INDEX_FILE).is_file()
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--max-shard-size", "5GiB"])
    assert exit_.value.code == 2 and "--max-shard-size" in capsys.readouterr().err


# -- the Hub --------------------------------------------------------------------------------
def hub_files(hub: LocalHub, repo: str) -> list[str]:
    from huggingface_hub import HfApi

    return sorted(HfApi().list_repo_files(repo))


def shard_downloads(hub: LocalHub, repo: str) -> list[str]:
    return [r.path for r in hub.requests if r.path.startswith(f"/{repo}/resolve/")
            and r.path.endswith(".safetensors")]  # fmt: skip


def test_push_sharded_and_pull_it_back(model, local_hub: LocalHub, tmp_path: Path) -> None:
    ref = zoo.push(model, "org/sharded", max_shard_size=SMALL_SHARDS)
    files = hub_files(local_hub, "org/sharded")
    shards = [f for f in files if SHARD.fullmatch(f)]
    assert len(shards) >= 3 and INDEX_FILE in files and "model.safetensors" not in files
    directory = zoo.pull("org/sharded")
    assert directory.name == ref.sha
    assert shard_files(directory) == shards and (directory / INDEX_FILE).is_file()
    manifest = json.loads((directory / "config.json").read_text())
    assert manifest["weights"]["shards"] == {s: sha256_file(directory / s) for s in shards}
    assert_same_model(zoo.load("hf:org/sharded", verify=True), model)
    from huggingface_hub import hf_hub_download

    card = Path(hf_hub_download("org/sharded", "README.md")).read_text()
    assert f"{len(shards)} shards" in card


def test_push_a_directory_resharded_and_as_it_is(
    model, local_hub: LocalHub, tmp_path: Path, capsys
) -> None:
    zoo.save(model, tmp_path / "one")
    zoo.push(tmp_path / "one", "org/resharded", max_shard_size=SMALL_SHARDS)
    assert len([f for f in hub_files(local_hub, "org/resharded") if SHARD.fullmatch(f)]) >= 3
    assert_same_model(zoo.load("hf:org/resharded"), model)
    assert not shard_files(tmp_path / "one")  # the folder itself is left as it was

    zoo.save(model, tmp_path / "many", max_shard_size=SMALL_SHARDS)
    argv = ["push", str(tmp_path / "many"), "org/as-is"]
    assert main(argv) == 0
    assert [f for f in hub_files(local_hub, "org/as-is") if SHARD.fullmatch(f)] == shard_files(
        tmp_path / "many"
    )
    assert_same_model(zoo.load("hf:org/as-is"), model)
    assert main([*argv[:2], "org/cli", "--max-shard-size", "1"]) == 0  # one tensor a shard
    shards = [f for f in hub_files(local_hub, "org/cli") if SHARD.fullmatch(f)]
    assert len(shards) == len(model.state_dict())
    capsys.readouterr()


def test_a_damaged_shard_in_a_directory_is_not_published(model, local_hub: LocalHub, tmp_path):
    zoo.save(model, tmp_path / "many", max_shard_size=SMALL_SHARDS)
    flip_a_weight_byte(real_file(tmp_path / "many" / shard_files(tmp_path / "many")[1]))
    with pytest.raises(ChecksumMismatchError, match="refusing to publish"):
        zoo.push(tmp_path / "many", "org/damaged")
    assert not [r for r in local_hub.requests if "commit" in r.path]


def test_a_transformers_sharded_repo_loads_from_the_hub(local_hub: LocalHub, tmp_path: Path):
    theirs = transformers_sharded_llama(tmp_path / "hf")
    local_hub.add_files("org/llama", {p.name: p for p in (tmp_path / "hf").iterdir()})
    ours = zoo.load("hf:org/llama", verify=True)  # each shard against the Hub's LFS sha256
    ids = torch.randint(0, 320, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (theirs(ids).logits - ours(ids)).abs().max().item() <= 1e-5
    from hub_fixtures import set_offline

    with pytest.MonkeyPatch.context() as offline:  # a warm cache works without the Hub
        set_offline(offline)
        assert torch.equal(logits(zoo.load("hf:org/llama")), logits(ours))


@pytest.mark.parametrize("name", ["../../../evil.safetensors", "ABSOLUTE", "a/b.safetensors"])
def test_a_hostile_shard_name_on_the_hub_is_refused(
    hf_sharded: Path, local_hub: LocalHub, tmp_path: Path, name: str
) -> None:
    index = index_of(hf_sharded)
    key = next(iter(index["weight_map"]))
    evil = tmp_path / "evil.safetensors"
    index["weight_map"][key] = str(evil) if name == "ABSOLUTE" else name
    files = {p.name: p for p in hf_sharded.iterdir() if p.name[0] != "."}
    files[INDEX_FILE] = json.dumps(index).encode()
    local_hub.add_files("org/hostile", files)
    with pytest.raises(UnsafeCheckpointError, match="plain"):
        zoo.load("hf:org/hostile")
    assert not shard_downloads(local_hub, "org/hostile")  # refused before any shard
    assert not evil.exists() and not list(tmp_path.rglob("evil.safetensors"))


def test_an_index_naming_a_shard_the_repo_lacks_is_refused(
    hf_sharded: Path, local_hub: LocalHub
) -> None:
    shards = shard_files(hf_sharded)
    files = {p.name: p for p in hf_sharded.iterdir() if p.name[0] != "." and p.name != shards[2]}
    local_hub.add_files("org/incomplete", files)
    with pytest.raises(HubNotFoundError, match=re.escape(shards[2])) as err:
        zoo.pull("org/incomplete")
    assert "nothing of the weights was downloaded" in str(err.value)
    assert not shard_downloads(local_hub, "org/incomplete")


def test_a_corrupted_shard_download_is_refused_and_not_kept(
    model, local_hub: LocalHub, tmp_path: Path
) -> None:
    zoo.push(model, "org/model", max_shard_size=SMALL_SHARDS)
    shard = [f for f in hub_files(local_hub, "org/model") if SHARD.fullmatch(f)][1]
    local_hub.corrupt_file("org/model", shard)
    with pytest.raises(ChecksumMismatchError, match=re.escape(shard)):
        zoo.load("hf:org/model")
    cache = tmp_path / "hf_home" / "hub" / "models--org--model"
    assert not list(cache.rglob(shard))
    local_hub.clear_faults()
    assert_same_model(zoo.load("hf:org/model"), model)


def test_config_json_and_the_hub_must_agree_on_each_shard(
    model, local_hub: LocalHub, tmp_path: Path
) -> None:
    """A repo whose config.json records another sha256 for a shard than the Hub holds is
    refused before that shard is downloaded; so is an index the pin does not match."""
    zoo.save(model, tmp_path / "ckpt", max_shard_size=SMALL_SHARDS)
    manifest = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    shard = shard_files(tmp_path / "ckpt")[0]
    manifest["weights"]["shards"][shard] = "ab" * 32
    files = {p.name: p for p in (tmp_path / "ckpt").iterdir() if p.name[0] != "."}
    files["config.json"] = json.dumps(manifest).encode()
    local_hub.add_files("org/disagree", files)
    with pytest.raises(ChecksumMismatchError, match=re.escape(shard)):
        zoo.pull("org/disagree")
    assert not shard_downloads(local_hub, "org/disagree")

    from zoo.hub import HubSource, fetch

    zoo.push(model, "org/pinned", max_shard_size=SMALL_SHARDS)
    with pytest.raises(ChecksumMismatchError, match="registry pin"):
        fetch(HubSource("org/pinned", sha256="cd" * 32))
    assert not shard_downloads(local_hub, "org/pinned")
