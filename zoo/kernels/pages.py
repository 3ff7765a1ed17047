"""Where a CPU weight's bytes live, for the kernels that stream them every decoding step.

``zoo.load`` assigns weights memory-mapped from their file (copy-on-write: nothing is read
until it is used, no second copy is made); ``zoo.build``, a layout's conversions and
quantization leave them on the heap, each where the allocator put it. The kernels stream
weights on 2 MiB huge pages much faster than on 4 KiB ones (each 4 KiB page costs the
processor an address translation, dearer still in a virtual machine; docs/benchmarks.md has
the figures), and a tensor allocated on its own gets huge pages only for the whole aligned
2 MiB blocks inside it: none for most of a small model's weights. So a decoding session
(:func:`zoo.runtime.start_decoding`, the slot batches of ``zoo serve``) first moves the
weights into one arena of the process's own memory advised for huge pages
(:func:`make_resident`), one weight at a time, giving each weight's file pages (or heap
memory) back as it goes: resident memory holds the weights about once throughout.
:func:`release_pages` is the page-giving half, which quantization uses on its own (the float
weights are never copied there).

Everything here is Linux's (``/proc/self/maps``, ``madvise``, ``malloc_trim``); elsewhere
nothing is found mapped and nothing moves. Weights larger than the memory available stay
where they are.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
import weakref

import torch
from torch import Tensor, nn

__all__ = ["in_file_mapping", "make_resident", "release_pages", "resident"]

_MADV_DONTNEED = 4
_MADV_HUGEPAGE = 14
_HUGE_PAGE = 2 * 1024 * 1024  # x86-64's and arm64's transparent huge page
_CHUNK = 4 * 1024 * 1024  # bytes of a mapped weight copied before its pages are given back
_ALIGN = 64  # each tensor in an arena starts on a cache line


@functools.cache
def _libc() -> ctypes.CDLL | None:
    return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _advise(first: int, last: int, advice: int, unit: int) -> None:
    """``madvise(advice)`` over the whole ``unit``-aligned blocks inside ``[first, last)``."""
    libc = _libc()
    start, end = -(-first // unit) * unit, last // unit * unit
    if libc is not None and start < end:
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), advice)


def _give_back(first: int, last: int) -> None:
    """``MADV_DONTNEED`` over the whole pages in ``[first, last)`` (of a file mapping only)."""
    _advise(first, last, _MADV_DONTNEED, mmap.PAGESIZE)


def _extent(tensor: Tensor) -> tuple[int, int]:
    """The addresses from ``tensor``'s first byte to past its last (a strided view's range
    holds the bytes between its elements too)."""
    first = tensor.data_ptr()
    shape, strides = tensor.shape, tensor.stride()
    last = sum((size - 1) * stride for size, stride in zip(shape, strides, strict=True))
    return first, first + (last + 1) * tensor.element_size()


def _fills(tensor: Tensor) -> bool:
    """Whether ``tensor``'s elements are every byte of its range (contiguous, or a transpose
    of a contiguous tensor): its pages hold no other tensor's bytes."""
    first, last = _extent(tensor)
    return last - first == tensor.numel() * tensor.element_size()


def _file_mappings() -> list[tuple[int, int]]:
    """The address ranges of this process's private mappings of files, per
    ``/proc/self/maps`` (memory-mapped safetensors files among them; not the heap, not
    anonymous memory); none where it cannot be read."""
    ranges = []
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)  # range perms offset dev inode [path]
                path = fields[5].strip() if len(fields) > 5 else ""
                if fields[1].endswith("p") and fields[4] != "0" and path.startswith("/"):
                    low, high = (int(x, 16) for x in fields[0].split("-"))
                    ranges.append((low, high))
    except (OSError, ValueError, IndexError):
        return []
    return ranges


def in_file_mapping(start: int, end: int, mappings: list[tuple[int, int]] | None = None) -> bool:
    """Whether the bytes ``[start, end)`` lie inside one private mapping of a file
    (``mappings``: :func:`_file_mappings`, read now where not given)."""
    found = _file_mappings() if mappings is None else mappings
    return any(low <= start and end <= high for low, high in found)


def release_pages(tensor: Tensor) -> None:
    """Give the pages under ``tensor`` back to the OS (``madvise(MADV_DONTNEED)``), for a
    tensor memory-mapped copy-on-write from a weights file that nothing will read again: on
    Linux the process's resident memory then does not keep them. Only whole pages inside the
    tensor, only where its elements fill its range (contiguous, or a transpose: a strided
    view's range holds other tensors' bytes), and only when they belong to a file mapping:
    on the heap (a tensor a layout concatenated, a converted copy) ``MADV_DONTNEED`` would
    zero memory the allocator still uses. A no-op elsewhere."""
    if _libc() is None or not tensor.is_cpu or tensor.numel() == 0 or not _fills(tensor):
        return
    first, last = _extent(tensor)
    if in_file_mapping(first, last):
        _give_back(first, last)


def resident(
    tensor: Tensor, mappings: list[tuple[int, int]] | None = None, into: Tensor | None = None
) -> Tensor:
    """A contiguous copy of CPU ``tensor`` in the process's own memory: ``into`` (a
    contiguous tensor of its dtype and shape, :meth:`_Arena.take`'s), else a tensor of its
    own advised for huge pages (where Linux offers them, for the whole 2 MiB blocks inside
    it). Where ``tensor`` is memory-mapped from a file (``mappings``: :func:`_file_mappings`,
    read now where not given) its pages are given back as they are copied, :data:`_CHUNK`
    bytes at a time, so the two are never both resident whole."""
    copy = torch.empty(tensor.shape, dtype=tensor.dtype) if into is None else into
    if copy.numel() == 0:
        return copy
    if into is None:
        _advise(*_extent(copy), _MADV_HUGEPAGE, _HUGE_PAGE)
    mapped = in_file_mapping(*_extent(tensor), mappings)
    if not tensor.is_contiguous():  # (a transposed view: one weight, copied whole)
        copy.copy_(tensor)
        if mapped and _fills(tensor):  # its pages are its own (a transpose)
            _give_back(*_extent(tensor))
        return copy
    source, target = tensor.reshape(-1), copy.view(-1)
    step = max(1, _CHUNK // tensor.element_size())
    for start in range(0, source.numel(), step):
        target[start : start + step].copy_(source[start : start + step])
        if mapped:
            _give_back(*_extent(source[start : start + step]))
    return copy


def _size(tensor: Tensor) -> int:
    """The bytes ``tensor`` takes in an arena: its elements', up to the next cache line."""
    return -(-tensor.numel() * tensor.element_size() // _ALIGN) * _ALIGN


class _Arena:
    """Anonymous private memory that contiguous tensors are carved from, advised
    ``MADV_HUGEPAGE``: tensors side by side share huge pages, which tensors allocated one
    by one (each starting anywhere, its first and last 2 MiB never whole) cannot. Each
    tensor taken has a storage of its own over its bytes (as if allocated alone: saving one
    saves only it; safetensors sees no shared memory); the mapping lives while any of them
    does. (Its first and last partial 2 MiB stay on small pages: nothing is mapped beyond
    what is asked.)"""

    def __init__(self, nbytes: int) -> None:
        pages = -(-max(nbytes, 1) // mmap.PAGESIZE)  # (whole pages: one VMA, advised whole)
        self._map = mmap.mmap(-1, pages * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)
        start = torch.frombuffer(self._map, dtype=torch.uint8, count=1).data_ptr()
        self._next = 0
        _advise(start, start + len(self._map), _MADV_HUGEPAGE, mmap.PAGESIZE)
        _arenas[start] = start + len(self._map)
        weakref.finalize(self._map, _arenas.pop, start, None)

    def take(self, like: Tensor) -> Tensor:
        """An uninitialised contiguous tensor of ``like``'s dtype and shape, next in line."""
        taken = torch.frombuffer(
            self._map, dtype=like.dtype, count=like.numel(), offset=self._next
        ).view(like.shape)
        self._next += _size(like)
        return taken


def _in_arena(first: int, last: int) -> bool:
    """Whether the bytes ``[first, last)`` lie inside an arena that is still mapped."""
    return any(low <= first and last <= high for low, high in list(_arenas.items()))


def _trim_heap() -> None:
    """Give the heap's free memory back to the OS (glibc's ``malloc_trim``): a weight moved
    off the heap leaves its bytes free there, which the process would otherwise keep."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)


def make_resident(model: nn.Module) -> int:
    """Move every CPU parameter and buffer of ``model`` not yet in an arena (memory-mapped
    from a weights file, on the heap) into one arena on huge pages (:func:`resident`), in
    place (``.data``: the same parameters, so tied ones stay one and hooks stay); returns how
    many bytes moved. Views of a moved tensor taken before (``weight.data``,
    ``weight.view(...)``) keep the old bytes. Nothing moves where the weights would not fit
    in the memory available (the mapping can be paged from the file; the process's own
    memory cannot), nor off Linux. A model whose CPU tensors are where the last call left
    them is not looked at again (each decoding session calls this)."""
    tensors = {
        id(t): t
        for t in (*model.parameters(), *model.buffers())
        if type(t) in (Tensor, nn.Parameter) and t.is_cpu and t.numel()
    }
    where = frozenset(t.data_ptr() for t in tensors.values())
    if not tensors or _settled.get(model) == where:
        return 0
    found = [] if _libc() is None else [t for t in tensors.values() if not _in_arena(*_extent(t))]
    moved = _into_arena(found)
    if moved is None:
        return 0
    _settled[model] = frozenset(t.data_ptr() for t in tensors.values())
    return moved


def _into_arena(tensors: list[Tensor]) -> int | None:
    """Move ``tensors`` (CPU, distinct) into one new arena, each in place and of its kind
    (an inference tensor or not, as it was), the heap trimmed after each; the bytes moved,
    or ``None`` (none moved) where they would not fit in the memory available or no address
    space is left for the arena."""
    from ..memory import available_memory

    moved = sum(t.numel() * t.element_size() for t in tensors)
    free = available_memory("cpu")
    if free is not None and moved > free:
        return None
    if not tensors:
        return 0
    mappings = _file_mappings()  # (the arena is anonymous: the file mappings stay these)
    try:
        arena = _Arena(sum(map(_size, tensors)))
    except OSError:
        return None
    for tensor in tensors:
        # each copy of the kind it replaces, whatever mode the caller decodes in: a weight
        # made an inference tensor by a session's inference_mode could not be trained after
        with torch.no_grad(), torch.inference_mode(tensor.is_inference()):
            tensor.data = resident(tensor.data, mappings, into=arena.take(tensor))
        _trim_heap()  # (microseconds: the heap's bytes go back as the arena's come)
    return moved


#: Each arena's first byte and the byte past its last, while it is mapped.
_arenas: dict[int, int] = {}

#: Each model :func:`make_resident` left with every tensor in an arena: where they were.
_settled: weakref.WeakKeyDictionary[nn.Module, frozenset[int]] = weakref.WeakKeyDictionary()
