"""The C structures of zoo's one-call decoding step (``zoo/kernels/_native_block.c``) as ctypes
mirrors, and the check that a built library lays them out as the mirrors do.

Why: ctypes cannot read a C header, so each structure is written twice, once in C and once
here. A library built from other sources (an older checkout whose ``.so`` was not rebuilt
after ``git pull``, a wheel of another version) would be handed structures of the wrong size
or field offsets and read them silently wrong. The library therefore describes its own
layout (``zoo_abi``: :data:`VERSION`, then for each structure its ``sizeof`` and each
field's ``offsetof``), and :mod:`zoo.kernels.native` refuses a library whose description is not
:func:`layout`, with a warning that says to rebuild.

:data:`VERSION` is raised, here and as the version macro in ``_native_block.c``, whenever
a structure or a kernel's arguments change.
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["VERSION", "Block", "Decoder", "Embedding", "Linear", "Norm", "built_layout", "layout"]

#: The version macro of ``_native_block.c``: the structures and the kernels' arguments.
VERSION = 2

_I, _P, _F = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


class Linear(ctypes.Structure):
    """``zoo_linear``: float32 rows (kind 0) or int8 rows with scales and sums (kind 1)."""

    _fields_ = [("kind", _I), ("n", _I), ("k", _I)] + [
        (name, _P) for name in ("w", "scale", "colsum", "bias")
    ]


class Norm(ctypes.Structure):
    """``zoo_norm``: a layer norm (kind 0) or an RMSNorm scaled by ``w + offset`` (kind 1)."""

    _fields_ = [("kind", _I), ("w", _P), ("b", _P), ("eps", _F), ("offset", _F)]


class Block(ctypes.Structure):
    """``zoo_block``: the layout, the attention's geometry and the block's parts."""

    _fields_ = [
        ("layout", _I),
        ("d_model", _I),
        ("heads", _I),
        ("kv_heads", _I),
        ("head_dim", _I),
        ("act", _I),
        ("gated", _I),
        ("scale", _F),
        ("norm1", Norm),
        ("norm2", Norm),
        ("qkv", Linear),
        ("out", Linear),
        ("fc", Linear),
        ("proj", Linear),
    ]


class Embedding(ctypes.Structure):
    """``zoo_embedding``: float32 rows (kind 0) or int8 rows with a scale each (kind 1), a
    factor, and a learned position table or none."""

    _fields_ = [
        ("kind", _I),
        ("vocab", _I),
        ("max_positions", _I),
        ("rows", _P),
        ("row_scale", _P),
        ("positions", _P),
        ("scale", _F),
    ]


class Decoder(ctypes.Structure):
    """``zoo_decoder``: the embedding, the blocks (an array of ``zoo_block``), the final norm
    (when ``has_final``) and the head."""

    _fields_ = [
        ("embedding", Embedding),
        ("blocks", _P),
        ("n_blocks", _I),
        ("has_final", _I),
        ("final_norm", Norm),
        ("head", Linear),
    ]


def layout() -> tuple[int, ...]:
    """What ``zoo_abi`` of a library built from this checkout's C returns: :data:`VERSION`,
    then for ``zoo_linear``, ``zoo_norm``, ``zoo_block``, ``zoo_embedding`` and
    ``zoo_decoder`` in turn the structure's size and each field's offset, in bytes."""
    facts = [VERSION]
    for structure in (Linear, Norm, Block, Embedding, Decoder):  # read now: tests swap one
        facts.append(ctypes.sizeof(structure))
        facts += [getattr(structure, name).offset for name, *_ in structure._fields_]
    return tuple(facts)


#: More facts than any layout here has: a library that reports more is not zoo's.
_MOST = 1024


def built_layout(lib: Any) -> tuple[int, ...] | None:
    """What the library's ``zoo_abi`` reports (the form of :func:`layout`); ``None`` where
    it has no ``zoo_abi`` (built before it existed) or reports an impossible count."""
    abi = getattr(lib, "zoo_abi", None)
    if abi is None:
        return None
    abi.restype, abi.argtypes = _I, [_P, _I]
    count = abi(None, 0)
    if not 0 < count <= _MOST:
        return None
    facts = (_I * count)()
    abi(facts, count)
    return tuple(facts)
