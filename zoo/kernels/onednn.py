"""oneDNN's CPU linear kernel for zoo's linear layers (:class:`zoo.nn.linear.OneDNNLinear`).

Two things PyTorch's default ``linear`` leaves on the table on CPU, both decided by oneDNN:

- float32: for a single row (batch-1 decoding) PyTorch runs a BLAS gemv that keeps one core
  busy; oneDNN's linear kernel (the one ``torch.compile`` uses on CPU) spreads the product
  over every core: faster decoding on a machine of several cores, and faster prefill too.
  Used for weights of at least 1 MiB, without gradients.
- bfloat16 on a CPU without native bfloat16 matrix units (no AVX512-BF16 or AMX, e.g. an AVX2
  machine): PyTorch's bfloat16 matrix product there is a generic fallback, several times
  slower at a prefill's rows than widening the weights to float32 per call (the figures:
  docs/benchmarks.md, "Figures behind design choices"). From ``UPCAST_ROWS`` rows on, the
  product runs in float32 and the result is rounded back to bfloat16 (the weights stay
  bfloat16 in memory; the accumulation is float32 either way).

Both rest on private PyTorch ops (``torch.ops.mkldnn._linear_pointwise`` and
``_is_mkldnn_bf16_supported``); this module is the only one that touches them, and only when
asked: :func:`zoo.nn.linear.use_onednn` turns a model's :class:`zoo.nn.Linear` layers on the
CPU into :class:`~zoo.nn.linear.OneDNNLinear` in place (whose forward is :func:`cpu_linear`), the
way ``quantize=`` swaps layers. ``zoo.build`` and
``zoo.load`` apply it to CPU models (``onednn=False`` keeps PyTorch's path); a torch without
oneDNN gets PyTorch's path and nothing else changes. Parameters and state dicts stay those of
``nn.Linear``; anything else (gradients enabled, float16, another device) computes
``F.linear``. Under ``torch.compile`` the kernel is called through the custom op
``zoo::onednn_linear``, registered on first use, which the compiler calls as an opaque kernel
(it cannot trace the bare oneDNN call).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from . import native

__all__ = [
    "MIN_WEIGHTS",
    "UPCAST_ROWS",
    "available",
    "cpu_linear",
    "native_bf16",
    "prepare_compile",
]

#: Smaller weights (under 1 MiB of float32) keep ``F.linear``: oneDNN's call costs a fixed
#: amount more, which a small matrix does not earn back (a small decoder decodes slower
#: through oneDNN: docs/benchmarks.md, "Figures behind design choices").
MIN_WEIGHTS = 1 << 18


@functools.cache
def _kernel() -> Callable[..., Any] | None:
    """The private oneDNN linear op, or ``None`` where this torch lacks it."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):  # not built into this torch
        return None


def available() -> bool:
    """Whether this torch has oneDNN's linear kernel."""
    return _kernel() is not None


def _registered() -> bool:
    """Registers the custom op ``zoo::onednn_linear`` that compiled code calls the kernel
    through (only while compiling)."""
    return _compilable() is not None


def prepare_compile() -> None:
    """Let ``torch.compile`` trace :func:`cpu_linear` in one graph: it runs the checks below
    once, as constants, instead of tracing into them (``torch.backends.mkldnn.is_available``
    broke the graph at every layer). Called where zoo compiles, not at import: marking them
    imports torch's compiler, whose memory an eager load must not pay."""
    for check in (available, native_bf16, _registered):
        torch.compiler.assume_constant_result(check)  # marks the function itself


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (oneDNN's own check)."""
    return bool(
        torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


#: From this many rows on, widening bfloat16 to float32 beats the bfloat16 fallback (at 8
#: rows the fallback was faster, from 16 on widening, by more the more rows: a gpt2-124m
#: forward on an AVX2 machine, docs/benchmarks.md, "Figures behind design choices").
UPCAST_ROWS = 16


def cpu_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear``, through oneDNN for float32 CPU inference with weights of at least
    :data:`MIN_WEIGHTS` elements, and in float32 for bfloat16 products of :data:`UPCAST_ROWS`
    rows or more on a CPU without native bfloat16."""
    if x.dtype is torch.bfloat16:
        return _bf16_linear(x, weight, bias)
    if (
        available()
        and x.is_cpu
        and x.dtype is torch.float32
        and weight.dtype is torch.float32
        and weight.numel() >= MIN_WEIGHTS
        and not (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
    ):
        row = native.linear(x, weight, bias)  # one row (batch-1 decoding): zoo's kernel
        if row is not None:  # (under torch.compile: its custom operator, zoo::gemv_f32)
            return row
        if torch.compiler.is_compiling() and _registered():
            return torch.ops.zoo.onednn_linear(x, weight, bias)
        kernel = _kernel()
        assert kernel is not None  # available() found it
        return kernel(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _bf16_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """:func:`cpu_linear` of bfloat16 ``x``: widened to float32 (and rounded back) from
    :data:`UPCAST_ROWS` rows on, on a CPU without native bfloat16; ``F.linear`` otherwise."""
    if (
        x.is_cpu
        and weight.dtype is torch.bfloat16
        and not native_bf16()
        and x.numel() >= UPCAST_ROWS * x.shape[-1]
    ):
        wide = cpu_linear(x.float(), weight.float(), None if bias is None else bias.float())
        return wide.to(torch.bfloat16)
    return F.linear(x, weight, bias)


@functools.cache
def _compilable() -> Callable[[Tensor, Tensor, Tensor | None], Tensor]:
    """The kernel as the custom op ``zoo::onednn_linear`` (registered once, when first
    compiled), so ``torch.compile`` calls it as one opaque kernel."""
    kernel = _kernel()

    @torch.library.custom_op("zoo::onednn_linear", mutates_args=())
    def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        assert kernel is not None  # only reached where cpu_linear found the kernel
        return kernel(x, weight, bias, "none", [], "")

    @onednn_linear.register_fake
    def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    return onednn_linear
