"""Files on disk: reading safetensors safely, hashing, refusing pickles, atomic writes.

Nothing here knows about models; :mod:`zoo.checkpoint.state` turns tensors into a model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .. import jsonfile
from ..errors import (
    CheckpointError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
)

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "PICKLE_SUFFIXES",
    "WEIGHTS_FILE",
    "BackgroundHash",
    "check_not_pickle",
    "check_weights_file",
    "forget_verified",
    "read_safetensors",
    "remember_verified",
    "sha256_file",
    "was_verified",
    "write_safetensors",
]

#: The weights file name zoo writes (and the one Hugging Face uses).
WEIGHTS_FILE = "model.safetensors"

#: Suffixes of pickle-based weights files, refused by every zoo loader.
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"})

_CHUNK = 1 << 20  # 1 MiB reads: hashlib releases the GIL on buffers this large


def _looks_pickled(path: Path) -> bool:
    """A ``torch.save`` zip archive or a raw pickle, told apart from a safetensors file
    (whose first 8 bytes are a header length smaller than the file)."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8:
        return False
    magic = head[:4] == b"PK\x03\x04" or (head[0] == 0x80 and 2 <= head[1] <= 5)
    return magic and int.from_bytes(head, "little") + 8 > path.stat().st_size


def check_not_pickle(path: Path) -> None:
    """Raise :class:`UnsafeCheckpointError` when ``path`` is a pickle-based weights file
    (by suffix, or by content: a pickle or a ``torch.save`` zip archive)."""
    if path.suffix.lower() in PICKLE_SUFFIXES or _looks_pickled(path):
        raise UnsafeCheckpointError(
            f"{path} is a pickle-based checkpoint; zoo only reads safetensors because unpickling "
            "can run arbitrary code. Convert it once, from a source you trust, with "
            "zoo.checkpoint.convert_pickle_checkpoint(path, output_dir, allow_pickle=True) "
            "(it uses torch.load(weights_only=True)), or with transformers: "
            "Model.from_pretrained(dir).save_pretrained(out_dir, safe_serialization=True)."
        )


def check_weights_file(path: Path) -> None:
    """Refuse ``path`` as weights when it is a pickle (:func:`check_not_pickle`) or a file of
    another format than safetensors that its first bytes name (GGUF, HDF5, a Git LFS
    pointer...: :func:`zoo.checkpoint.formats.check_format`)."""
    from .formats import check_format

    check_not_pickle(path)
    check_format(path)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks into one reused buffer (no memory growth)."""
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


class BackgroundHash:
    """Hash weights files on a background thread while the caller builds the model: one
    file, or the shards of a sharded checkpoint one after another (one thread: several large
    files read at once would compete for the disk).

    ``hashlib`` and file reads release the GIL, so on a warm page cache verification costs
    little more than the slower of the two jobs instead of their sum.

    Args:
        expected: file -> the sha256 it must have.
        what: where the expected values come from, for messages.
    """

    def __init__(self, expected: Mapping[Path, str], *, what: str) -> None:
        self.expected = {path: sha.lower() for path, sha in expected.items()}
        self.what = what
        self._digests: dict[Path, str] = {}
        self._error: tuple[Path, BaseException] | None = None
        self._thread = threading.Thread(target=self._run, name="zoo-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for path in self.expected:
            try:
                self._digests[path] = sha256_file(path)
            except BaseException as exc:  # reported to the caller by verify()
                self._error = (path, exc)
                return

    def verify(self) -> None:
        """Wait for the hashes and raise :class:`ChecksumMismatchError` naming every file
        that does not have its expected sha256."""
        self._thread.join()
        if self._error is not None:
            path, exc = self._error
            raise CheckpointError(f"cannot read {path}: {exc}", path=path) from exc
        wrong = [path for path, sha in self.expected.items() if self._digests.get(path) != sha]
        if not wrong:
            return
        if len(self.expected) == 1:
            (path,) = wrong
            raise ChecksumMismatchError.of_file(
                path,
                actual=self._digests[path],
                expected=self.expected[path],
                says=self.what,
                advice="the file is corrupted, truncated or not the one expected. Download or "
                "save it again (or pass verify=False to load it anyway, at your own risk).",
            )
        detail = "; ".join(
            f"{p} has sha256 {self._digests[p]}, not {self.expected[p]}" for p in wrong
        )
        raise ChecksumMismatchError(
            f"{len(wrong)} shard(s) do not have the sha256 expected by {self.what}: "
            f"{detail}. They are corrupted, truncated or not the files expected. Download "
            "or save them again (or pass verify=False to load them anyway, at your own risk).",
            mismatches={p: (self.expected[p], self._digests[p]) for p in wrong},
        )

    def remember(self) -> None:
        """Record the files as verified (see :func:`was_verified`); after :meth:`verify`."""
        for path, sha in self.expected.items():
            remember_verified(path, sha)


# -- the verification cache ----------------------------------------------------------------
_VERIFIED = "verified-sha256.json"
_SETTLED_S = 2.0  # only files unmodified for this long are remembered (mtime granularity)
_MAX_ENTRIES = 512


def _cache_file() -> Path:
    from ..settings import Settings

    return Path(Settings.from_env().cache_root) / _VERIFIED


def _identity(path: Path) -> tuple[str, dict[str, int]]:
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}", {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _read_cache() -> dict[str, dict[str, object]]:
    try:
        data = jsonfile.loads(_cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def was_verified(path: Path, sha256: str) -> bool:
    """Whether this very file (same device, inode, size and modification time) was hashed
    to ``sha256`` before. Any write to the file changes its mtime, so a modified file is
    hashed again; files are only remembered once their mtime is a few seconds old, so
    timestamp granularity cannot hide a write either."""
    key, stat = _identity(path)
    entry = _read_cache().get(key)
    return isinstance(entry, dict) and entry == {**stat, "sha256": sha256.lower()}


def remember_verified(path: Path, sha256: str) -> None:
    """Record that ``path`` hashed to ``sha256`` (best effort: never raises)."""
    with contextlib.suppress(OSError):
        key, stat = _identity(path)
        if time.time() - stat["mtime_ns"] / 1e9 < _SETTLED_S:
            return
        cache = _read_cache()
        cache.pop(key, None)
        cache[key] = {**stat, "sha256": sha256.lower()}
        while len(cache) > _MAX_ENTRIES:
            cache.pop(next(iter(cache)))
        target = _cache_file()
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".verified-", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(cache, f)
        os.replace(tmp, target)


def forget_verified() -> None:
    """Empty the verification cache (the next load of every file hashes it again)."""
    with contextlib.suppress(FileNotFoundError):
        _cache_file().unlink()


def read_safetensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Memory-map a safetensors file: ``(tensors, metadata)``.

    The tensors share the file's pages (copy-on-write, so writing to one never changes the
    file): nothing is read until it is used, and no second copy is made. The header is
    validated by ``safetensors`` (offsets, sizes, dtypes); a damaged file raises
    :class:`CorruptCheckpointError` naming the file.
    """
    from safetensors import SafetensorError, safe_open

    check_weights_file(path)
    if not path.is_file():
        raise CheckpointError(f"weights file {path} does not exist", path=path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = dict(f.metadata() or {})
            tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
    except SafetensorError as exc:
        size = path.stat().st_size
        raise CorruptCheckpointError(
            f"{path} is not a valid safetensors file ({size} bytes): {exc}. The file is "
            "truncated or damaged; save or download it again.",
            path=path,
        ) from None
    return tensors, metadata


def write_safetensors(
    tensors: Mapping[str, Tensor], path: Path, metadata: Mapping[str, str]
) -> None:
    """Write ``tensors`` (contiguous, on the CPU) to ``path`` with ``safetensors``."""
    import safetensors.torch

    safetensors.torch.save_file(dict(tensors), str(path), metadata=dict(metadata))
