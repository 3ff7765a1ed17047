"""zoo's int8 kernels: PyTorch's dynamic int8 linear, to the bit, on weights held once.

Why: ``quantize="int8"`` on the CPU computes torch.ao's dynamic quantized linear (FBGEMM: int8
weights with a scale per output row, the input quantized to uint8 per call). FBGEMM keeps its
weights packed in its own layout, which only its kernels read, and its kernel, made for many
rows, streams the weights for one row more slowly than the cores can read them. zoo's int8
layer (:class:`zoo.quant.layers.DynamicInt8Linear`) holds the int8 weights once, as plain
``(N, K)`` rows (:class:`Int8Rows`), and its kernels (``zoo/kernels/_native_int8.c``, built
into the same library as :mod:`zoo.kernels.native`'s float32 kernels) compute FBGEMM's
numbers from them for any number of rows: ``zoo_gemv_int8`` for one row at the memory's rate,
``zoo_linear_int8`` for more (tiles of weight rows by input rows, the weights read once for
all rows). Where zoo's kernels are not built, the layer is torch.ao's own.

Numerics: the same as FBGEMM's, bit for bit: the input's scale and zero point are chosen from
its minimum and maximum as ``quant_utils::ChooseQuantizationParams`` chooses them
(reduce_range; over the whole input, as FBGEMM quantizes a whole input with one pair), the
values are quantized as ``QuantizeAvx2`` does, products are summed exactly in int32, and the
epilogue multiplies and adds in FBGEMM's order (``requantizeForFloatAvx2``); the C file lists
the steps and ``tests/test_native_int8.py`` checks them against torch on random inputs. An
input holding NaN or infinity is left to FBGEMM (:func:`zoo.kernels.ops.fbgemm_int8`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from .native import _compile_ready, _kernels, _library, _plain
from .ops import linear_int8_kernel

__all__ = ["Int8Rows", "int8_linear", "rows_of"]

_ROWS = "_zoo_int8_rows"  # the layer attribute that holds its Int8Rows
_SUM_ROWS = 64  # rows summed at a time


@dataclasses.dataclass(frozen=True, eq=False)
class Int8Rows:
    """What zoo's int8 kernels read of one layer: ``q`` ``(N, K)`` int8, ``scale`` ``(N,)``
    float32 (the per-row scales), ``colsum`` ``(N,)`` int32 (``q.sum(1)``), ``bias``
    ``(N,)`` float32 or ``None``, all contiguous: the layer's own tensors but ``colsum``,
    which was summed from ``q`` at its ``version`` (a change in place, as
    ``load_state_dict`` makes, moves the version: the rows are read again)."""

    q: Tensor
    scale: Tensor
    colsum: Tensor
    bias: Tensor | None
    version: int

    def intact(self) -> bool:
        """Whether the kernel may read the rows: each a plain contiguous tensor of its dtype
        and shape inside its storage (:func:`zoo.kernels.native_load._plain`), as
        :func:`rows_of` made them (not changed in place since)."""
        q = self.q
        if q.dim() != 2 or not q.is_contiguous() or not _plain(q, torch.int8):
            return False
        n = q.shape[0]
        parts = [(self.scale, torch.float32), (self.colsum, torch.int32)]
        if self.bias is not None:
            parts.append((self.bias, torch.float32))
        return q._version == self.version and all(
            t.shape == (n,) and t.is_contiguous() and _plain(t, dtype) for t, dtype in parts
        )

    def laid_out(self) -> bool:
        """Whether the rows have the dtypes, device, shapes and contiguity the kernel reads,
        from what a traced (fake) tensor has; :meth:`intact` also checks their storage."""
        q = self.q
        if q.dim() != 2 or q.dtype is not torch.int8 or not q.is_cpu or not q.is_contiguous():
            return False
        n = q.shape[0]
        parts = [(self.scale, torch.float32), (self.colsum, torch.int32)]
        if self.bias is not None:
            parts.append((self.bias, torch.float32))
        return all(
            t.dtype is dtype and t.is_cpu and t.shape == (n,) and t.is_contiguous()
            for t, dtype in parts
        )

    def pointers(self) -> tuple[int, int, int, int | None]:
        """The addresses the kernel takes after the input's: weights, scales, sums, bias."""
        bias = None if self.bias is None else self.bias.data_ptr()
        return self.q.data_ptr(), self.scale.data_ptr(), self.colsum.data_ptr(), bias


def _kernel() -> Any:
    """``zoo_linear_int8`` (its argument types set by :mod:`zoo.kernels.native_load`), or
    ``None`` where zoo's kernels do not run now (:func:`zoo.kernels.native.available`, or
    inside a ``torch.compile`` trace)."""
    lib = _kernels()
    return None if lib is None else lib.zoo_linear_int8


def rows_of(layer: Any) -> Int8Rows | None:
    """The :class:`Int8Rows` of ``layer`` (a :class:`zoo.quant.layers.DynamicInt8Linear`:
    ``qweight``, ``scale``, ``bias``), summed again where its weights were replaced or changed
    in place since; ``None`` where they are not what the kernels read (another dtype or
    device, not contiguous)."""
    q, scale, bias = layer.qweight, layer.scale, layer.bias
    rows = layer.__dict__.get(_ROWS)
    if (
        rows is not None
        and rows.q is q
        and rows.scale is scale
        and rows.bias is bias
        and rows.version == q._version
    ):
        return rows
    layer.__dict__.pop(_ROWS, None)
    if q.dtype is not torch.int8 or q.dim() != 2 or not q.is_cpu or not q.is_contiguous():
        return None
    # (N,), 64 rows at a time: the sum widens its rows to int32 first (a whole (N, K) int32
    # temporary would grow the heap by 4x the weight for good)
    colsum = torch.cat([part.sum(dim=1, dtype=torch.int32) for part in q.split(_SUM_ROWS)])
    rows = Int8Rows(q, scale, colsum, bias, q._version)
    if not rows.laid_out():
        return None
    layer.__dict__[_ROWS] = rows
    return rows


def int8_linear(layer: Any, x: Tensor) -> Tensor | None:
    """``layer(x)`` for zoo's dynamic int8 layer and float32 ``x`` ``(*, K)`` on the CPU, any
    number of rows, on zoo's kernels (FBGEMM's numbers); ``None`` where the kernels do not
    apply (no kernels, another dtype or device, an input holding NaN or infinity) and the
    caller runs FBGEMM. No autograd.

    Under ``torch.compile`` it decides on what traced tensors have and returns the operator
    ``torch.ops.zoo.linear_int8``'s result (:mod:`zoo.kernels.ops`), which computes FBGEMM's
    numbers for whatever it is handed.

    Shape:
        ``(*, K) -> (*, N)``.
    """
    if torch.compiler.is_compiling():
        return _traced(layer, x)
    lib = _library()
    if lib is None:
        return None
    rows = rows_of(layer)
    if rows is None:
        return None
    return linear_int8_kernel(lib, x, rows.q, rows.scale, rows.colsum, rows.bias)


def _traced(layer: Any, x: Tensor) -> Tensor | None:
    """:func:`int8_linear` while compiling: the operator where the layer's rows were read
    (eagerly, before the trace) from its current weights and the tensors' dtypes, devices and
    shapes are the kernel's."""
    rows = layer.__dict__.get(_ROWS)
    if rows is None or rows.q is not layer.qweight or not _compile_ready():
        return None
    k = rows.q.shape[-1]
    if not (rows.laid_out() and x.dtype is torch.float32 and x.is_cpu and x.shape[-1] == k):
        return None
    return torch.ops.zoo.linear_int8(x, rows.q, rows.scale, rows.colsum, rows.bias)
