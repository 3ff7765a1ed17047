"""Where a CPU weight's bytes live, for the kernels that stream them every decoding step.

``zoo.load`` assigns weights memory-mapped from their file (copy-on-write: nothing is read
until it is used, no second copy is made). The kernels stream such pages more slowly than
the process's own memory on huge pages (the file's 4 KiB pages cost the processor more
address translations per byte; docs/benchmarks.md has the figures), so a decoding session
(:func:`zoo.runtime.start_decoding`, the slot batches of ``zoo serve``) first moves the
weights into the process's own memory (:func:`make_resident`), one weight at a time, giving
each weight's file pages back as it goes: resident memory holds the weights about once
throughout. :func:`release_pages` is the page-giving half, which
quantization uses on its own (the float weights are never copied there).

Everything here is Linux's (``/proc/self/maps``, ``madvise``); elsewhere nothing is found
mapped and nothing moves. Weights larger than the memory available stay mapped.
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


def resident(tensor: Tensor, mappings: list[tuple[int, int]] | None = None) -> Tensor:
    """A contiguous copy of CPU ``tensor`` in the process's own memory, on huge pages where
    Linux offers them (advised before the copy first touches the pages); where ``tensor`` is
    memory-mapped from a file (``mappings``: :func:`_file_mappings`, read now where not
    given) its pages are given back as they are copied, :data:`_CHUNK` bytes at a time, so
    the two are never both resident whole."""
    copy = torch.empty(tensor.shape, dtype=tensor.dtype)
    if copy.numel() == 0:
        return copy
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


def make_resident(model: nn.Module) -> int:
    """Move every CPU parameter and buffer of ``model`` that is still memory-mapped from a
    weights file into the process's own memory (:func:`resident`), in place (``.data``: the
    same parameters, so tied ones stay one and hooks stay); returns how many bytes moved.
    Nothing moves where they would not fit in the memory available (the mapping can be paged
    from the file; the process's own memory cannot). A model whose CPU tensors are where the
    last call left them is not looked at again (each decoding session calls this)."""
    from ..memory import available_memory

    tensors = {
        id(t): t
        for t in (*model.parameters(), *model.buffers())
        if type(t) in (Tensor, nn.Parameter) and t.is_cpu and t.numel()
    }
    where = frozenset(t.data_ptr() for t in tensors.values())
    if not tensors or _settled.get(model) == where:
        return 0
    mappings = _file_mappings()  # (copies are anonymous memory: the file mappings stay these)
    found = [t for t in tensors.values() if in_file_mapping(*_extent(t), mappings)]
    moved = sum(t.numel() * t.element_size() for t in found)
    free = available_memory("cpu")
    if free is not None and moved > free:
        return 0
    with torch.no_grad():
        for tensor in found:
            tensor.data = resident(tensor.data, mappings)
    _settled[model] = frozenset(t.data_ptr() for t in tensors.values())
    return moved


#: Each model :func:`make_resident` left with no tensor mapped: where its CPU tensors were.
_settled: weakref.WeakKeyDictionary[nn.Module, frozenset[int]] = weakref.WeakKeyDictionary()
