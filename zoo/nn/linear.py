"""zoo's linear layer: ``nn.Linear`` exactly (PyTorch's own kernels), marked as zoo's so that
load-time transforms know which layers they may swap: :mod:`zoo.quant.layers` (``quantize=``)
and :func:`use_onednn` (oneDNN's CPU inference kernels, :mod:`zoo.kernels.onednn`, applied by
``zoo.build``/``zoo.load``), which makes them :class:`OneDNNLinear`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..kernels.onednn import available, cpu_linear

__all__ = ["Linear", "OneDNNLinear", "use_onednn"]


class Linear(nn.Linear):
    """``nn.Linear``; parameters, state dict and forward are ``nn.Linear``'s."""


class OneDNNLinear(Linear):
    """A :class:`zoo.nn.Linear` computed by :func:`cpu_linear` (made by :func:`use_onednn`,
    never built directly)."""

    def forward(self, x: Tensor) -> Tensor:
        return cpu_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, onednn"


def use_onednn(model: nn.Module) -> int:
    """Turn ``model``'s :class:`zoo.nn.Linear` layers (and plain ``torch.nn.Linear`` ones: the
    same parameters and forward) with float32 or bfloat16 weights on the CPU into
    :class:`OneDNNLinear`, in place; returns how many. Their names are recorded in
    ``model.onednn_linears`` (see :class:`~zoo.nn.ZooModel`). Nothing changes where this torch
    has no oneDNN."""
    if not available():
        return 0
    swapped: list[str] = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if (
            type(module) in (Linear, nn.Linear)  # a torch.nn.Linear computes as zoo's
            and isinstance(weight, Tensor)
            and weight.is_cpu
            and weight.dtype in (torch.float32, torch.bfloat16)
        ):
            module.__class__ = OneDNNLinear
            swapped.append(name)
    if swapped:
        names: Any = (*getattr(model, "onednn_linears", ()), *swapped)
        model.onednn_linears = names  # see ZooModel.onednn_linears
    return len(swapped)
