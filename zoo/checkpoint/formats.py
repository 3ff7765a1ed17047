"""What a weights file is when it is not safetensors, from its first bytes.

Weights files are safetensors (a GGUF file is read by its own path: :mod:`.gguf`). A file of
another format given as weights (a GGUF file under a safetensors name, a Keras
HDF5 file, a Git LFS pointer left by a clone without ``git lfs``, an HTML error page saved by a
download) is named for what it is, with what zoo reads instead, rather than reported as a
safetensors file whose "header is too large". Pickles (``torch.save``'s zip archives and raw
pickles) are refused by :func:`zoo.checkpoint.files.check_not_pickle`, before this.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError

__all__ = ["check_format", "identify"]

#: The largest safetensors header safetensors itself reads (100 MB).
_MAX_HEADER = 100_000_000

_WHAT_ZOO_READS = (
    "zoo reads safetensors checkpoints: a folder with config.json and model.safetensors (or "
    "its sharded index), or the .safetensors file itself"
)

#: First bytes -> (what the file is, how to get what zoo reads).
_MAGIC: tuple[tuple[bytes, str, str], ...] = (
    (
        b"GGUF",
        "a GGUF file (llama.cpp's format)",
        "load the GGUF file by its own path (zoo.load('model.gguf'), zoo generate model.gguf), "
        "which reads it as llama.cpp's format",
    ),
    *(
        (magic, "a GGML file (llama.cpp's format before GGUF)", "load the original repo instead")
        for magic in (b"lmgg", b"fmgg", b"tjgg", b"algg")  # ggml, ggmf, ggjt, ggla (LE)
    ),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras .h5 weights)", "export safetensors from it"),
    (b"\x93NUMPY", "a NumPy .npy array", "save the tensors with safetensors instead"),
    (
        b"version https://git-lfs",
        "a Git LFS pointer, not the file it points to",
        "fetch the real file: `git lfs pull` in the clone, or zoo.load('hf:org/name')",
    ),
    (b"\x1f\x8b", "a gzip-compressed file", "decompress it first"),
    (b"\x28\xb5\x2f\xfd", "a zstd-compressed file", "decompress it first"),
)
_HTML = (b"<!doctype html", b"<html", b"<?xml", b"<head", b"<body")


def _plausible_safetensors(head: bytes, size: int) -> bool:
    """Whether ``head`` starts as a safetensors file of ``size`` bytes: a little-endian
    header length that fits, then a JSON object."""
    length = int.from_bytes(head[:8], "little")
    return 0 < length <= min(_MAX_HEADER, size - 8) and head[8:9] == b"{"


def identify(path: Path) -> tuple[str, str] | None:
    """``(what the file is, what to do)`` when ``path``'s first bytes are those of a format
    other than safetensors that zoo knows; ``None`` otherwise (safetensors, damaged or
    unknown)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
        size = path.stat().st_size
    except OSError:
        return None
    if len(head) >= 9 and _plausible_safetensors(head, size):
        return None
    for magic, what, fix in _MAGIC:
        if head.startswith(magic):
            return what, fix
    if head.lstrip().lower().startswith(_HTML):
        return (
            "an HTML or XML page (a download that saved an error page?)",
            "download the weights again",
        )
    return None


def check_format(path: Path) -> None:
    """Raise a :class:`~zoo.errors.CheckpointError` naming the format when ``path`` is a
    file of another format than safetensors (:func:`identify`)."""
    found = identify(path)
    if found is not None:
        what, fix = found
        raise CheckpointError(
            f"{path} is {what}, not a safetensors file. {_WHAT_ZOO_READS}. To fix: {fix}.",
            path=path,
        )
