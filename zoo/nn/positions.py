"""Position schemes: each maps position ids ``(B, T)`` to vectors ``(B, T, d_model)``.

The names used in configs are listed in :data:`zoo.config.POSITION_SCHEMES`. A scheme is a
module built as ``Scheme(context_length, d_model)``; :func:`make_positions` builds one by name.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._lazy import resolve
from ..config import POSITION_SCHEMES

__all__ = ["LearnedPositions", "SinusoidalPositions", "make_positions"]


class LearnedPositions(nn.Module):
    """Learned absolute positions: one trained vector per position (GPT-1, GPT-2).

    Shape:
        ``(B, T)`` int64 position ids -> ``(B, T, d_model)``.
    """

    def __init__(self, context_length: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(context_length, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, position_ids: Tensor) -> Tensor:
        return nn.functional.embedding(position_ids, self.weight)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions of Vaswani et al. (2017), section 3.5.

    ``PE[pos, 2i] = sin(pos / 10000^(2i / d))`` and ``PE[pos, 2i + 1] = cos(pos / 10000^(2i / d))``.
    Computed in float32 from the ids on the ids' own device: no parameters, no buffers, so it
    is correct on any device, including after a ``meta`` build.

    Shape:
        ``(B, T)`` int64 position ids -> ``(B, T, d_model)`` float32.
    """

    def __init__(self, context_length: int, d_model: int) -> None:
        super().__init__()
        self.context_length = context_length
        self.d_model = d_model

    def forward(self, position_ids: Tensor) -> Tensor:
        half = (self.d_model + 1) // 2
        exponent = torch.arange(half, device=position_ids.device, dtype=torch.float32) * 2
        inv_freq = torch.exp(exponent * (-math.log(10000.0) / self.d_model))  # (half,)
        angles = position_ids.to(torch.float32)[..., None] * inv_freq  # (B, T, half)
        pe = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (B, T, half, 2)
        return pe.flatten(-2)[..., : self.d_model]  # (B, T, d_model), sin/cos interleaved


def make_positions(name: str, context_length: int, d_model: int) -> nn.Module:
    """Build the position scheme called ``name``."""
    if name not in POSITION_SCHEMES:
        raise ValueError(
            f"unknown position scheme {name!r}; choose one of {', '.join(sorted(POSITION_SCHEMES))}"
        )
    return resolve(POSITION_SCHEMES[name])(context_length, d_model)
