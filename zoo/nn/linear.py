"""zoo's linear layer: ``nn.Linear`` exactly (PyTorch's own kernels), marked as zoo's so that
load-time transforms know which layers they may swap: :mod:`zoo.quant.layers` (``quantize=``) and
:mod:`zoo.nn.onednn` (faster CPU inference kernels, applied by ``zoo.build``/``zoo.load``).
"""

from __future__ import annotations

from torch import nn

__all__ = ["Linear"]


class Linear(nn.Linear):
    """``nn.Linear``; parameters, state dict and forward are ``nn.Linear``'s."""
