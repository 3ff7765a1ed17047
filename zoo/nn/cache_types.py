"""What the model code needs of a key/value cache, as protocols: attention writes each new
token's keys and values through a :class:`LayerCacheLike`, and a decoder reads the layers and
the filled length of a :class:`KVCacheLike`.

The caches themselves (:class:`zoo.runtime.cache.KVCache` and the slot batch's) belong to the
decoding runtime, which builds on this package: the model code names only what it calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from torch import Tensor

__all__ = ["KVCacheLike", "LayerCacheLike"]


class LayerCacheLike(Protocol):
    """One layer's cached keys and values."""

    def write(self, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k``, ``v`` ``(B, H_kv, T, hd)`` at ``[start, start + T)`` and return the keys
        and values attention reads, ``(B, H_kv, S, hd)``."""
        ...

    def attend_one(
        self, q: Tensor, k: Tensor, v: Tensor, start: int, scale: float
    ) -> Tensor | None:
        """One new token's attention of one sequence in one kernel that also stores ``k``,
        ``v`` at ``start``, ``(1, 1, H * hd)``; ``None`` (nothing stored) where the cache
        offers no such kernel for these inputs (no mask, soft cap or gradients: the caller
        has checked)."""
        ...


class KVCacheLike(Protocol):
    """The caches of a stack of layers."""

    @property
    def layers(self) -> Sequence[LayerCacheLike]:
        """One cache per layer, in order."""
        ...

    @property
    def length(self) -> int:
        """Positions filled so far (the new tokens go from here)."""
        ...

    def advance(self, t: int) -> None:
        """Count ``t`` more filled positions (after a forward pass wrote them)."""
        ...
