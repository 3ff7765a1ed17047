"""``nn.Linear`` with a faster CPU inference kernel.

On CPU, PyTorch's default ``linear`` for a single row (batch-1 decoding) runs a BLAS gemv that
keeps one core busy and reads weights at a fraction of the memory bandwidth. oneDNN's linear
kernel (the one ``torch.compile`` uses on CPU) spreads the same product over every core: about
1.5x faster decoding on a 2-core machine, and faster prefill too. It is used only for float32
inference on CPU (no gradient needed) with weights of at least 1 MiB; everything else goes
through ``F.linear``. Parameters and state dicts are exactly those of ``nn.Linear``. Under
``torch.compile`` the oneDNN kernel is called through the custom op ``zoo::onednn_linear``,
which the compiler calls as an opaque kernel (it cannot trace the bare oneDNN call).

bfloat16 on a CPU without native bfloat16 matrix units (no AVX512-BF16 or AMX, e.g. an AVX2
machine): PyTorch's bfloat16 matrix product there is a generic fallback, 4x slower at 128 rows
than widening the weights to float32 per call. From ``_UPCAST_ROWS`` rows on, the product runs
in float32 and the result is rounded back to bfloat16: the weights stay bfloat16 in memory, and
the accumulation is float32 either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Linear", "linear"]


def _onednn_linear() -> Callable[..., Any] | None:
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):  # not built into this torch
        return None


_ONEDNN = _onednn_linear()


@torch.library.custom_op("zoo::onednn_linear", mutates_args=())
def _onednn_linear_op(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """oneDNN's linear kernel as an op ``torch.compile`` can call (eager calls it directly)."""
    assert _ONEDNN is not None  # only reached where `linear` chose oneDNN
    return _ONEDNN(x, weight, bias, "none", [], "")


@_onednn_linear_op.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


#: Whether this CPU multiplies bfloat16 matrices natively (oneDNN's own check).
_NATIVE_BF16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
#: From this many rows on, widening the weights and multiplying in float32 beats the bfloat16
#: fallback (a gpt2-124m forward on a 2-core AVX2 machine, bfloat16 vs widened: 8 rows 123 vs
#: 177 ms, 16 rows 252 vs 205 ms, 32 rows 486 vs 211 ms, 128 rows 1787 vs 428 ms).
_UPCAST_ROWS = 16
#: Smaller weights (under 1 MiB of float32) go to ``F.linear``: oneDNN's call costs ~40 us
#: more, which a small matrix does not earn back (a 12-layer decoder of width 64 decodes a
#: token in 3.0 ms this way, 5.4 ms through oneDNN).
_MIN_ONEDNN = 1 << 18


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear``, through oneDNN for float32 CPU inference where that kernel exists, and
    in float32 for bfloat16 products of several rows on a CPU without native bfloat16."""
    if (
        x.is_cpu
        and x.dtype is torch.bfloat16
        and weight.dtype is torch.bfloat16
        and not _NATIVE_BF16
        and x.numel() >= _UPCAST_ROWS * x.shape[-1]
    ):
        wide = linear(x.float(), weight.float(), None if bias is None else bias.float())
        return wide.to(torch.bfloat16)
    if (
        _ONEDNN is not None
        and x.is_cpu
        and x.dtype is torch.float32
        and weight.dtype is torch.float32
        and weight.numel() >= _MIN_ONEDNN
        and not (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
    ):
        if torch.compiler.is_compiling():
            return _onednn_linear_op(x, weight, bias)
        return _ONEDNN(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` whose forward uses :func:`linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
