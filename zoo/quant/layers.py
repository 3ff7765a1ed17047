"""Quantization for inference, on PyTorch's own kernels and, for one row, zoo's:

- ``"int8"``: int8 weights (one scale per output row) and, on the CPU, int8 activations
  quantized on the fly per call: PyTorch's dynamic quantized linear (FBGEMM through
  ``torch.ao``), the scheme CTranslate2's ``int8`` uses, computed to the bit by zoo's
  kernels on weights held once (:class:`DynamicInt8Linear`, :mod:`zoo.kernels.native_int8`;
  torch.ao's own layer where zoo's kernels are not built); on other devices it is
  ``"int8-weight"``.
- ``"int8-weight"``: weight-only int8, activations in floating point
  (``torch._weight_int8pack_mm``; more accurate, but that CPU kernel is slower than float32
  on machines without AVX-512: measured in the README).
- ``"int4"``: weight-only, groups of ``INT4_GROUP`` input features with a scale and zero
  point each (``torch._weight_int4pack_mm_for_cpu``, or ``torch._weight_int4pack_mm`` on
  CUDA).

:func:`quantize_` swaps every :class:`~zoo.nn.Linear` of a model for a quantized one in place,
one weight at a time; a head tied to the token embedding shares its int8 rows with an
:class:`Int8Embedding`, so the model holds one int8 copy of that matrix.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..kernels.native_int8 import _ROWS, int8_linear, rows_of
from ..kernels.native_load import _library
from ..kernels.onednn import cpu_linear as float_linear
from ..kernels.ops import fbgemm_int8, per_channel_int8
from ..kernels.pages import release_pages
from ..nn.linear import Linear
from ..options import QUANTIZE_MODES
from .blocks import q4_0_codes
from .dynamic import fbgemm_linear
from .grad import frozen_linear, int4_columns, int8_columns, needs_input_grad

__all__ = [
    "INT4_GROUP",
    "QUANTIZE_MODES",
    "DynamicInt8Linear",
    "Flaws",
    "Int4Linear",
    "Int8Embedding",
    "Int8Linear",
    "dynamic_int8",
    "input_headroom",
    "int8_rows",
    "quantizable",
    "quantize_",
    "release_pages",
    "supports_int4",
]

INT4_GROUP = 32
_INNER_K_TILES = 8  # int4 packing layout (the kernels support 2, 4, 8)


_CHUNK = 2048  # rows quantized at a time: temporaries stay small
_FEW_ROWS = 16  # up to this many input rows, the int8 kernel beats dequantizing the weight


def input_headroom(dtype: torch.dtype) -> float:
    """The input magnitude a quantized row must take without overflowing ``dtype``: the
    eighth root of its largest value (about 6.6e4 in float32 and bfloat16, 4 in float16),
    beyond any real model's activations (:class:`Flaws`)."""
    return float(torch.finfo(dtype).max) ** (1 / 8)


@dataclasses.dataclass
class Flaws:
    """What quantizing one weight lost (:meth:`check`, as its rows are quantized):
    ``nonfinite``, it holds NaN or inf; ``saturated``, the format cannot hold it: a code's
    value, dequantized as the kernel computes it, is off by more than one quantization step
    (a scale or zero point that overflows, or underflows to zero or a subnormal, in the
    kernel's dtype), or a row's outputs overflow for inputs of magnitude
    :func:`input_headroom` (weights near float32's limit, such as ±3e38)."""

    nonfinite: bool = False
    saturated: bool = False

    def check(
        self,
        weights: Tensor,
        exact: Tensor,
        kernel: Tensor,
        step: Tensor,
        row_sum: Tensor,
        dtype: torch.dtype,
        out: torch.dtype,
    ) -> None:
        """Rows of one weight. Each row's or group's extreme codes: ``exact``, the values they
        stand for (float64, or float32: the slack covers its rounding), and ``kernel``, the
        same dequantized in ``dtype`` as the kernel does; the error of every other code lies
        between (dequantizing is affine in the code). ``weights``: NaN or inf exactly where
        the rows' weights are (their extremes, or scales computed from them): ``nonfinite``;
        ``step``: the quantization step, broadcast against ``exact``; ``row_sum``:
        ``(rows,)``, the absolute sum of each dequantized row (or a bound on it), what an
        input of ones gives; ``out``: the dtype of the kernel's outputs."""
        if not bool(torch.isfinite(weights).all()):
            self.nonfinite = True
            return
        info = torch.finfo(dtype)  # the kernel dtype's own rounding is not saturation
        slack = step + info.eps * exact.abs() + info.tiny
        off = ~((kernel.to(exact.dtype) - exact).abs() <= slack)  # NaN or inf: off too
        self.saturated |= bool(off.any()) or bool(_overflows(row_sum, dtype, out).any())


def _overflows(row_sum: Tensor, dtype: torch.dtype, out: torch.dtype) -> Tensor:
    """``(rows,)``: whether a row of absolute sum ``row_sum`` overflows a kernel computing in
    ``dtype`` into ``out`` for inputs of magnitude :func:`input_headroom` (NaN: it does)."""
    largest = min(torch.finfo(dtype).max, torch.finfo(out).max)
    return ~(row_sum * input_headroom(out) < largest)


def int8_rows(weight: Tensor, *, release: bool = False) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per row: ``weight ~ q * scale[:, None]``, ``(N, K) -> (N, K), (N,)``,
    ``_CHUNK`` rows at a time; ``release`` gives each chunk's float pages back as it goes
    (:func:`release_pages`: only for weights mapped from a file)."""
    q, scale, _ = _int8_rows(weight, release=release)
    return q, scale


def _int8_rows(weight: Tensor, *, release: bool = False) -> tuple[Tensor, Tensor, Flaws]:
    """:func:`int8_rows`, and its :class:`Flaws` for a model computing in ``weight``'s dtype
    (as :class:`Int8Linear` and :class:`Int8Embedding` do)."""
    q = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scale = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    for start in range(0, weight.shape[0], _CHUNK):
        rows = weight.detach()[start : start + _CHUNK]
        w = rows.float()
        s = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # (rows,)
        q[start : start + _CHUNK] = torch.round(w / s[:, None]).clamp(-127, 127)
        scale[start : start + _CHUNK] = s
        if release:
            release_pages(rows)  # a chunk of rows of a transpose holds no page alone: kept
    if release:
        release_pages(weight)  # a transposed weight (a Conv1D layout's) whole
    return q, scale, _int8_flaws(q, scale, weight.dtype)


def _int8_flaws(q: Tensor, scale: Tensor, dtype: torch.dtype) -> Flaws:
    """:class:`Flaws` of int8 rows ``q`` ``(N, K)`` with ``scale`` ``(N,)``, which the kernels
    dequantize in ``dtype`` as ``q * scale``: from the scales alone (the exact absolute
    sum of a row only where the bound ``127 * K * scale`` may overflow)."""
    s = scale.double()
    top = torch.tensor(127.0, dtype=dtype) * scale.to(dtype)  # as Int8Linear's forward does
    row_sum = s * 127 * q.shape[1]
    near = _overflows(row_sum, dtype, dtype)
    if bool(near.any()):
        row_sum[near] = s[near] * q[near].abs().sum(dim=1, dtype=torch.float64)
    flaws = Flaws()
    flaws.check(scale, s * 127, top, s, row_sum, dtype, dtype)
    return flaws


class Int8Linear(nn.Module):
    """``y = x @ (q * scale)^T + bias`` with int8 ``q`` ``(N, K)`` and float32 ``scale``
    ``(N,)``: a quarter of the float32 weight's bytes.

    Shape:
        ``(*, K) -> (*, N)``.
    """

    #: whether it computes exactly the float weight it was made from (int4 of a q4_0
    #: weight: yes; int8: never)
    lossless: bool = False

    qweight: Tensor
    scale: Tensor
    bias: nn.Parameter | None

    def __init__(self, qweight: Tensor, scale: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        frozen = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.register_parameter("bias", frozen)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, release: bool = False) -> Int8Linear:
        return cls(*int8_rows(linear.weight, release=release), linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return frozen_linear(self, x) if needs_input_grad(x) else self.infer(x)

    def infer(self, x: Tensor) -> Tensor:
        """The forward without a gradient (inference; :mod:`zoo.quant.grad` adds one)."""
        rows = x.reshape(-1, self.in_features)  # (B*T, K)
        scale = self.scale.to(x.dtype)
        if x.is_cpu and rows.shape[0] <= _FEW_ROWS:  # decoding: the int8 kernel
            y = torch._weight_int8pack_mm(rows.contiguous(), self.qweight, scale)
        else:  # prefill (or not the CPU): dequantize once (in place: one float copy held),
            y = float_linear(rows, self.qweight.to(x.dtype).mul_(scale[:, None]))  # one product
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def columns(self, start: int, end: int, dtype: torch.dtype) -> Tensor:
        """Input columns ``start:end`` of the dequantized weight, ``(N, end - start)``."""
        return int8_columns(self.qweight, self.scale, start, end, dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class DynamicInt8Linear(Int8Linear):
    """``quantize="int8"``'s layer on the CPU: :class:`Int8Linear`'s weights (float32 scales
    and bias), the input quantized per call (one scale and zero point for the whole input,
    uint8 with reduce_range): PyTorch's dynamic int8 linear (torch.ao's, on FBGEMM) to the
    bit, computed by zoo's kernels from the int8 weights held once
    (:mod:`zoo.kernels.native_int8`). An input holding NaN or infinity, or one the kernels do
    not take, runs FBGEMM itself on the same weights (:func:`zoo.kernels.ops.fbgemm_int8`)."""

    def __init__(self, qweight: Tensor, scale: Tensor, bias: Tensor | None) -> None:
        bias = None if bias is None else bias.detach().float().contiguous()
        super().__init__(qweight.contiguous(), scale.float().contiguous(), bias)
        rows_of(self)  # the row sums the kernels read, summed once now

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Load in place as any module does, then sum the new weights' rows (a one-call
        decoding plan, which checks that the layer's rows are those it read, reads them)."""
        super()._load_from_state_dict(*args, **kwargs)
        self.__dict__.pop(_ROWS, None)
        rows_of(self)

    def infer(self, x: Tensor) -> Tensor:
        y = int8_linear(self, x)
        return fbgemm_int8(x, self.qweight, self.scale, self.bias) if y is None else y

    def extra_repr(self) -> str:
        return super().extra_repr() + " (dynamic)"


def dynamic_int8(
    linear: nn.Linear, *, release: bool = False, rows: tuple[Tensor, Tensor] | None = None
) -> nn.Module:
    """``linear`` as PyTorch's dynamic int8 linear (int8 weights per output row, activations
    quantized per call): zoo's :class:`DynamicInt8Linear` (the weights held once, zoo's
    kernels), or torch.ao's own layer where zoo's kernels are not built. ``rows`` are the
    weight's :func:`int8_rows` when already computed. NaN activations give NaN outputs, as
    in the float layer."""
    q, scale = rows if rows is not None else int8_rows(linear.weight, release=release)
    if _library() is not None:
        return DynamicInt8Linear(q, scale, linear.bias)
    layer = fbgemm_linear()(linear.in_features, linear.out_features, dtype=torch.qint8)
    bias = linear.bias.detach().float() if linear.bias is not None else None
    layer.set_weight_bias(per_channel_int8(q, scale), bias)  # packed for FBGEMM
    return layer


class Int8Embedding(nn.Module):
    """Token embedding over int8 rows with a scale each (those of a tied :class:`Int8Linear`
    head, shared): ``(B, T) -> (B, T, d)`` in ``dtype``."""

    lossless: bool = False

    qweight: Tensor
    scale: Tensor

    def __init__(self, qweight: Tensor, scale: Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.dtype = dtype

    def forward(self, ids: Tensor) -> Tensor:
        rows = F.embedding(ids, self.qweight)  # (B, T, d) int8
        return rows.to(self.dtype) * F.embedding(ids, self.scale[:, None]).to(self.dtype)


class Int4Linear(nn.Module):
    """Grouped asymmetric int4 (``INT4_GROUP`` input features per scale and zero point),
    packed for PyTorch's int4 kernels: an eighth of the float32 weight's bytes.

    Shape:
        ``(*, K) -> (*, N)``, for the shapes :func:`supports_int4` accepts.
    """

    lossless: bool = False

    packed: Tensor
    scales_and_zeros: Tensor
    bias: nn.Parameter | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        self.out_features, self.in_features = w.shape
        groups = w.view(self.out_features, -1, INT4_GROUP)  # (N, K / G, G)
        cuda = w.is_cuda
        dtype = torch.bfloat16 if cuda else torch.float32  # of the kernels' scales and zeros
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)
        scale = ((high - low) / 15).clamp(min=1e-6)  # (N, K / G)
        zero = low + scale * 8  # the kernels dequantize (q - 8) * scale + zero
        #: what quantizing lost (:class:`Flaws`), for a model computing in the weight's dtype
        self.flaws = _int4_flaws(low, high, scale.to(dtype), zero.to(dtype), linear.weight.dtype)
        fits = not (cuda or self.flaws.nonfinite or self.flaws.saturated)
        blocks = q4_0_codes(groups) if fits and linear.weight.dtype == torch.float32 else None
        self.lossless = blocks is not None  # its values were int4 groups (q4_0's) already
        if blocks is not None:  # held as they are: (q - 8) * d + 0
            q, scale = blocks
            zero = torch.zeros_like(scale)
        else:
            q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
            q = q.to(torch.int32)
        q = q.view(self.out_features, self.in_features)
        if cuda:
            pairs = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)  # (N, K / 2)
            packed = torch._convert_weight_to_int4pack(pairs, _INNER_K_TILES)
        else:
            packed = torch._convert_weight_to_int4pack_for_cpu(q, _INNER_K_TILES)
        self.register_buffer("packed", packed)
        zeros = torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous()  # (K/G, N, 2)
        self.register_buffer("scales_and_zeros", zeros.to(dtype))
        bias = linear.bias
        self.bias = nn.Parameter(bias.detach(), requires_grad=False) if bias is not None else None

    #: Training multiplies many rows by the dequantized weight (the CPU int4 kernel is
    #: several times slower than a float product there): :func:`~zoo.quant.grad.frozen_linear`.
    slow_on_many_rows = True

    def forward(self, x: Tensor) -> Tensor:
        return frozen_linear(self, x) if needs_input_grad(x) else self.infer(x)

    def infer(self, x: Tensor) -> Tensor:
        """The forward without a gradient (inference; :mod:`zoo.quant.grad` adds one)."""
        rows = x.reshape(-1, self.in_features)  # (B*T, K)
        zeros = self.scales_and_zeros
        mm = torch._weight_int4pack_mm_for_cpu if x.is_cpu else torch._weight_int4pack_mm
        y = mm(rows.to(zeros.dtype), self.packed, INT4_GROUP, zeros)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def columns(self, start: int, end: int, dtype: torch.dtype) -> Tensor:
        """Input columns ``start:end`` of the weight as the kernel dequantizes it."""
        span = (start, end)
        return int4_columns(
            self.packed, self.scales_and_zeros, INT4_GROUP, self.in_features, span, dtype
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4"


def _int4_flaws(
    low: Tensor, high: Tensor, scale: Tensor, zero: Tensor, out_dtype: torch.dtype
) -> Flaws:
    """:class:`Flaws` of int4 groups of weights from ``low`` to ``high`` (``(N, K / G)``),
    coded ``low + q * step`` with ``q`` in 0..15, which the kernels dequantize as ``(q - 8) *
    scale + zero`` with the ``scale`` and ``zero`` they hold (in their dtype), into outputs
    of ``out_dtype``."""
    step = ((high - low) / 15).clamp(min=1e-6)  # float32: eps * |exact| covers its rounding
    codes = torch.tensor([0.0, 15.0])  # the extreme codes
    exact = low[..., None] + codes * step[..., None]  # (N, K / G, 2)
    kernel = (codes - 8).to(scale.dtype) * scale[..., None] + zero[..., None]
    row_sum = INT4_GROUP * kernel.abs().amax(dim=-1).sum(dim=-1, dtype=torch.float64)  # a bound
    flaws = Flaws()
    flaws.check(
        torch.stack((low, high)), exact, kernel, step[..., None], row_sum, scale.dtype, out_dtype
    )
    return flaws


def supports_int4(linear: nn.Linear) -> bool:
    """Whether the int4 kernels take this layer's shape (the CUDA one packs the input
    features in tiles of ``_INNER_K_TILES * 16``, the CPU one packs output rows 16 at a
    time); others are quantized to int8."""
    n, k = linear.weight.shape
    return k % (_INNER_K_TILES * 16) == 0 and k % INT4_GROUP == 0 and n % 16 == 0


def quantize_(model: nn.Module, mode: str, *, release: bool = False) -> nn.Module:
    """Replace, in place, every :class:`~zoo.nn.Linear` (and plain ``torch.nn.Linear``) of
    ``model`` by its ``mode`` (:data:`QUANTIZE_MODES`; int4 where the kernels take the shape,
    int8 elsewhere) version,
    and a token embedding tied to the head by an :class:`Int8Embedding` over int8 rows (shared
    with a weight-only head). Weights are quantized one at a time; with ``release`` (weights
    memory-mapped from a file, as :func:`zoo.load` gives them) their float pages are given
    back as it goes, so the float model is never resident. The quantized layers stay frozen
    but pass gradients to their inputs (:mod:`zoo.quant.grad`), so adapters attached
    after quantizing train on top (QLoRA); ``"int8"`` on the CPU keeps torch.ao's dynamic
    int8 layer for training too, its backward through the dequantized int8 weight.

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {mode!r}")
    tied = _tied_embedding(model)
    names = {id(m): n for n, m in model.named_modules()}
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    nonfinite: list[str] = []
    saturated: list[str] = []
    unknown: list[str] = []
    for owner in list(model.modules()):
        for name, child in list(owner.named_children()):
            if not quantizable(child):
                if isinstance(child, nn.Linear):
                    unknown.append(f"{names[id(child)]} ({type(child).__name__})")
                continue
            new, flaws = _quantized(child, mode, tied, release)
            if flaws.nonfinite or flaws.saturated:
                (nonfinite if flaws.nonfinite else saturated).append(f"{names[id(child)]}.weight")
            setattr(owner, name, new)
    _warn(
        nonfinite, "hold NaN or infinite values", f"the {mode} model's outputs will not be finite"
    )
    _warn(
        saturated,
        f"saturate when quantized to {mode}",
        "once dequantized as the kernels compute, a value is off by more than one "
        "quantization step, or a row's outputs overflow for inputs of magnitude "
        f"{input_headroom(dtype):.2g} (weights near the limit of {dtype}, such as ±3e38); "
        "the quantized model's outputs will not be finite or not close to the float "
        "model's. Check these weights",
    )
    _warn(
        unknown,
        f"of a torch.nn.Linear subclass zoo does not know stay {dtype}",
        "a subclass may compute otherwise than its weight says. Build them as zoo.nn.Linear "
        "(or plain torch.nn.Linear) to have them quantized",
        whose="linear layer(s)",
    )
    model.quantized = mode  # type: ignore[assignment]
    return model


def quantizable(module: nn.Module) -> TypeGuard[nn.Linear]:
    """Whether :func:`quantize_` replaces ``module``: a :class:`~zoo.nn.Linear` (or a
    subclass of it) or a plain ``torch.nn.Linear`` (the same parameters and forward)."""
    return isinstance(module, Linear) or type(module) is nn.Linear


def _quantized(
    linear: nn.Linear,
    mode: str,
    tied: tuple[nn.Module, nn.Embedding, str] | None,
    release: bool,
) -> tuple[nn.Module, Flaws]:
    """``linear`` quantized for ``mode`` and the :class:`Flaws` of its weights: int4 where
    the kernels take its shape (and it is not tied to the embedding), else int8 (read once,
    chunk by chunk): dynamic for ``mode="int8"`` on float32 CPU weights, weight-only
    otherwise. A token embedding tied to it (``tied``) becomes an :class:`Int8Embedding`
    over the same rows."""
    weight = linear.weight
    if mode == "int4" and supports_int4(linear) and (tied is None or weight is not tied[1].weight):
        four = Int4Linear(linear)
        if release:
            release_pages(weight)
        return four, four.flaws
    q, scale, flaws = _int8_rows(weight, release=release)
    dynamic = mode == "int8" and weight.is_cpu and weight.dtype == torch.float32
    new = dynamic_int8(linear, rows=(q, scale)) if dynamic else Int8Linear(q, scale, linear.bias)
    if tied is not None and weight is tied[1].weight:  # shares the int8 rows
        setattr(tied[0], tied[2], Int8Embedding(q, scale, weight.dtype))
    return new, flaws


def _warn(weights: list[str], what: str, consequence: str, *, whose: str = "weight(s)") -> None:
    """A ``RuntimeWarning`` naming (up to five of) ``weights`` (or other ``whose``) that
    ``what``, unless none."""
    if weights:
        shown = ", ".join(weights[:5]) + (", ..." if len(weights) > 5 else "")
        warnings.warn(
            f"{len(weights)} {whose} {what} ({shown}); {consequence}",
            RuntimeWarning,
            stacklevel=3,
        )


def _tied_embedding(model: nn.Module) -> tuple[nn.Module, nn.Embedding, str] | None:
    """``(owner, embedding, attribute)`` of an embedding whose weight a Linear shares."""
    linears = {id(m.weight) for m in model.modules() if quantizable(m)}
    for owner in model.modules():
        for name, child in owner.named_children():
            if isinstance(child, nn.Embedding) and id(child.weight) in linears:
                return owner, child, name
    return None
