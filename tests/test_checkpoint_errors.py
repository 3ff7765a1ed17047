"""Checkpoint errors carry what they are about: ``path``, ``expected`` and
``actual`` as attributes, and ``mismatches`` for every file whose sha256 is wrong, so that a
caller (the Hub loader deleting a damaged download) reads them and never parses a message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import zoo
from zoo.checkpoint.files import read_safetensors, sha256_file
from zoo.checkpoint.shards import INDEX_FILE
from zoo.errors import CheckpointError, ChecksumMismatchError, CorruptCheckpointError
from zoo.hub import snapshot as hub_load
from zoo.hub.download import Snapshot
from zoo.hub.source import parse_hf_source


@pytest.fixture(autouse=True)
def _own_zoo_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "zoo-cache"))


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return zoo.save(zoo.build("llama-tiny"), tmp_path / "ckpt", max_shard_size=30_000)


def test_a_damaged_shard_s_error_names_it_in_its_fields(ckpt: Path) -> None:
    shard = max(json.loads((ckpt / INDEX_FILE).read_text())["weight_map"].values())
    real = (ckpt / shard).resolve()  # names are links into the current version
    recorded = json.loads((ckpt / "config.json").read_text())["weights"]["shards"][shard]
    data = bytearray(real.read_bytes())
    data[-1] ^= 0xFF  # the last byte of tensor data: the header stays valid
    real.write_bytes(data)
    with pytest.raises(ChecksumMismatchError) as err:
        zoo.load(ckpt, tokenizer=False)
    assert err.value.path is not None and err.value.path.resolve() == real
    assert (err.value.expected, err.value.actual) == (recorded, sha256_file(real))
    assert err.value.mismatches == {err.value.path: (recorded, sha256_file(real))}


def test_a_damaged_index_and_a_broken_file_are_named(ckpt: Path) -> None:
    index = (ckpt / INDEX_FILE).resolve()
    index.write_text(index.read_text().replace("{", "{ ", 1))  # valid JSON, other bytes
    with pytest.raises(ChecksumMismatchError, match="the index is damaged") as err:
        zoo.load(ckpt, tokenizer=False)
    assert err.value.path == ckpt / INDEX_FILE
    assert err.value.actual == sha256_file(index)

    broken = ckpt.parent / "broken.safetensors"
    broken.write_bytes(b"\x08" + b"\x00" * 7 + b"not json")
    with pytest.raises(CorruptCheckpointError) as corrupt:
        read_safetensors(broken)
    assert corrupt.value.path == broken


def test_reworded_keeps_the_fields() -> None:
    exc = ChecksumMismatchError.of_file(
        "w.safetensors", actual="b" * 64, expected="a" * 64, says="config.json", advice="redo"
    )
    assert str(exc) == f"w.safetensors has sha256 {'b' * 64}, but config.json says {'a' * 64}: redo"
    again = exc.reworded("something else")
    assert str(again) == "something else" and type(again) is ChecksumMismatchError
    assert (again.path, again.expected, again.actual) == (Path("w.safetensors"), "a" * 64, "b" * 64)
    assert again.mismatches == exc.mismatches
    assert CheckpointError("plain").path is None


# -- the Hub loader reads the fields, whatever the message says ------------------------------
def hub_snapshot(tmp_path: Path, shards: tuple[str, ...] = ()) -> Snapshot:
    folder = tmp_path / "hub" / "models--org--name" / "snapshots" / "c0ffee"
    folder.mkdir(parents=True)
    weights = folder / (INDEX_FILE if shards else "model.safetensors")
    for path in [weights, *(folder / name for name in shards)]:
        path.write_bytes(b"x")
    return Snapshot(
        source=parse_hf_source("hf:org/name"),
        commit="c0ffee",
        directory=folder,
        weights=weights,
        sha256="a" * 64,
        expected_from="the registry pin",
        verified=False,
        shards=dict.fromkeys(shards, "a" * 64),
    )


def test_the_hub_loader_reads_the_actual_hash_not_the_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = hub_snapshot(tmp_path)

    def load_local(*args: object, **kwargs: object) -> None:
        raise ChecksumMismatchError(
            "worded in some new way", path=snapshot.weights, expected="a" * 64, actual="b" * 64
        )

    monkeypatch.setattr(hub_load, "fetch", lambda *a, **k: snapshot)
    monkeypatch.setattr(hub_load, "load_local", load_local)
    with pytest.raises(ChecksumMismatchError) as err:
        hub_load.load_hf("hf:org/name")
    assert f"has sha256 {'b' * 64}, not {'a' * 64} as the registry pin says" in str(err.value)
    assert err.value.actual == "b" * 64
    assert not snapshot.weights.exists()  # deleted from the cache


def test_the_hub_loader_deletes_the_shards_the_error_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ("model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors")
    snapshot = hub_snapshot(tmp_path, (*names, "model-00003-of-00003.safetensors"))
    bad = {snapshot.directory / name: ("a" * 64, "b" * 64) for name in names}

    def load_local(*args: object, **kwargs: object) -> None:
        raise ChecksumMismatchError("two shards are wrong", mismatches=bad)

    monkeypatch.setattr(hub_load, "fetch", lambda *a, **k: snapshot)
    monkeypatch.setattr(hub_load, "load_local", load_local)
    with pytest.raises(ChecksumMismatchError, match=", ".join(names)) as err:
        hub_load.load_hf("hf:org/name")
    assert err.value.mismatches == bad
    left = sorted(p.name for p in snapshot.directory.iterdir())
    assert left == ["model-00003-of-00003.safetensors", INDEX_FILE]


def test_a_broken_config_json_and_missing_weights_are_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="is not valid JSON") as err:
        zoo.load(tmp_path)
    assert err.value.path == tmp_path / "config.json"

    torch.manual_seed(0)
    folder = zoo.save(zoo.build("llama-tiny"), tmp_path / "ckpt")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"has no model\.safetensors") as err:
        zoo.load(folder)
    assert err.value.path is not None and err.value.path.name == "model.safetensors"
