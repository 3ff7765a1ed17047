"""Training on a quantized base (QLoRA): the gradient with respect to the input of a frozen
quantized linear layer, so that adapters before it learn.

PyTorch's quantized kernels (``_weight_int8pack_mm``, ``_weight_int4pack_mm[_for_cpu]``,
torch.ao's dynamic int8 linear) have no backward. :func:`frozen_linear` runs a layer's own
inference forward unchanged (its outputs are bit for bit those of inference; a layer
``slow_on_many_rows``, int4, multiplies many rows by its dequantized weight instead:
:func:`dequantized_product`) inside an autograd function whose backward is ``grad_out @ W``,
with ``W`` the weight as the layer's kernel dequantizes it, built ``columns`` of the input
at a time (:data:`CHUNK_ELEMENTS` floats at most), so the float weight is never whole in
memory and nothing of the input is kept for the backward. The weight gets no gradient: it
is frozen.

Each layer says how its weight dequantizes through ``columns(start, end, dtype) -> (N, end -
start)``: int8 rows from their codes and scales (:func:`int8_columns`), int4 through the
int4 kernel itself applied to rows of the identity (:func:`int4_columns`: exact whatever
packing layout the kernel uses on this machine or device).
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = [
    "CHUNK_ELEMENTS",
    "MANY_ROWS",
    "QuantizedLinear",
    "dequantized_product",
    "frozen_linear",
    "input_grad",
    "int4_columns",
    "int8_columns",
    "needs_input_grad",
]

#: The most dequantized weight elements held at once in a backward (16 MiB of float32).
CHUNK_ELEMENTS = 1 << 22

#: Input rows beyond which a layer ``slow_on_many_rows`` multiplies by its dequantized
#: weight in training (:func:`dequantized_product`) instead of running its kernel.
MANY_ROWS = 16


class QuantizedLinear(Protocol):
    """What :func:`frozen_linear` needs of a quantized linear layer."""

    in_features: int
    out_features: int

    def infer(self, x: Tensor) -> Tensor:
        """The inference forward, ``(*, K) -> (*, N)``."""
        ...

    def columns(self, start: int, end: int, dtype: torch.dtype) -> Tensor:
        """The dequantized weight's input columns ``start:end``, ``(N, end - start)``."""
        ...


def needs_input_grad(x: Tensor) -> bool:
    """Whether a gradient must flow back to ``x`` (grad mode on and ``x`` requires it)."""
    return torch.is_grad_enabled() and x.requires_grad


class _Frozen(torch.autograd.Function):
    """``layer.infer(x)`` forward; ``grad @ W`` backward, to ``x`` only."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, layer: QuantizedLinear) -> Tensor:
        ctx.layer = layer
        ctx.shape = x.shape
        ctx.dtype = x.dtype
        if getattr(layer, "slow_on_many_rows", False) and x.numel() > MANY_ROWS * x.shape[-1]:
            return dequantized_product(layer, x)
        return layer.infer(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        layer: QuantizedLinear = ctx.layer
        rows = grad.reshape(-1, layer.out_features)  # (B*T, N)
        return input_grad(layer, rows.to(ctx.dtype)).view(ctx.shape), None


def frozen_linear(layer: QuantizedLinear, x: Tensor) -> Tensor:
    """``layer.infer(x)``, with a gradient to ``x`` through the frozen quantized weight."""
    out: Tensor = _Frozen.apply(x, layer)
    return out


def dequantized_product(layer: QuantizedLinear, x: Tensor) -> Tensor:
    """``x @ W^T + bias`` with ``W`` dequantized a few input columns at a time (at most
    :data:`CHUNK_ELEMENTS` elements of it at once), ``(*, K) -> (*, N)``: training's forward
    for a layer whose kernel is slow on many rows (``slow_on_many_rows``: the CPU int4
    kernel, several times a float product there), equal to its kernel's output up to the
    rounding of the kernel's own arithmetic."""
    n, k = layer.out_features, layer.in_features
    rows = x.reshape(-1, k)  # (M, K)
    step = max(1, CHUNK_ELEMENTS // max(n, k))
    y = rows.new_zeros(rows.shape[0], n)
    for start in range(0, k, step):
        end = min(k, start + step)
        y.addmm_(rows[:, start:end], layer.columns(start, end, rows.dtype).t())  # (M, c) (c, N)
    bias = getattr(layer, "bias", None)
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y.view(*x.shape[:-1], n)


def input_grad(layer: QuantizedLinear, grad: Tensor) -> Tensor:
    """``grad @ W``, ``(M, N) -> (M, K)``, dequantizing ``W`` a few input columns at a time
    (at most :data:`CHUNK_ELEMENTS` elements of it at once)."""
    n, k = layer.out_features, layer.in_features
    step = max(1, CHUNK_ELEMENTS // max(n, k))
    out = grad.new_empty(grad.shape[0], k)
    for start in range(0, k, step):
        end = min(k, start + step)
        out[:, start:end] = grad @ layer.columns(start, end, grad.dtype)  # (M, N) @ (N, c)
    return out


def int8_columns(q: Tensor, scale: Tensor, start: int, end: int, dtype: torch.dtype) -> Tensor:
    """Columns ``start:end`` of int8 rows ``q`` ``(N, K)`` with ``scale`` ``(N,)``, dequantized
    in ``dtype`` as :class:`~zoo.quant.layers.Int8Linear` does: ``(N, end - start)``."""
    return q[:, start:end].to(dtype) * scale.to(dtype)[:, None]


def int4_columns(
    packed: Tensor,
    scales_and_zeros: Tensor,
    group: int,
    in_features: int,
    span: tuple[int, int],
    dtype: torch.dtype,
) -> Tensor:
    """Columns ``span`` of an int4 weight, ``(N, end - start)`` in ``dtype``, as the kernels
    dequantize it: ``(q - 8) * scale + zero``. On the CPU the codes are unpacked from the
    packing layout found on this machine (:func:`_cpu_block`); elsewhere (or a layout not
    known) the int4 kernel is applied to those rows of the identity (one product by 1, the
    rest by 0: exact, but as slow as a forward of ``end - start`` rows)."""
    start, end = span
    kernel_dtype = scales_and_zeros.dtype
    block = _cpu_block() if packed.is_cpu else None
    if block is not None and packed.shape[0] % block == 0:
        groups = torch.arange(start, end, device=packed.device) // group  # (c,)
        scale, zero = scales_and_zeros[groups].transpose(0, 1).unbind(-1)  # (N, c) each
        codes = _unpack_cpu(packed, block, start, end).to(kernel_dtype)  # (N, c)
        return ((codes - 8) * scale + zero).to(dtype)
    eye = torch.zeros(end - start, in_features, dtype=kernel_dtype, device=packed.device)
    eye[:, start:end].fill_diagonal_(1)  # (c, K): rows start..end-1 of the identity
    mm = torch._weight_int4pack_mm_for_cpu if packed.is_cpu else torch._weight_int4pack_mm
    return mm(eye, packed, group, scales_and_zeros).t().to(dtype)  # (c, N) -> (N, c)


def _unpack_cpu(packed: Tensor, block: int, start: int, end: int) -> Tensor:
    """The int4 codes of input columns ``start:end`` from the CPU packing with ``block``
    output rows a block: ``(N, K / 2)`` bytes laid out as ``(N / block, K, block / 2)``, a
    byte holding row ``d`` of its block in its low half and row ``d + block / 2`` in its
    high half. Returns ``(N, end - start)`` uint8."""
    n = packed.shape[0]
    tiles = packed.view(n // block, -1, block // 2)[:, start:end]  # (N / B, c, B / 2)
    codes = torch.cat((tiles & 15, tiles >> 4), dim=-1)  # (N / B, c, B)
    return codes.transpose(1, 2).reshape(n, end - start)


@functools.cache
def _cpu_block() -> int | None:
    """The output rows of a block in ``torch._convert_weight_to_int4pack_for_cpu``'s layout
    on this machine (it depends on the CPU: 32 with AVX2, 64 with AVX-512), found by packing
    known codes; ``None`` where the layout is none of those (the kernel route is used)."""
    q = torch.randint(0, 16, (128, 256), dtype=torch.int32, generator=torch.Generator())
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 8)
    for block in (64, 32, 16):
        if torch.equal(_unpack_cpu(packed, block, 0, 256).to(torch.int32), q):
            return block
    return None
