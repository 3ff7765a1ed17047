"""Normalisations: LayerNorm and RMSNorm, built from a config as components."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..kernels import native

__all__ = ["LayerNorm", "RMSNorm", "UnitOffsetRMSNorm", "layernorm", "rmsnorm", "rmsnorm1p"]


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
        row = _native_rms(x, self.weight, self.eps, 0.0)  # one float32 row: zoo's kernel
        if row is not None:
            return row
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
        row = _native_rms(x, self.weight, self.eps, 1.0)  # one float32 row: zoo's kernel
        if row is not None:
            return row
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters and state dict) that normalises one float32 row
    without gradients (batch-1 decoding on the CPU) on zoo's kernel
    (:func:`zoo.kernels.native.layer_norm`).

    Shape:
        ``(*, d) -> (*, d)``.
    """

    def forward(self, x: Tensor) -> Tensor:
        if len(self.normalized_shape) == 1 and not _needs_grad(x, self.weight):
            row = native.layer_norm(x, self.weight, self.bias, self.eps)
            if row is not None:
                return row
        return super().forward(x)


def _needs_grad(x: Tensor, weight: Tensor | None) -> bool:
    """Whether autograd records this call (zoo's kernels record nothing)."""
    wants = x.requires_grad or (weight is not None and weight.requires_grad)
    return torch.is_grad_enabled() and wants


def _native_rms(x: Tensor, weight: Tensor, eps: float, offset: float) -> Tensor | None:
    """:func:`zoo.kernels.native.rms_norm` where no gradient is recorded, else ``None``."""
    return None if _needs_grad(x, weight) else native.rms_norm(x, weight, eps, offset)


def layernorm(config: Any) -> LayerNorm:
    """``norm = "layernorm"`` over ``d_model``, with a bias when ``norm_bias`` (default
    ``bias``) is true."""
    bias = config.bias if getattr(config, "norm_bias", None) is None else config.norm_bias
    return LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=bias)


def rmsnorm(config: Any) -> RMSNorm:
    """``norm = "rmsnorm"`` over ``d_model``."""
    return RMSNorm(config.d_model, eps=config.layer_norm_eps)


def rmsnorm1p(config: Any) -> UnitOffsetRMSNorm:
    """``norm = "rmsnorm1p"`` over ``d_model``: RMSNorm scaled by ``1 + weight`` (Gemma)."""
    return UnitOffsetRMSNorm(config.d_model, eps=config.layer_norm_eps)
