"""Marian's static sinusoidal positions: Vaswani et al.'s vectors laid out as the sines of
every frequency, then the cosines (``[sin half | cos half]``), where zoo's ``sinusoidal``
interleaves them. Supplied as the ``positions`` component ``sinusoidal_halves``."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from zoo.nn.positions import PositionScheme

__all__ = ["SinusoidalHalves", "sinusoidal_halves"]


class SinusoidalHalves(PositionScheme):
    """``PE[pos, i] = sin(pos / 10000^(2i / d))`` for ``i < ceil(d / 2)``, then
    ``PE[pos, ceil(d / 2) + i] = cos(pos / 10000^(2i / d))`` for ``i < d / 2``, as
    transformers' ``MarianSinusoidalPositionalEmbedding`` tabulates them (in float64, then
    rounded to float32). Computed from the ids on their device, no parameters and no buffers
    (correct after a ``meta`` build); float64 where the device has it.

    Shape:
        ``(B, T)`` int64 position ids -> ``(B, T, d_model)`` float32.
    """

    def __init__(self, context_length: int, d_model: int) -> None:
        super().__init__()
        self.context_length = context_length
        self.d_model = d_model

    def embed(self, position_ids: Tensor) -> Tensor:
        device = position_ids.device
        wide = torch.float32 if device.type == "mps" else torch.float64  # (MPS has no float64)
        d, sines = self.d_model, (self.d_model + 1) // 2
        steps = torch.arange(sines, device=device, dtype=wide) * 2  # (sines,)
        inv_freq = torch.exp(steps * (-math.log(10000.0) / d))
        angles = position_ids.to(wide)[..., None] * inv_freq  # (B, T, sines)
        pe = torch.cat((angles.sin(), angles[..., : d // 2].cos()), dim=-1)  # (B, T, d)
        return pe.to(torch.float32)

    def extra_repr(self) -> str:
        return f"{self.context_length}, {self.d_model}"


def sinusoidal_halves(config: Any) -> SinusoidalHalves:
    """``positions = "sinusoidal_halves"``: Marian's table, sines then cosines."""
    return SinusoidalHalves(config.context_length, config.d_model)
