"""A GGUF file's header, read with every count, length, shape and offset bounded.

A GGUF file (llama.cpp's format, version 2 or 3) is a little-endian header (``GGUF``, the
version, the number of tensors and of metadata pairs), the metadata (typed key/value pairs:
numbers, strings, arrays), one record per tensor (name, shape in ggml's order, innermost
first, its ggml type and its offset in the data section), then the data, aligned to
``general.alignment`` (32 by default).

The file is as untrusted as any download: :func:`read_header` checks each count against the
bytes left before it builds anything of that size, each string and array length likewise,
each tensor's shape, type and extent against the file's size, and names what is wrong in a
:class:`~zoo.errors.CorruptCheckpointError` (``gguf``'s own ``GGUFReader`` takes a count as a
loop bound as it stands). Reading the data is :mod:`zoo.checkpoint.gguf.tensors`'s.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import CorruptCheckpointError

__all__ = ["MAGIC", "GGUFHeader", "TensorInfo", "is_gguf", "read_header"]

MAGIC = b"GGUF"
#: The versions read: 2 and 3 differ only in byte order (3 may be big-endian; zoo reads
#: little-endian files, what llama.cpp writes on every common machine).
_VERSIONS = (2, 3)
#: Bounds beyond the file's size: a tensor's dimensions (ggml has 4), an array's length, a
#: string's (a chat template or a merges entry is far shorter), the whole metadata's elements.
MAX_DIMS = 4
MAX_ARRAY = 1 << 24
MAX_STRING = 1 << 24
MAX_ELEMENTS = 1 << 26
MAX_NAME = 256

#: GGUF value types -> (struct format, size) for the fixed-size ones.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}  # fmt: skip
_STRING, _ARRAY = 8, 9


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor's record: its name, shape (PyTorch's order, outermost first), ggml type
    (a ``gguf.GGMLQuantizationType`` value), and where its bytes are in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    start: int  # absolute file offset
    nbytes: int


@dataclasses.dataclass(frozen=True)
class GGUFHeader:
    """What :func:`read_header` found: the version, the metadata (key -> Python value: int,
    float, bool, str or a list of them) and the tensors in file order."""

    path: Path
    version: int
    metadata: Mapping[str, Any]
    tensors: tuple[TensorInfo, ...]

    @property
    def architecture(self) -> str:
        value = self.metadata.get("general.architecture")
        if not isinstance(value, str):
            raise CorruptCheckpointError(
                f"{self.path}: the GGUF metadata has no general.architecture string", path=self.path
            )
        return value


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts as a GGUF file does."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


class _Cursor:
    """Reads values from the mapped file, refusing any read past its end."""

    def __init__(self, data: mmap.mmap | bytes, path: Path) -> None:
        self.data, self.path, self.pos, self.elements = data, path, 0, 0

    def fail(self, what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"{self.path} is not a valid GGUF file: {what} (at byte {self.pos}); the file is "
            "damaged, truncated or not what it says. Download or convert it again.",
            path=self.path,
        )

    def take(self, size: int, what: str) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise self.fail(f"{what} needs {size} bytes, {len(self.data) - self.pos} are left")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def scalar(self, kind: int, what: str) -> Any:
        fmt, size = _SCALARS[kind]
        return struct.unpack(fmt, self.take(size, what))[0]

    def count(self, what: str, *, least: int, bound: int) -> int:
        """A u64 count of things each at least ``least`` bytes long: no more than ``bound``
        and than the bytes left can hold."""
        n = self.scalar(10, what)
        left = len(self.data) - self.pos
        if n > bound or n * least > left:
            raise self.fail(f"{what} is {n}: more than {bound} or than {left} bytes can hold")
        return int(n)

    def string(self, what: str, bound: int = MAX_STRING) -> str:
        n = self.count(f"the length of {what}", least=1, bound=bound)
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def value(self, kind: int, what: str, *, nested: bool = False) -> Any:
        if kind in _SCALARS:
            return self.scalar(kind, what)
        if kind == _STRING:
            return self.string(what)
        if kind == _ARRAY and not nested:
            return self.array(what)
        if kind == _ARRAY:
            raise self.fail(f"{what} is an array of arrays, which no GGUF writer zoo knows uses")
        raise self.fail(f"{what} has the unknown value type {kind}")

    def array(self, what: str) -> list[Any]:
        kind = self.scalar(4, f"the element type of {what}")
        least = _SCALARS[kind][1] if kind in _SCALARS else 8
        n = self.count(f"the length of {what}", least=least, bound=MAX_ARRAY)
        self.elements += n
        if self.elements > MAX_ELEMENTS:
            raise self.fail(f"the metadata holds more than {MAX_ELEMENTS} array elements")
        if kind in _SCALARS:  # one unpack for the whole array
            fmt, size = _SCALARS[kind]
            return list(struct.unpack(f"<{n}{fmt[1]}", self.take(n * size, what)))
        return [self.value(kind, f"{what}[{i}]", nested=True) for i in range(n)]


def read_header(path: Path) -> GGUFHeader:
    """The checked header of the GGUF file ``path`` (see the module's docstring)."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise CorruptCheckpointError(f"{path} is not a GGUF file (no GGUF magic)", path=path)
        f.seek(0)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(_Cursor(data, path), path)


def _parse(cur: _Cursor, path: Path) -> GGUFHeader:
    cur.take(4, "the magic")
    version = cur.scalar(4, "the version")
    if version not in _VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        hint = " (a big-endian file: zoo reads little-endian GGUF)" if swapped in _VERSIONS else ""
        raise cur.fail(f"GGUF version {version} is not one zoo reads (2 or 3){hint}")
    n_tensors = cur.count("the tensor count", least=24, bound=MAX_ARRAY)
    n_pairs = cur.count("the metadata count", least=13, bound=MAX_ARRAY)
    metadata: dict[str, Any] = {}
    for i in range(n_pairs):
        key = cur.string(f"metadata key {i}", bound=65535)
        if key in metadata:
            raise cur.fail(f"the metadata key {key!r} appears twice")
        metadata[key] = cur.value(cur.scalar(4, f"the type of {key!r}"), repr(key))
    records = [_tensor_record(cur, i) for i in range(n_tensors)]
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment is {alignment!r}, not a power of two")
    start = -(-cur.pos // alignment) * alignment
    return GGUFHeader(path, version, metadata, _placed(cur, records, start, alignment))


def _tensor_record(cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], int, int]:
    """One tensor record: name, shape (outermost first), ggml type, offset in the data."""
    name = cur.string(f"the name of tensor {i}", bound=MAX_NAME)
    n_dims = cur.scalar(4, f"the dimension count of {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
    dims = [cur.scalar(10, f"a dimension of {name!r}") for _ in range(n_dims)]
    kind = cur.scalar(4, f"the type of {name!r}")
    offset = cur.scalar(10, f"the offset of {name!r}")
    return name, tuple(reversed(dims)), kind, offset


def _placed(
    cur: _Cursor, records: list[tuple[str, tuple[int, ...], int, int]], start: int, alignment: int
) -> tuple[TensorInfo, ...]:
    """The records with their byte extents, each checked: a known type, a shape that type's
    blocks divide, an aligned offset, and bytes that lie inside the file."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    size, seen, out = len(cur.data), set(), []
    for name, shape, kind, offset in records:
        if name in seen:
            raise cur.fail(f"the tensor {name!r} appears twice")
        seen.add(name)
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise cur.fail(f"tensor {name!r} has the unknown ggml type {kind}") from None
        if min(shape) < 1 or shape[-1] % block:
            raise cur.fail(
                f"tensor {name!r} has the shape {list(shape)}: every dimension must be at "
                f"least 1 and the innermost a multiple of {block} for its type"
            )
        nbytes = math.prod(shape) // block * block_bytes
        if offset % alignment or start + offset + nbytes > size:
            raise cur.fail(
                f"tensor {name!r} ({nbytes} bytes at data offset {offset}) is misaligned or "
                f"runs past the end of the file ({size} bytes)"
            )
        out.append(TensorInfo(name, shape, kind, start + offset, nbytes))
    return tuple(out)
