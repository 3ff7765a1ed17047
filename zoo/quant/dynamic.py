"""``quantize="int8"``'s layers on the CPU: PyTorch's dynamic int8 linear (int8 weights with a
scale per output row, the input quantized per call), as zoo's :class:`DynamicInt8Linear` (zoo's
kernels, the weights held once) or, where zoo's kernels are not built, torch.ao's own layer
(:func:`fbgemm_linear`). :func:`zoo.quant.layers.dynamic_int8` makes one from a float layer."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from ..kernels.native_int8 import _ROWS, int8_linear, rows_of
from ..kernels.ops import fbgemm_int8
from .grad import frozen_linear, int8_columns, needs_input_grad

__all__ = ["DynamicInt8Linear", "fbgemm_linear"]


class DynamicInt8Linear(nn.Module):
    """``quantize="int8"``'s layer on the CPU: int8 weights ``qweight`` ``(N, K)`` with a
    float32 ``scale`` per output row, the input quantized per call (one scale and zero point
    for the whole input, uint8 with reduce_range): PyTorch's dynamic int8 linear (torch.ao's,
    on FBGEMM) to the bit, computed by zoo's kernels from the int8 weights held once
    (:mod:`zoo.kernels.native_int8`). An input holding NaN or infinity, or one the kernels do
    not take, runs FBGEMM itself on the same weights (:func:`zoo.kernels.ops.fbgemm_int8`).

    Shape:
        ``(*, K) -> (*, N)``.
    """

    lossless = False

    qweight: Tensor
    scale: Tensor
    bias: nn.Parameter | None

    def __init__(self, qweight: Tensor, scale: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scale", scale.float().contiguous())
        bias = None if bias is None else bias.detach().float().contiguous()
        self.register_parameter(
            "bias", None if bias is None else nn.Parameter(bias, requires_grad=False)
        )
        rows_of(self)  # the row sums the kernels read, summed once now

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Load as any module does (in place), then sum the new weights' rows: a one-call
        decoding plan, which checks that the layer's rows are the ones it read, reads them
        again."""
        super()._load_from_state_dict(*args, **kwargs)
        self.__dict__.pop(_ROWS, None)
        rows_of(self)

    def forward(self, x: Tensor) -> Tensor:
        return frozen_linear(self, x) if needs_input_grad(x) else self.infer(x)

    def infer(self, x: Tensor) -> Tensor:
        """The forward without a gradient (inference; :mod:`zoo.quant.grad` adds one)."""
        y = int8_linear(self, x)
        return fbgemm_int8(x, self.qweight, self.scale, self.bias) if y is None else y

    def columns(self, start: int, end: int, dtype: torch.dtype) -> Tensor:
        """Input columns ``start:end`` of the dequantized weight, ``(N, end - start)``."""
        return int8_columns(self.qweight, self.scale, start, end, dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 (dynamic)"


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
