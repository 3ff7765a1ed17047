"""int4 codes read back from float weights that are a 4-bit block format dequantized.

A GGUF file's q4_0 blocks are 32 weights ``d * (q - 8)``, ``q`` in 0..15 and ``d`` a float16,
the weight of largest magnitude coded 0 (llama.cpp's quantizer). Dequantized to float32 they
are exact, and :func:`q4_0_codes` recovers ``q`` and ``d`` from them: zoo's int4 groups are
32 input features too, and its kernels compute ``(q - 8) * scale + zero``, so such a weight
is held in int4 with no further loss (``scale = d``, ``zero = 0``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["q4_0_codes"]


def q4_0_codes(groups: Tensor) -> tuple[Tensor, Tensor] | None:
    """``(codes, d)`` when every group of ``groups`` (``(N, K / 32, 32)``, float32) is
    ``d * (codes - 8)`` exactly, with ``codes`` in 0..15 (``(N, K / 32, 32)`` int32) and its
    largest magnitude at code 0 (``d``: ``(N, K / 32)``); ``None`` otherwise."""
    if groups.dtype != torch.float32:
        return None
    largest = groups.gather(-1, groups.abs().argmax(dim=-1, keepdim=True)).squeeze(-1)
    d = -largest / 8  # (N, K / 32): exact, a power of two
    zero = d == 0  # an all-zero group: any code, here 8
    q = groups / torch.where(zero, torch.ones_like(d), d)[..., None] + 8
    codes = q.round()
    if not torch.equal(codes, q) or bool((codes < 0).any()) or bool((codes > 15).any()):
        return None
    codes = torch.where(zero[..., None], torch.full_like(codes, 8.0), codes)
    if not torch.equal((codes - 8) * d[..., None], groups):
        return None
    return codes.to(torch.int32), d
