"""Normalisations: LayerNorm and RMSNorm, built from a config as components."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["RMSNorm", "UnitOffsetRMSNorm", "layernorm", "rmsnorm", "rmsnorm1p"]


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang and Sennrich 2019), as transformers' Llama computes it:
    in float32, then scaled by ``weight`` in the input's dtype.

    Shape:
        ``(*, d) -> (*, d)``.
    """

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def reset_parameters(self) -> None:
        """The identity scale: ``weight`` of ones."""
        nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class UnitOffsetRMSNorm(nn.Module):
    """RMSNorm scaled by ``1 + weight``, all in float32 and cast back at the end, as
    transformers' Gemma computes it. ``weight`` starts at 0 (the identity scale).

    Shape:
        ``(*, d) -> (*, d)``.
    """

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def reset_parameters(self) -> None:
        """The identity scale: ``weight`` of zeros (``1 + 0``)."""
        nn.init.zeros_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def layernorm(config: Any) -> nn.LayerNorm:
    """``norm = "layernorm"`` over ``d_model``, with a bias when ``norm_bias`` (default
    ``bias``) is true."""
    bias = config.bias if getattr(config, "norm_bias", None) is None else config.norm_bias
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=bias)


def rmsnorm(config: Any) -> RMSNorm:
    """``norm = "rmsnorm"`` over ``d_model``."""
    return RMSNorm(config.d_model, eps=config.layer_norm_eps)


def rmsnorm1p(config: Any) -> UnitOffsetRMSNorm:
    """``norm = "rmsnorm1p"`` over ``d_model``: RMSNorm scaled by ``1 + weight`` (Gemma)."""
    return UnitOffsetRMSNorm(config.d_model, eps=config.layer_norm_eps)
