"""``quantize="int8"``'s layer on the CPU where zoo's kernels are not built: torch.ao's dynamic
int8 linear (:func:`fbgemm_linear`), its weights packed for FBGEMM. Where they are built, the
layer is :class:`zoo.quant.layers.DynamicInt8Linear` (the same numbers, the weights held
once); :func:`zoo.quant.layers.dynamic_int8` makes one or the other from a float layer."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from .grad import frozen_linear, int8_columns, needs_input_grad

__all__ = ["fbgemm_linear"]


@functools.cache
def fbgemm_linear() -> Any:  # a subclass of torch.ao's dynamic Linear
    """torch's dynamic int8 linear (its weights packed for FBGEMM), where zoo's kernels are
    not built; answering NaN activations with NaN (as a float layer does) where FBGEMM raises
    ``RuntimeError: In ChooseQuantizationParams, min should be less than or equal to max``
    (an earlier layer overflowed, e.g. weights of 3e38)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    class FbgemmInt8Linear(DynamicLinear):
        lossless = False

        def forward(self, x: Tensor) -> Tensor:
            return frozen_linear(self, x) if needs_input_grad(x) else self.infer(x)

        def infer(self, x: Tensor) -> Tensor:
            try:
                return super().forward(x)
            except RuntimeError as exc:
                if "ChooseQuantizationParams" not in str(exc):
                    raise
                nan = float("nan")
                return x.new_full((*x.shape[:-1], self.out_features), nan)

        def columns(self, start: int, end: int, dtype: torch.dtype) -> Tensor:
            weight = self.weight()  # per-channel qint8 (N, K), unpacked
            scale = weight.q_per_channel_scales().float()  # float32 values, held as float64
            return int8_columns(weight.int_repr(), scale, start, end, dtype)

    return FbgemmInt8Linear
