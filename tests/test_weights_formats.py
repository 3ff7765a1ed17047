"""A weights file of another format says what it is.

``zoo.load("x.gguf")`` said "not a valid safetensors file: header too large": the first bytes
of a file name its format, so zoo says what the file is and what zoo reads instead.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zoo

GGUF = b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + bytes(64)

FILES = {
    "old.bin.ggml": (b"tjgg" + bytes(60), "GGML"),
    "weights.h5": (b"\x89HDF\r\n\x1a\n" + bytes(60), "HDF5"),
    "a.npy": (b"\x93NUMPY\x01\x00" + bytes(60), "NumPy"),
    "pointer.safetensors": (
        b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 9\n",
        r"Git LFS pointer.*git lfs pull",
    ),
    "page.safetensors": (b"<!DOCTYPE html><html><body>Not found</body></html>", "HTML"),
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_file_of_another_format_says_what_it_is(tmp_path: Path, name: str):
    data, what = FILES[name]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(zoo.CheckpointError, match=what) as caught:
        zoo.load(path)
    assert "header too large" not in str(caught.value) and "safetensors" in str(caught.value)


def test_a_gguf_file_under_the_weights_name_is_named(tmp_path: Path):
    """A folder whose model.safetensors is really a GGUF file (renamed, or a wrong download)."""
    zoo.save(zoo.build("llama-tiny"), tmp_path / "ckpt")
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(GGUF)
    with pytest.raises(zoo.CheckpointError, match=r"model\.safetensors is a GGUF file.*own path"):
        zoo.load(tmp_path / "ckpt")


def test_a_gguf_adapter_is_named(tmp_path: Path):
    from zoo.checkpoint.files import read_safetensors

    (tmp_path / "adapter_model.safetensors").write_bytes(GGUF)
    with pytest.raises(zoo.CheckpointError, match="GGUF"):
        read_safetensors(tmp_path / "adapter_model.safetensors")


def test_a_real_safetensors_file_is_not_mistaken(tmp_path: Path):
    """A safetensors header whose length bytes happen to spell a magic is still read."""
    from safetensors.torch import save_file

    from zoo.checkpoint.formats import identify

    path = tmp_path / "w.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    assert identify(path) is None
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 64)
    with pytest.raises(zoo.CorruptCheckpointError, match="not a valid safetensors file"):
        zoo.load(garbage)


def test_the_cli_says_what_an_empty_gguf_file_lacks(tmp_path: Path):
    """A GGUF file is read by its path; one with no architecture says so, in one line."""
    path = tmp_path / "x.gguf"
    path.write_bytes(GGUF)
    run = subprocess.run(
        [sys.executable, "-m", "zoo.cli", "generate", str(path), "hi"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ZOO_CACHE_DIR": str(tmp_path / "zoo-cache")},
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "has no general.architecture" in run.stderr and "header too large" not in run.stderr
