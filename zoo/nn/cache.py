"""Preallocated key/value caches for incremental decoding."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KVCache", "LayerCache"]


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
