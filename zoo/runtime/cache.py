"""Preallocated key/value caches for incremental decoding (what the model code writes through
:class:`zoo.nn.cache_types.LayerCacheLike` and :class:`~zoo.nn.cache_types.KVCacheLike`)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import native

__all__ = ["KVCache", "LayerCache", "StaticKVCache", "StaticLayerCache"]


class LayerCache:
    """One layer's self-attention keys and values, preallocated to ``max_len`` positions.

    Shape:
        ``k``, ``v``: ``(B, H, max_len, head_dim)``; positions ``[0, length)`` are filled.
    """

    def __init__(self, k: Tensor, v: Tensor) -> None:
        self.k = k
        self.v = v

    def write(self, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k``, ``v`` ``(B, H, T, hd)`` at ``[start, start + T)`` and return the keys and
        values of every filled position, ``(B, H, start + T, hd)`` views (no copy)."""
        t = k.shape[2]
        end = start + t
        if end > self.k.shape[2]:
            raise ValueError(
                f"the cache holds {self.k.shape[2]} positions; writing up to {end} overflows it"
            )
        self.k.narrow(2, start, t).copy_(k)
        self.v.narrow(2, start, t).copy_(v)
        return self.k.narrow(2, 0, end), self.v.narrow(2, 0, end)

    def attend_one(
        self, q: Tensor, k: Tensor, v: Tensor, start: int, scale: float
    ) -> Tensor | None:
        """One new token's attention of one sequence on zoo's CPU kernel
        (:func:`zoo.kernels.native.attend_one`, which stores ``k``, ``v`` at ``start`` too),
        ``(1, 1, H * hd)``; ``None`` for a subclass (which writes elsewhere) or where the
        kernel does not apply."""
        if type(self) is not LayerCache:
            return None
        return native.attend_one(q, k, v, self.k, self.v, start, scale)


class StaticLayerCache(LayerCache):
    """A layer cache read whole, for a decoding step recorded once and replayed (a CUDA graph).

    The new keys and values go to the position held in the device tensor ``index`` (shared by
    every layer and advanced by the caller), not to a Python ``start``, and every one of the
    ``max_len`` positions is returned: the step's kernels and shapes are the same at every
    position. The attention mask must hide the positions not yet written.
    """

    def __init__(self, k: Tensor, v: Tensor, index: Tensor) -> None:
        super().__init__(k, v)
        self.index = index

    def write(self, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k``, ``v`` ``(B, H, T, hd)`` at positions ``index`` (``T`` of them; ``start``
        is ignored) and return the whole cache, ``(B, H, max_len, hd)``."""
        self.k.index_copy_(2, self.index, k)
        self.v.index_copy_(2, self.index, v)
        return self.k, self.v


class KVCache:
    """Self-attention caches for a stack of layers, allocated once, never re-concatenated.

    Args:
        n_layers: layers in the stack.
        batch_size, n_heads, max_len, head_dim: cache geometry.
        dtype, device: those of the model.
    """

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_heads: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (batch_size, n_heads, max_len, head_dim)
        self.layers = [
            LayerCache(
                torch.empty(shape, dtype=dtype, device=device),
                torch.empty(shape, dtype=dtype, device=device),
            )
            for _ in range(n_layers)
        ]
        self.max_len = max_len
        #: Number of positions filled so far (the same for every row; padding is masked).
        self.length = 0

    def advance(self, t: int) -> None:
        """Count ``t`` more filled positions (after a forward pass wrote them)."""
        self.length += t

    def reorder(self, index: Tensor, length: int | None = None) -> None:
        """Make row ``i`` of every layer what row ``index[i]`` was (beam search's reordering
        of its hypotheses), in place: the buffers stay the same tensors, so views of them
        (:class:`StaticKVCache`, a recorded CUDA graph) see the new rows. Only the first
        ``length`` positions move (default: :attr:`length`, the filled ones).

        Args:
            index: ``(B,)`` ``torch.long`` row indices into the cache's ``B`` rows.
            length: how many positions of each row hold keys and values.
        """
        rows = self.layers[0].k.shape[0] if self.layers else 0
        if index.ndim != 1 or index.shape[0] != rows:
            raise ValueError(
                f"reorder takes one row index per cache row, shape ({rows},); got "
                f"{tuple(index.shape)}"
            )
        filled = self.length if length is None else length
        moved = (index != torch.arange(rows, device=index.device)).nonzero().flatten()  # (M,)
        if moved.numel() == 0:
            return
        sources = index.index_select(0, moved)  # (M,): only the rows that change are copied
        for layer in self.layers:
            for buffer in (layer.k, layer.v):
                part = buffer.narrow(2, 0, filled)
                part.index_copy_(0, moved, part.index_select(0, sources))

    def read_whole(self, index: Tensor) -> StaticKVCache:
        """The same buffers as :class:`StaticLayerCache` s that write at ``index`` ``(T,)`` and
        read every position. Unwritten positions are zeroed first: masked out, they still meet
        the attention weights (``0 * nan`` would be ``nan``)."""
        for layer in self.layers:
            layer.k.narrow(2, self.length, self.max_len - self.length).zero_()
            layer.v.narrow(2, self.length, self.max_len - self.length).zero_()
        return StaticKVCache(self, index)


class StaticKVCache(KVCache):
    """A :class:`KVCache` read whole (:meth:`KVCache.read_whole`): its layers write at a device
    index that the caller advances, so ``length`` stays what it was when the view was made and
    a forward pass sees the same Python values at every step (what a recorded or compiled step
    needs)."""

    def __init__(self, cache: KVCache, index: Tensor) -> None:  # shares `cache`'s buffers
        self.layers = [StaticLayerCache(layer.k, layer.v, index) for layer in cache.layers]
        self.max_len = cache.max_len
        self.length = cache.length

    def advance(self, t: int) -> None:
        """Nothing: the caller advances the device index."""
