"""Beam search's reordering of a decoding session's rows: after each step every surviving
hypothesis continues from the row of the hypothesis it extends, so row ``i`` of the session
must become what row ``index[i]`` was.

A session that knows its state says how with a method ``reorder(index)`` (zoo's
:class:`~zoo.runtime.decoding.DecoderSession`, :class:`~zoo.runtime.decoding.StaticDecoderSession`
and :class:`~zoo.runtime.session.RecomputeSession` have one). Any other session is reordered
by :func:`reorder_rows` attribute by attribute when every attribute is of a kind it knows: a
:class:`~zoo.runtime.cache.KVCache` (moved in place), a tensor whose first dimension is the
batch's rows (one row per sequence: moved), any other tensor (shared by the rows: kept),
lists, tuples and dicts of these, modules, numbers, strings and ``None``. That covers a
session holding a source's encoding, its cross-attention keys and values and a
self-attention cache (an encoder-decoder's). An attribute of another kind is an error that
names it, rather than a reordering that would silently miss state.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .cache import KVCache

__all__ = ["check_reorderable", "reorder_rows"]

_PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, nn.Module)


def _unknown(value: Any) -> str | None:
    """The type name of the first value inside ``value`` that :func:`_moved` cannot reorder,
    or ``None`` when it can reorder all of it."""
    if isinstance(value, (Tensor, KVCache, *_PLAIN)):
        return None
    items = value.values() if isinstance(value, dict) else value
    if isinstance(value, (list, tuple, dict)):
        return next((found for item in items if (found := _unknown(item)) is not None), None)
    return type(value).__name__


def _moved(value: Any, index: Tensor, rows: int, seen: set[int]) -> Any:
    """``value`` with its rows taken in the order ``index``: caches in place (each set of
    buffers once, however many attributes hold it: ``seen``), per-row tensors as new tensors,
    containers rebuilt around them, everything else as it was."""
    if isinstance(value, KVCache):
        buffers = id(value.layers[0].k) if value.layers else id(value)
        if buffers not in seen:
            seen.add(buffers)
            value.reorder(index)
        return value
    if isinstance(value, Tensor):
        per_row = value.ndim > 0 and value.shape[0] == rows
        return value.index_select(0, index.to(value.device)) if per_row else value
    if isinstance(value, dict):
        return {key: _moved(item, index, rows, seen) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_moved(item, index, rows, seen) for item in value]
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def check_reorderable(session: Any) -> None:
    """Raise ``NotImplementedError`` when :func:`reorder_rows` cannot reorder ``session``: it
    has no ``reorder`` method and holds an attribute of a kind the generic reordering does
    not know (checked before a beam search starts, so it fails before any work)."""
    if callable(getattr(session, "reorder", None)):
        return
    for name, value in vars(session).items():
        kind = _unknown(value)
        if kind is not None:
            raise NotImplementedError(
                f"{type(session).__name__} cannot reorder its rows for beam search: its "
                f"attribute {name!r} holds a {kind}, which zoo does not know how to reorder. "
                "Give the session a method reorder(index) that makes row i what row "
                "index[i] was (its caches included), or generate with num_beams=1"
            )


def reorder_rows(session: Any, index: Tensor) -> None:
    """Make row ``i`` of ``session`` what row ``index[i]`` was.

    Args:
        session: a decoding session over ``B`` rows (``session.prefix`` is ``(B, P)``).
        index: ``(B,)`` ``torch.long`` row indices on the session's device.

    Raises:
        NotImplementedError: the session has no ``reorder`` method and an attribute the
            generic reordering does not know (:func:`check_reorderable`).
    """
    own = getattr(session, "reorder", None)
    if callable(own):
        own(index)
        return
    check_reorderable(session)
    rows = int(session.prefix.shape[0])
    seen: set[int] = set()
    for name, value in list(vars(session).items()):
        setattr(session, name, _moved(value, index, rows, seen))
