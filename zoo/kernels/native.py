"""zoo's own CPU kernels for batch-1 decoding: one input row (or a few: a beam search's beams)
times a weight matrix, and the layer norm, RMSNorm and attention of one new token (of one
sequence or a few, and a decoder's cross-attention to its encoder's output).

Why: a batch-1 decoding step reads every weight once, so its speed is the rate at which its
matrix-vector products stream the weights from memory. PyTorch's kernels for a single row
(oneDNN's, MKL's, OpenBLAS's, torch.compile's fused multiply-and-sum) stream well below what
the cores can read, while a plain ``sum`` over the same weights, and :func:`linear`, reach it
(``benchmarks/bench_native.py``; docs/benchmarks.md, 'Figures behind design choices', has the
figures). No kernel
shipped with PyTorch or its usual companions streams at that rate, so zoo carries a small one
in C (``zoo/kernels/_native.c``), built by ``pip install`` where a C compiler with OpenMP is
found.

The kernels are optional at every level: a missing build, a CPU without AVX2 and FMA, a
PyTorch whose threads are not OpenMP's, or ``ZOO_NATIVE_KERNELS=0``
(:class:`zoo.settings.Settings`) leave PyTorch's kernels in place, and :func:`available`
says which. They run on PyTorch's own OpenMP thread team (the library links
``libgomp.so.1``, which resolves to the copy PyTorch loaded;
:func:`zoo.kernels.native_load._one_openmp` checks that the thread count set with
``torch.set_num_threads`` reaches it, which a second OpenMP runtime would not), so they never
compete with PyTorch's threads, and ``torch.set_num_threads`` (and
:class:`zoo.kernels.threads.DecodeThreads`) size them.

The same step's small operations (about a hundred per gpt2-124m token) cost far more inside
the step than alone: streaming the weights evicts PyTorch's code and data from the caches,
so a layer norm or one layer's attention runs several times slower there than when timed
alone. :func:`layer_norm`, :func:`rms_norm` and :func:`attend_one` (which also writes
the key/value cache, one call where PyTorch took nine) do that work in a fraction of the
calls; :mod:`zoo.nn.norms` and :mod:`zoo.nn.attention` use them for one float32 row without
gradients, masks or soft caps.

What C is handed: only plain tensors (exactly ``torch.Tensor`` or ``nn.Parameter``; a
subclass such as DTensor, torchao's tensors or ``TwoTensor`` may keep its data elsewhere and
report float32, the CPU, contiguous and address 0) of the kernel's dtype on the CPU, whose
elements lie at a nonzero address inside their storage
(:func:`zoo.kernels.native_load._plain`); each function here returns ``None`` for anything
else and its caller runs PyTorch's. The library must describe its C structures as
:mod:`zoo.kernels.native_abi` mirrors them (``zoo_abi``), or it is refused with a warning that
says to rebuild (a stale build would read them wrongly). :mod:`zoo.kernels.native_load` opens
and checks the library; :mod:`zoo.kernels.ops` holds the calls into C.

Under ``torch.compile`` each function decides only on what a traced (fake) tensor has:
dtype, device, shapes, strides and contiguity, and whether the kernels run here (read once
per trace, as a constant); where the kernel applies it returns the custom operator's result
(``torch.ops.zoo.layer_norm`` and the others, :mod:`zoo.kernels.ops`), one opaque call in
the compiled graph, which checks the real tensors when it runs and computes with PyTorch's
ops where its kernel does not take them. Eagerly it calls the operator's kernel function
directly, without the dispatcher: the same C call with the same checks.

Numerics: each output of :func:`linear` is one dot product over a contiguous weight row,
summed in a fixed order by one thread in float32 (eight lanes, then the lanes, then the
bias), so it does not depend on the thread count. It differs from oneDNN's in the last bits,
as two BLAS libraries do. The norms and the attention agree with PyTorch's to float32
rounding (``tests/test_native_ops.py``); greedy tokens stay the same.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import ops

# the loading's names that other modules import from here (zoo.runtime's one-call step)
from .native_load import _PLAIN as _PLAIN
from .native_load import _SOURCE as _SOURCE
from .native_load import _address as _address
from .native_load import _kernels as _kernels
from .native_load import _library as _library
from .native_load import _plain as _plain
from .native_load import _plain_blocks as _plain_blocks
from .native_load import _vector as _vector
from .native_load import available

__all__ = ["attend_memory", "attend_one", "available", "layer_norm", "linear", "rms_norm"]


def _compile_ready() -> bool:
    """:func:`available`, which a ``torch.compile`` trace reads once as a constant (it calls
    the function while tracing instead of tracing into it: the library's loading and checks
    would break the graph)."""
    return _library() is not None


# What torch.compiler.assume_constant_result(_compile_ready) sets, set without importing the
# compiler (an eager process must not pay for it); tests/test_native_compile.py traces a
# first call with fullgraph=True, which fails where this torch stops honouring the mark.
_compile_ready._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _row_layout(x: Tensor) -> bool:
    """Whether ``x`` is one contiguous float32 row on the CPU (``(*, d)``, one row in all),
    from what a traced tensor has (the operator checks the real tensor's storage)."""
    return (
        x.dtype is torch.float32
        and x.is_cpu
        and x.dim() > 0
        and x.numel() == x.shape[-1]
        and x.is_contiguous()
    )


def _vector_layout(t: Tensor, n: int) -> bool:
    """Whether ``t`` is ``n`` contiguous float32 values on the CPU, from what a traced tensor
    has."""
    return t.dtype is torch.float32 and t.is_cpu and t.numel() == n and t.is_contiguous()


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor | None:
    """``F.linear(x, weight, bias)`` for float32 ``x`` on the CPU of one to
    :data:`~zoo.kernels.ops.FEW_ROWS` rows (``(*, K)``, e.g. ``(1, 1, K)`` at batch-1
    decoding, ``(4, 1, K)`` for four beams), on zoo's kernel, each row with the bits it has
    alone; ``None`` where the kernel does not apply (another dtype or device, more rows,
    non-contiguous tensors, no kernel) and the caller computes it otherwise. No autograd:
    callers use it without gradients. Under ``torch.compile`` one row only.

    Shape:
        ``(*, K) -> (*, N)`` for ``weight`` ``(N, K)``.
    """
    if torch.compiler.is_compiling():
        if not (
            _compile_ready()
            and weight.dim() == 2
            and _row_layout(x)
            and x.shape[-1] == weight.shape[1]
            and _vector_layout(weight, weight.numel())
            and (bias is None or _vector_layout(bias, weight.shape[0]))
        ):
            return None
        return torch.ops.zoo.gemv_f32(x, weight, bias)
    lib = _library()
    return None if lib is None else ops.gemv_f32_kernel(lib, x, weight, bias)


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor | None:
    """``F.layer_norm`` over the last dimension of one float32 row on the CPU, on zoo's
    kernel (mean, variance and centred values in double); ``None`` where it does not apply.

    Shape:
        ``(*, d) -> (*, d)``.
    """
    if torch.compiler.is_compiling():
        if not (
            _compile_ready()
            and _row_layout(x)
            and all(t is None or _vector_layout(t, x.shape[-1]) for t in (weight, bias))
        ):
            return None
        return torch.ops.zoo.layer_norm(x, weight, bias, eps)
    lib = _library()
    return None if lib is None else ops.layer_norm_kernel(lib, x, weight, bias, eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor | None:
    """``x / sqrt(mean(x^2) + eps) * (weight + offset)`` over the last dimension of one
    float32 row on the CPU (RMSNorm with ``offset`` 0, Gemma's with 1); ``None`` where it
    does not apply.

    Shape:
        ``(*, d) -> (*, d)``.
    """
    if torch.compiler.is_compiling():
        if not (_compile_ready() and _row_layout(x) and _vector_layout(weight, x.shape[-1])):
            return None
        return torch.ops.zoo.rms_norm(x, weight, eps, offset)
    lib = _library()
    return None if lib is None else ops.rms_norm_kernel(lib, x, weight, eps, offset)


def attend_one(
    q: Tensor, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, start: int, scale: float
) -> Tensor | None:
    """One decoding step's attention for each of ``B`` sequences: stores the new keys and
    values at position ``start`` of the caches, then each query head attends to positions
    ``[0, start]`` of its key/value head (grouped-query when ``H_kv < H``), softmax in
    float32 with ``scale``; no mask. ``None`` (nothing written) where it does not apply:
    another dtype or device, more than one query per sequence, ``start`` past the cache,
    heads whose features are not contiguous, or a cache that is not one contiguous block.
    Each sequence's result has the bits it has alone.

    Shape:
        ``q (B, H, 1, hd)``, ``k``/``v`` ``(B, H_kv, 1, hd)``, caches ``(B, H_kv, max_len,
        hd)`` -> ``(B, 1, H * hd)``.
    """
    if torch.compiler.is_compiling():
        if not (_compile_ready() and _attention_layout(q, k, v, cache_k, cache_v, start)):
            return None
        return torch.ops.zoo.attend_one(q, k, v, cache_k, cache_v, start, scale)
    lib = _library()
    if lib is None:
        return None
    return ops.attend_one_kernel(lib, q, k, v, cache_k, cache_v, start, scale)


def attend_memory(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, scale: float
) -> Tensor | None:
    """One query per sequence attending to that sequence's keys and values, those where
    ``keep`` is ``False`` left out, softmax in float32 with ``scale``: a decoding step's
    cross-attention to the encoder's output. ``None`` where it does not apply (another dtype
    or device, several queries, heads whose features are not contiguous, keys and values
    laid out differently, inside a ``torch.compile`` trace: there the caller's
    ``scaled_dot_product_attention`` stays).

    Shape:
        ``q (B, H, 1, hd)``, ``k``/``v`` ``(B, H_kv, S, hd)``, ``keep`` ``(B, S)`` boolean
        or ``None`` -> ``(B, 1, H * hd)``.
    """
    lib = _kernels()
    return None if lib is None else ops.attend_memory_kernel(lib, q, k, v, keep, scale)


def _attention_layout(
    q: Tensor, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, start: int
) -> bool:
    """What :func:`attend_one`'s kernel asks of its tensors, from what traced tensors have:
    float32 on the CPU, the shapes it takes, heads whose features are contiguous, caches
    that are one contiguous block each, ``start`` inside them."""
    tensors = (q, k, v, cache_k, cache_v)
    if not all(t.dim() == 4 and t.dtype is torch.float32 and t.is_cpu for t in tensors):
        return False
    kv_heads, hd = k.shape[1], q.shape[3]
    rows = q.shape[0]
    return (
        q.shape[2] == 1
        and 0 <= start < cache_k.shape[2]
        and all(t.stride(-1) == 1 for t in tensors)
        and cache_k.is_contiguous()
        and cache_v.is_contiguous()
        and cache_k.shape == cache_v.shape == (rows, kv_heads, cache_k.shape[2], hd)
        and k.shape == v.shape == (rows, kv_heads, 1, hd)
        and kv_heads > 0
        and q.shape[1] % kv_heads == 0
    )
