"""JSON that zoo reads is bounded in depth and size.

An adapter config, a ``zoo.base`` record or a token-cache ``.json`` nested 100,000 deep was a
``RecursionError`` traceback (in ``zoo generate`` and ``zoo serve --adapter``). Every
``json.loads`` of zoo now goes through :mod:`zoo.jsonfile`, which counts the nesting first.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from zoo import jsonfile

DEEP = "[" * 100_000 + "]" * 100_000
ROOT = Path(zoo.__file__).parent


def test_depth_is_counted_without_recursion():
    assert jsonfile.depth(json.loads('{"a": [1, {"b": []}], "c": "[[[[\\" {{"}')) == 4
    assert jsonfile.depth([[]] * 1000) == 2 and jsonfile.depth("no brackets") == 0
    deep: list = []
    for _ in range(50_000):
        deep = [deep]
    assert jsonfile.depth(deep) == 50_001
    assert jsonfile.depth(deep, stop_after=100) == 101


def test_loads_refuses_deep_nesting():
    with pytest.raises(jsonfile.JSONError, match=r"nested too deeply \(more than 100 levels"):
        jsonfile.loads(DEEP)
    with pytest.raises(jsonfile.JSONError, match="more than 100 levels"):  # parses, then refused
        jsonfile.loads("[" * 101 + "]" * 101)
    with pytest.raises(ValueError):  # a JSONError is a ValueError: callers' handlers hold
        jsonfile.loads(DEEP.encode())
    assert jsonfile.loads("[" * 100 + "]" * 100) == json.loads("[" * 100 + "]" * 100)
    assert jsonfile.loads('{"a": "[[[[[[[["}', max_depth=1) == {"a": "[[[[[[[["}


def test_read_refuses_a_file_over_its_size(tmp_path: Path):
    path = tmp_path / "big.json"
    path.write_text('{"a": "' + "x" * 2000 + '"}')
    with pytest.raises(jsonfile.JSONError, match=r"big\.json is over 1,000 bytes"):
        jsonfile.read(path, max_bytes=1000)
    assert jsonfile.read(path)["a"] == "x" * 2000


def test_every_json_parse_of_zoo_goes_through_jsonfile():
    """The cause: a json.loads anywhere reads hostile JSON unbounded. A module may parse with
    json itself only where it bounds the value by the same limit (``jsonfile.MAX_DEPTH``, e.g.
    zoo serve's request bodies, checked in steps the event loop can run between).
    zoo.localhub (a tool that imports nothing from zoo) parses only its clients' requests."""
    calls = re.compile(r"\bjson\.loads?\(")
    found = [
        f"{path.relative_to(ROOT.parent)}:{number}"
        for folder in (ROOT, ROOT.parent / "plugins")
        for path in folder.rglob("*.py")
        if path.name != "jsonfile.py" and "localhub" not in path.parts
        if "jsonfile.MAX_DEPTH" not in (text := path.read_text())
        for number, line in enumerate(text.splitlines(), 1)
        if calls.search(line)
    ]
    assert found == []


def test_a_deep_zoo_base_record_is_a_checkpoint_error():
    from zoo.checkpoint.adapter_record import METADATA_KEY, BaseRecord

    with pytest.raises(zoo.CheckpointError, match=r"adapter\.safetensors.*more than 100 levels"):
        BaseRecord.from_metadata({METADATA_KEY: DEEP}, where="adapter.safetensors")


def test_a_deep_zoo_metadata_in_weights_is_a_corrupt_checkpoint(tmp_path: Path):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1)}, str(tmp_path / "model.safetensors"), {"zoo": DEEP})
    with pytest.raises(zoo.CorruptCheckpointError, match="more than 100 levels"):
        zoo.load(tmp_path)


def test_a_deep_verification_cache_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """zoo's record of verified files (in its cache folder) nested deep made every load that
    consulted it a RecursionError."""
    from zoo.checkpoint import files

    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path))
    files._cache_file().parent.mkdir(parents=True, exist_ok=True)
    files._cache_file().write_text(DEEP)
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"x")
    assert files.was_verified(weights, "0" * 64) is False


def test_a_deep_token_cache_record_is_rebuilt(tmp_path: Path):
    """A token cache's .json record nested deep: the cache is not valid (it is rebuilt)."""
    import numpy as np

    from zoo.train import data

    tokens = tmp_path / "abc.bin"
    tokens.write_bytes(b"")
    (tmp_path / "abc.json").write_text(DEEP)
    assert data._valid(tokens, "abc", np.dtype(np.uint16), 256) is False


def test_a_deep_run_record_is_reported_unreadable(tmp_path: Path):
    from zoo.train import report

    (tmp_path / report.RUN_RECORD).write_text(DEEP)
    assert "more than 100 levels" in report.read_run_record(tmp_path)["unreadable"]


def test_a_deep_adapter_config_from_the_hub_is_a_checkpoint_error(tmp_path: Path):
    import torch
    from safetensors.torch import save_file

    from zoo.hub.adapter import describe_adapter

    save_file({"w": torch.zeros(1)}, str(tmp_path / "adapter_model.safetensors"))
    (tmp_path / "adapter_config.json").write_text(DEEP)
    with pytest.raises(zoo.CheckpointError, match=r"adapter_config\.json.*more than 100 levels"):
        describe_adapter(tmp_path)


@pytest.fixture(scope="module")
def deep_adapter(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A saved ``llama-tiny`` and an adapter folder whose adapter_config.json nests 100k deep."""
    import torch

    root = tmp_path_factory.mktemp("deep")
    torch.manual_seed(0)
    base = zoo.save(zoo.build("llama-tiny").eval(), root / "base")
    adapter = root / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(DEEP)
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    return Path(base), adapter


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_the_cli_names_a_deep_adapter_config(
    deep_adapter: tuple[Path, Path], tmp_path: Path, command: str
):
    """``zoo generate``/``zoo serve --adapter`` with it: exit 2 and the file named, no
    traceback (a child process, so that a crash is a failed test)."""
    base, adapter = deep_adapter
    args = {
        "generate": ["generate", str(base), "Once", "--max-new-tokens", "2"],
        "serve": ["serve", str(base), "--port", "0"],
    }[command]
    env = {**os.environ, "ZOO_CACHE_DIR": str(tmp_path / "zoo-cache")}
    run = subprocess.run(
        [sys.executable, "-m", "zoo.cli", *args, "--adapter", str(adapter)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "RecursionError" not in run.stderr
    assert "adapter_config.json" in run.stderr and "more than 100 levels" in run.stderr


def test_a_deep_tokenizer_json_is_a_vocabulary_error(tmp_path: Path):
    """tokenizer.json is parsed by the tokenizers library (Rust, serde's recursion limit of
    128): a clear error already, kept so (a guard, not a regression)."""
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": ' + DEEP + "}")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(zoo.ZooError, match=r"tokenizer\.json.*recursion limit"):
        zoo.tokenizer(tmp_path)
