"""zoo's C kernels as PyTorch operators, so that compiled code calls them:
``torch.ops.zoo.gemv_f32``, ``layer_norm``, ``rms_norm``, ``attend_one`` (which also writes
the key/value cache: its caches are mutated arguments) and ``linear_int8``.

Why: ``torch.compile`` cannot trace a ctypes call, so compiled code could not call zoo's
kernels; an operator is one opaque call in its graph, with a fake function that gives the
result's shape and dtype while tracing. :mod:`zoo.kernels.native` and
:mod:`zoo.kernels.native_int8` call these operators while compiling, and the ``*_kernel``
functions below directly otherwise (eager decoding pays no dispatcher).

Each operator takes tensors, never addresses, and computes its result for whatever it is
handed: on zoo's kernel where the kernel takes the tensors (plain CPU tensors of the
kernel's dtype and layout, inside their storage: :func:`zoo.kernels.native_load._plain`; one
row; the kernels built and allowed), with PyTorch's ops otherwise (a tensor subclass, another
dtype, device or layout, several rows, no kernels), so it is never wrong and never hands C an
address C should not read. The ``*_kernel`` functions are the only place that hands C the
addresses of these tensors; each returns ``None`` where its kernel does not take them.

The operators are registered with ``torch.library.Library``'s ``define`` and ``impl``, not
``torch.library.custom_op``, whose per-call wrapping costs several times the dispatcher's
own (``benchmarks/RESULTS-native-ops.md``); they have no autograd formula (zoo calls them
without gradients). Importing this module registers them.
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .native_load import _address, _library, _plain, _row, _rows, _vector

__all__ = [
    "attend_memory_kernel",
    "attend_one_kernel",
    "fbgemm_int8",
    "gemv_f32_kernel",
    "layer_norm_kernel",
    "linear_int8_kernel",
    "per_channel_int8",
    "rms_norm_kernel",
]

#: The most rows of ``x`` :func:`gemv_f32_kernel` takes (one pass over the weights for all of
#: them); from about this many on, oneDNN's matrix product is as fast (docs/benchmarks.md).
FEW_ROWS = 8

_LIB = torch.library.Library("zoo", "FRAGMENT")  # the namespace zoo::onednn_linear shares
_IMPL_KEY = "CompositeExplicitAutograd"  # every device: PyTorch's ops where C does not apply

SCHEMAS = {
    "gemv_f32": "gemv_f32(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
    "layer_norm": "layer_norm(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor",
    "rms_norm": "rms_norm(Tensor x, Tensor weight, float eps, float offset) -> Tensor",
    "attend_one": (
        "attend_one(Tensor q, Tensor k, Tensor v, Tensor(a!) cache_k, Tensor(b!) cache_v, "
        "SymInt start, float scale) -> Tensor"
    ),
    "linear_int8": (
        "linear_int8(Tensor x, Tensor q, Tensor scale, Tensor colsum, Tensor? bias) -> Tensor"
    ),
}


def gemv_f32_kernel(
    lib: ctypes.CDLL, x: Tensor, weight: Tensor, bias: Tensor | None
) -> Tensor | None:
    """``F.linear(x, weight, bias)`` for contiguous float32 ``x`` ``(*, K)`` of one to
    :data:`FEW_ROWS` rows, a contiguous ``(N, K)`` weight and an ``(N,)`` bias or none, all
    plain: ``zoo_gemv_f32`` for one row, ``zoo_gemm_f32`` (the same bits per row) for more;
    ``None`` otherwise."""
    if weight.dim() != 2:
        return None
    n, k = weight.shape
    rows = _rows(x, FEW_ROWS)
    if not (
        rows
        and x.shape[-1] == k
        and weight.is_contiguous()
        and _plain(weight)
        and (bias is None or _vector(bias, n))
    ):
        return None
    y = x.new_empty((*x.shape[:-1], n))  # float32, as x is
    if rows == 1:
        lib.zoo_gemv_f32(
            weight.data_ptr(), x.data_ptr(), _address(bias), y.data_ptr(), n, k,
            torch.get_num_threads(),
        )  # fmt: skip
    else:
        lib.zoo_gemm_f32(
            weight.data_ptr(), x.data_ptr(), _address(bias), y.data_ptr(), rows, n, k,
            torch.get_num_threads(),
        )  # fmt: skip
    return y


def layer_norm_kernel(
    lib: ctypes.CDLL, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor | None:
    """``F.layer_norm`` over the last dimension on ``zoo_layer_norm_f32`` for one contiguous
    float32 row and a ``(d,)`` weight and bias (or none), all plain; ``None`` otherwise."""
    if x.dim() == 0:
        return None
    d = x.shape[-1]
    if not _row(x) or not all(t is None or _vector(t, d) for t in (weight, bias)):
        return None
    y = torch.empty_like(x)
    lib.zoo_layer_norm_f32(x.data_ptr(), _address(weight), _address(bias), y.data_ptr(), d, eps)
    return y


def rms_norm_kernel(
    lib: ctypes.CDLL, x: Tensor, weight: Tensor, eps: float, offset: float
) -> Tensor | None:
    """``x / sqrt(mean(x^2) + eps) * (weight + offset)`` on ``zoo_rms_norm_f32`` for one
    contiguous float32 row and a ``(d,)`` weight, both plain; ``None`` otherwise."""
    if x.dim() == 0:
        return None
    d = x.shape[-1]
    if not _row(x) or not _vector(weight, d):
        return None
    y = torch.empty_like(x)
    lib.zoo_rms_norm_f32(x.data_ptr(), weight.data_ptr(), y.data_ptr(), d, eps, offset)
    return y


def attend_one_kernel(
    lib: ctypes.CDLL,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cache_k: Tensor,
    cache_v: Tensor,
    start: int,
    scale: float,
) -> Tensor | None:
    """One new token's attention for each of ``B`` sequences on ``zoo_attend_rows_f32``,
    which first stores ``k`` and ``v`` at position ``start`` of the caches (see
    :func:`zoo.kernels.native.attend_one`), for plain float32 tensors of the shapes it takes,
    heads whose features are contiguous and caches that are one contiguous block each;
    ``None`` (nothing written) otherwise.

    Shape:
        ``q (B, H, 1, hd)``, ``k``/``v`` ``(B, H_kv, 1, hd)``, caches ``(B, H_kv, max_len,
        hd)`` -> ``(B, 1, H * hd)``.
    """
    if q.dim() != 4 or q.shape[2] != 1 or not 0 <= start < cache_k.shape[2]:
        return None  # (the shapes below hold k, v and the caches to four dimensions)
    tensors = (q, k, v, cache_k, cache_v)
    rows, heads, hd = q.shape[0], q.shape[1], q.shape[3]
    kv_heads, max_len = k.shape[1], cache_k.shape[2]
    if not (
        all(t.stride(-1) == 1 and _plain(t) for t in tensors)
        and cache_k.is_contiguous()
        and cache_v.is_contiguous()
        and cache_k.shape == cache_v.shape == (rows, kv_heads, max_len, hd)
        and k.shape == v.shape == (rows, kv_heads, 1, hd)
        and kv_heads > 0
        and heads % kv_heads == 0
    ):
        return None
    y = q.new_empty((rows, 1, heads * hd))  # float32, as q is
    lib.zoo_attend_rows_f32(
        q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
        v.data_ptr(), v.stride(0), v.stride(1), cache_k.data_ptr(), cache_v.data_ptr(),
        cache_k.stride(0), cache_k.stride(1), hd, start, start + 1, None, rows, heads, kv_heads,
        hd, scale, y.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return y


def attend_memory_kernel(
    lib: ctypes.CDLL, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, scale: float
) -> Tensor | None:
    """One query per sequence attending to its own keys and values (a decoder's
    cross-attention to its encoder's output) on ``zoo_attend_rows_f32``, positions with
    ``keep`` ``False`` left out; for plain float32 tensors whose heads' features are
    contiguous, ``k`` and ``v`` laid out alike, and a contiguous boolean ``keep``; ``None``
    otherwise.

    Shape:
        ``q (B, H, 1, hd)``, ``k``/``v`` ``(B, H_kv, S, hd)``, ``keep`` ``(B, S)`` ->
        ``(B, 1, H * hd)``.
    """
    if q.dim() != 4 or k.dim() != 4 or q.shape[2] != 1:
        return None
    rows, heads, _, hd = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    if not (
        all(t.stride(-1) == 1 and _plain(t) for t in (q, k, v))
        and k.shape == v.shape == (rows, kv_heads, length, hd)
        and k.stride() == v.stride()
        and length > 0
        and kv_heads > 0
        and heads % kv_heads == 0
        and (keep is None or _key_mask(keep, rows, length))
    ):
        return None
    y = q.new_empty((rows, 1, heads * hd))  # float32, as q is
    lib.zoo_attend_rows_f32(
        q.data_ptr(), q.stride(0), q.stride(1), None, 0, 0, None, 0, 0, k.data_ptr(),
        v.data_ptr(), k.stride(0), k.stride(1), k.stride(2), 0, length, _address(keep), rows,
        heads, kv_heads, hd, scale, y.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return y


def _key_mask(keep: Tensor, rows: int, length: int) -> bool:
    """Whether ``keep`` is a plain contiguous boolean ``(rows, length)`` mask on the CPU."""
    return keep.shape == (rows, length) and keep.is_contiguous() and _plain(keep, torch.bool)


def linear_int8_kernel(
    lib: ctypes.CDLL, x: Tensor, q: Tensor, scale: Tensor, colsum: Tensor, bias: Tensor | None
) -> Tensor | None:
    """A dynamic int8 linear (FBGEMM's numbers, :mod:`zoo.kernels.native_int8`) of float32
    ``x`` ``(*, K)``, any number of rows, and the rows it reads
    (:class:`~zoo.kernels.native_int8.Int8Rows`: ``q`` ``(N, K)`` int8, ``scale`` ``(N,)``
    float32, ``colsum`` ``(N,)`` int32, ``bias`` ``(N,)`` float32 or none, contiguous), all
    plain: ``zoo_linear_int8`` (``zoo_gemv_int8`` for one row); ``None`` otherwise, and where
    ``x`` holds NaN or infinity (which the kernel leaves to FBGEMM)."""
    if not _plain(x) or x.dim() < 1 or q.dim() != 2:
        return None
    if not q.is_contiguous() or not _plain(q, torch.int8):
        return None
    n, k = q.shape
    parts = [(scale, torch.float32), (colsum, torch.int32)]
    if bias is not None:
        parts.append((bias, torch.float32))
    if not all(t.shape == (n,) and t.is_contiguous() and _plain(t, dtype) for t, dtype in parts):
        return None
    if x.shape[-1] != k or k == 0:
        return None
    x = x.contiguous()
    y = x.new_empty((*x.shape[:-1], n))  # float32, as x is
    rows = x.numel() // k
    if rows == 0:
        return y
    status = lib.zoo_linear_int8(
        x.data_ptr(), q.data_ptr(), scale.data_ptr(), colsum.data_ptr(), _address(bias),
        y.data_ptr(), rows, n, k, torch.get_num_threads(),
    )  # fmt: skip
    return y if status == 0 else None


# The operators' implementations: zoo's kernel where it takes the tensors, PyTorch's ops
# (the formulas zoo's layers compute without the kernels) otherwise.


def _gemv_f32(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    lib = _library()
    y = None if lib is None else gemv_f32_kernel(lib, x, weight, bias)
    return F.linear(x, weight, bias) if y is None else y


def _layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    lib = _library()
    y = None if lib is None else layer_norm_kernel(lib, x, weight, bias, eps)
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps) if y is None else y


def _rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float) -> Tensor:
    lib = _library()
    y = None if lib is None else rms_norm_kernel(lib, x, weight, eps, offset)
    if y is not None:
        return y
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if offset == 0.0:  # zoo.nn.RMSNorm's order: scaled in the input's dtype
        return (weight * h.to(x.dtype)).contiguous()
    return (h * (offset + weight.float())).to(x.dtype).contiguous()  # UnitOffsetRMSNorm's


def _attend_one(
    q: Tensor, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, start: int, scale: float
) -> Tensor:
    _attention_shapes(q, k, v, cache_k, cache_v, start)
    lib = _library()
    y = None if lib is None else attend_one_kernel(lib, q, k, v, cache_k, cache_v, start, scale)
    if y is not None:
        return y
    cache_k.narrow(2, start, 1).copy_(k)  # as zoo.runtime.cache.LayerCache.write stores them
    cache_v.narrow(2, start, 1).copy_(v)
    keys, values = cache_k.narrow(2, 0, start + 1), cache_v.narrow(2, 0, start + 1)
    gqa = q.shape[1] != k.shape[1]
    y = F.scaled_dot_product_attention(q, keys, values, scale=scale, enable_gqa=gqa)
    return y.transpose(1, 2).reshape(q.shape[0], 1, q.shape[1] * q.shape[3])  # (B, 1, H * hd)


def _linear_int8(
    x: Tensor, q: Tensor, scale: Tensor, colsum: Tensor, bias: Tensor | None
) -> Tensor:
    lib = _library()
    y = None if lib is None else linear_int8_kernel(lib, x, q, scale, colsum, bias)
    return fbgemm_int8(x, q, scale, bias) if y is None else y


def per_channel_int8(q: Tensor, scale: Tensor) -> Tensor:
    """int8 rows ``q`` ``(N, K)`` with ``scale`` ``(N,)`` as the quantized tensor torch.ao's
    int8 linear packs for FBGEMM (per channel, zero points 0)."""
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch 2.13 marks quantized tensors as to be replaced
        warnings.simplefilter("ignore", UserWarning)  # by torchao, whose CPU int8 needs compile
        return torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)


def fbgemm_int8(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
    """What zoo's dynamic int8 layer computes, on FBGEMM (torch.ao's dynamic quantized
    linear): the weight packed from ``q`` and ``scale`` (zero points 0) for this call only,
    the input quantized with ``reduce_range``, NaN where FBGEMM refuses an input holding
    NaN. The reference zoo's kernels are tested against, and where they do not run (an input
    holding NaN or infinity, no kernels), what the layer computes."""
    packed = torch.ops.quantized.linear_prepack(
        per_channel_int8(q, scale), None if bias is None else bias.float()
    )
    try:
        y = torch.ops.quantized.linear_dynamic(x.float(), packed, reduce_range=True)
    except RuntimeError as exc:  # as zoo.quant.layers' dynamic int8 layer answers it
        if "ChooseQuantizationParams" not in str(exc):
            raise
        return x.new_full((*x.shape[:-1], q.shape[0]), float("nan"))
    return y.to(x.dtype)


# Shapes for tracing (fake tensors): the results' shapes and dtypes, the same checks.


def _linear_fake(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _norm_fake(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    return x.new_empty(x.shape)


def _rms_fake(x: Tensor, weight: Tensor, eps: float, offset: float) -> Tensor:
    dtype = torch.promote_types(weight.dtype, x.dtype) if offset == 0.0 else x.dtype
    return x.new_empty(x.shape, dtype=dtype)


def _attend_fake(
    q: Tensor, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, start: int, scale: float
) -> Tensor:
    _attention_shapes(q, k, v, cache_k, cache_v, start)
    return q.new_empty((q.shape[0], 1, q.shape[1] * q.shape[3]))


def _int8_fake(x: Tensor, q: Tensor, scale: Tensor, colsum: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))


def _attention_shapes(
    q: Tensor, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, start: int
) -> None:
    """Raise ``ValueError`` unless the tensors are one new token of each of ``B`` sequences
    and their caches: ``q`` ``(B, H, 1, hd)``, ``k``/``v`` ``(B, H_kv, 1, hd)``, caches
    ``(B, H_kv, max_len, hd)``, ``H`` a multiple of ``H_kv``, ``0 <= start < max_len``."""
    shapes = [tuple(t.shape) for t in (q, k, v, cache_k, cache_v)]
    if any(len(shape) != 4 for shape in shapes):
        raise ValueError(f"zoo::attend_one takes 4-dimensional tensors, got shapes {shapes}")
    (b, heads, t, hd), kv, _, cache, _ = shapes
    kv_heads = kv[1]
    if not (
        t == 1
        and kv_heads > 0
        and heads % kv_heads == 0
        and k.shape == v.shape == (b, kv_heads, 1, hd)
        and cache_k.shape == cache_v.shape == (b, kv_heads, cache[2], hd)
    ):
        raise ValueError(
            "zoo::attend_one takes one new token of each sequence: q (B, H, 1, hd), k and v "
            f"(B, H_kv, 1, hd), caches (B, H_kv, max_len, hd) with H a multiple of H_kv; got "
            f"q, k, v, cache_k, cache_v of shapes {shapes}"
        )
    if not 0 <= start < cache[2]:
        raise ValueError(
            f"zoo::attend_one writes position {start}, outside the caches' {cache[2]} positions"
        )


_OPERATORS: dict[str, tuple[Any, Any]] = {
    "gemv_f32": (_gemv_f32, _linear_fake),
    "layer_norm": (_layer_norm, _norm_fake),
    "rms_norm": (_rms_norm, _rms_fake),
    "attend_one": (_attend_one, _attend_fake),
    "linear_int8": (_linear_int8, _int8_fake),
}


def _register() -> None:
    for name, (implementation, fake) in _OPERATORS.items():
        _LIB.define(SCHEMAS[name])
        _LIB.impl(name, implementation, _IMPL_KEY)
        torch.library.register_fake(f"zoo::{name}", fake, lib=_LIB)


_register()
