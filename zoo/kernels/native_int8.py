"""zoo's batch-1 int8 kernel: PyTorch's dynamic int8 linear for one row, to the bit.

Why: ``quantize="int8"`` on the CPU is torch.ao's dynamic quantized linear (FBGEMM: int8
weights with a scale per output row, the input row quantized to uint8 per call). A batch-1
decoding step reads every weight once, and FBGEMM's kernel, made for many rows, streams
them for one row more slowly than the cores can read them; ``zoo_gemv_int8``
(``zoo/kernels/_native_int8.c``, built into the same library as :mod:`zoo.kernels.native`'s float32
kernel) computes the same thing for one row at the memory's rate.

Numerics: the same as FBGEMM's, bit for bit, on AVX2 machines: the input's scale and zero
point are chosen as ``quant_utils::ChooseQuantizationParams`` chooses them (reduce_range),
the row is quantized as ``QuantizeAvx2`` does, products are summed exactly in int32, and the
epilogue multiplies and adds in FBGEMM's order (``requantizeForFloatAvx2``); the C file
lists the steps and ``tests/test_native_int8.py`` checks them against torch on random rows.
A row holding NaN or infinity is left to FBGEMM.

Memory: FBGEMM keeps its weights packed in its own layout, which this kernel cannot read, so
the kernel reads a plain ``(N, K)`` int8 copy (:class:`Int8Rows`): the int8 weights are held
twice (for a head tied to the token embedding, the embedding's rows serve, no copy).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch
from torch import Tensor

from .native import _compile_ready, _kernels, _library, _plain
from .ops import gemv_int8_kernel

__all__ = ["Int8Rows", "attach_rows", "int8_linear"]

_ROWS = "_zoo_int8_rows"  # the layer attribute that holds its Int8Rows
_SUM_ROWS = 64  # rows summed at a time


@dataclasses.dataclass(frozen=True, eq=False)
class Int8Rows:
    """What ``zoo_gemv_int8`` reads of one dynamic int8 layer: ``q`` ``(N, K)`` int8,
    ``scale`` ``(N,)`` float32 (the per-row scales as FBGEMM rounds them), ``colsum``
    ``(N,)`` int32 (``q.sum(1)``), ``bias`` ``(N,)`` float32 or ``None``, all contiguous;
    ``packed`` is a weak reference to the layer's packed weight they were read from (a
    later ``set_weight_bias`` replaces it, and a copied layer has its own: either way the
    rows are read again)."""

    q: Tensor
    scale: Tensor
    colsum: Tensor
    bias: Tensor | None
    packed: weakref.ref

    def intact(self) -> bool:
        """Whether the kernel may read the rows: each a plain contiguous tensor of its dtype
        and shape inside its storage (:func:`zoo.kernels.native_load._plain`), as
        :func:`_rows` made them (not changed in place since)."""
        q = self.q
        if q.dim() != 2 or not q.is_contiguous() or not _plain(q, torch.int8):
            return False
        n = q.shape[0]
        parts = [(self.scale, torch.float32), (self.colsum, torch.int32)]
        if self.bias is not None:
            parts.append((self.bias, torch.float32))
        return all(t.shape == (n,) and t.is_contiguous() and _plain(t, dtype) for t, dtype in parts)

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
    """``zoo_gemv_int8`` (its argument types set by :mod:`zoo.kernels.native_load`), or
    ``None`` where zoo's kernels do not run now (:func:`zoo.kernels.native.available`, or
    inside a ``torch.compile`` trace)."""
    lib = _kernels()
    return None if lib is None else lib.zoo_gemv_int8


def _packed(layer: Any) -> Any:
    return layer._packed_params._packed_params


def attach_rows(layer: Any, q: Tensor, scale: Tensor) -> None:
    """Give ``layer`` (a dynamic int8 linear whose weight was just set from ``q`` ``(N, K)``
    int8 and ``scale`` ``(N,)``) the :class:`Int8Rows` its kernel reads, sharing ``q``;
    nothing where the kernel does not run (no second copy of the weights held)."""
    if _kernel() is None:
        return
    bias = layer.bias()
    setattr(layer, _ROWS, _rows(q, scale.float(), bias, _packed(layer)))


def _rows(q: Tensor, scale: Tensor, bias: Tensor | None, packed: Any) -> Int8Rows:
    q = q.contiguous()
    # (N,), 64 rows at a time: the sum widens its rows to int32 first (a whole (N, K) int32
    # temporary would grow the heap by 4x the weight for good)
    colsum = torch.cat([rows.sum(dim=1, dtype=torch.int32) for rows in q.split(_SUM_ROWS)])
    bias = bias.detach().float().contiguous() if bias is not None else None
    return Int8Rows(q, scale.contiguous(), colsum, bias, weakref.ref(packed))


def _rows_of(layer: Any) -> Int8Rows | None:
    """The layer's :class:`Int8Rows`, read from its packed weight where it has none or the
    weight changed; ``None`` for a weight the kernel does not take (a zero point not 0)."""
    rows = layer.__dict__.get(_ROWS)
    packed = _packed(layer)
    if rows is not None and rows.packed() is packed:
        return rows
    weight, bias = layer._weight_bias()  # the int8 weight, unpacked (N, K)
    if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        if bool(weight.q_per_channel_zero_points().ne(0).any()):
            return None
        scale = weight.q_per_channel_scales().float()  # FBGEMM holds them as float
    elif weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        if weight.q_zero_point() != 0:
            return None
        scale = torch.full((weight.shape[0],), weight.q_scale(), dtype=torch.float32)
    else:
        return None
    rows = _rows(weight.int_repr(), scale, bias, packed)
    setattr(layer, _ROWS, rows)
    return rows


def int8_linear(layer: Any, x: Tensor) -> Tensor | None:
    """``layer(x)`` for a dynamic int8 linear (torch.ao's, FBGEMM's numbers) and one row of
    float32 ``x`` on the CPU (``(*, K)`` with at least two dimensions and one row in all),
    on zoo's kernel; ``None`` where the kernel does not apply (no kernel, another dtype or
    device, several rows, a row holding NaN or infinity) and the caller runs the layer's
    own kernel. No autograd.

    Under ``torch.compile`` it decides on what traced tensors have (and on the rows
    :func:`attach_rows` gave the layer: none are read while tracing) and returns the
    operator ``torch.ops.zoo.gemv_int8``'s result (:mod:`zoo.kernels.ops`), which computes
    FBGEMM's numbers for whatever it is handed, a row holding NaN or infinity included.

    Shape:
        ``(*, K) -> (*, N)``.
    """
    if torch.compiler.is_compiling():
        return _traced(layer, x)
    lib = _library()
    if lib is None:
        return None
    rows = _rows_of(layer)
    if rows is None:
        return None
    return gemv_int8_kernel(lib, x, rows.q, rows.scale, rows.colsum, rows.bias)


def _traced(layer: Any, x: Tensor) -> Tensor | None:
    """:func:`int8_linear` while compiling: the operator where the layer has rows read from
    its current weight and the tensors' dtypes, devices and shapes are the kernel's."""
    rows = layer.__dict__.get(_ROWS)
    if rows is None or rows.packed() is not _packed(layer) or not _compile_ready():
        return None
    k = rows.q.shape[-1]
    if not (
        rows.laid_out()
        and x.dtype is torch.float32
        and x.is_cpu
        and x.dim() >= 2
        and x.numel() == k
        and x.shape[-1] == k
    ):
        return None
    return torch.ops.zoo.gemv_int8(x, rows.q, rows.scale, rows.colsum, rows.bias)
