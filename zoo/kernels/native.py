"""zoo's own CPU kernels for batch-1 decoding: one input row times a weight matrix, and the
layer norm, RMSNorm and attention of one new token.

Why: a batch-1 decoding step reads every weight once, so its speed is the rate at which its
matrix-vector products stream the weights from memory. On a 2-core AVX2 machine PyTorch's
kernels for a single row stream at 60-75% of what the cores can read: over gpt2-124m's 49
float32 weights (494 MB), oneDNN's linear took 40.5 ms, MKL's 65-75 ms, OpenBLAS's (numpy)
42 ms, torch.compile's fused multiply-and-sum 47 ms, while a plain ``sum`` over the same
weights took 30.9 ms and :func:`linear` 30.8 ms (``benchmarks/bench_native.py``). No kernel
shipped with PyTorch or its usual companions streams at that rate, so zoo carries a small one
in C (``zoo/kernels/_native.c``), built by ``pip install`` where a C compiler with OpenMP is
found.

The kernels are optional at every level: a missing build, a CPU without AVX2 and FMA, a
PyTorch whose threads are not OpenMP's, or ``ZOO_NATIVE_KERNELS=0``
(:class:`zoo.settings.Settings`) leave PyTorch's kernels in place, and :func:`available`
says which. They run on PyTorch's own OpenMP thread team (the library links
``libgomp.so.1``, which resolves to the copy PyTorch loaded; :func:`_one_openmp` checks that
the thread count set with ``torch.set_num_threads`` reaches it, which a second OpenMP runtime
would not), so they never compete with PyTorch's threads, and ``torch.set_num_threads``
(and :class:`zoo.kernels.threads.DecodeThreads`) size them.

The same step's small operations (about a hundred per gpt2-124m token) cost far more inside
the step than alone: streaming the weights evicts PyTorch's code and data from the caches,
and a layer norm of 768 values then took 136 us instead of 11, one layer's attention 102 us
instead of 22. :func:`layer_norm`, :func:`rms_norm` and :func:`attend_one` (which also writes
the key/value cache, one call where PyTorch took nine) do that work in a fraction of the
calls; :mod:`zoo.nn.norms` and :mod:`zoo.nn.attention` use them for one float32 row without
gradients, masks or soft caps.

What C is handed: only plain tensors (exactly ``torch.Tensor`` or ``nn.Parameter``; a
subclass such as DTensor, torchao's tensors or ``TwoTensor`` may keep its data elsewhere and
report float32, the CPU, contiguous and address 0) of the kernel's dtype on the CPU, whose
elements lie at a nonzero address inside their storage (:func:`_plain`); each kernel
returns ``None`` for anything else and its caller runs PyTorch's. The library must describe
its C structures as :mod:`zoo.kernels.native_abi` mirrors them (``zoo_abi``), or it is refused
with a warning that says to rebuild (a stale build would read them wrongly).

Numerics: each output of :func:`linear` is one dot product over a contiguous weight row,
summed in a fixed order by one thread in float32 (eight lanes, then the lanes, then the
bias), so it does not depend on the thread count. It differs from oneDNN's in the last bits,
as two BLAS libraries do. The norms and the attention agree with PyTorch's to float32
rounding (``tests/test_native_ops.py``); greedy tokens stay the same.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import operator
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..settings import Settings
from . import native_abi

__all__ = ["attend_one", "available", "layer_norm", "linear", "rms_norm"]

_SOURCE = "zoo.kernels._native"  # the extension setuptools builds from zoo/kernels/_native.c

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
#: Each kernel of zoo/kernels/_native.c and _native_int8.c: its result type and argument types.
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "zoo_native_supported": (ctypes.c_int, []),
    "zoo_native_max_threads": (ctypes.c_int, []),
    "zoo_gemv_f32": (None, [_P, _P, _P, _P, _I, _I, ctypes.c_int]),
    "zoo_layer_norm_f32": (None, [_P, _P, _P, _P, _I, _F]),
    "zoo_rms_norm_f32": (None, [_P, _P, _P, _I, _F, _F]),
    # q, its head stride, k, v likewise; the caches, max_len, pos, heads, kv heads, hd, scale, y
    "zoo_attend_one_f32": (None, [_P, _I] * 3 + [_P, _P] + [_I] * 5 + [_F, _P, ctypes.c_int]),
    # x, int8 rows, their scales, their sums, bias, y, N, K, threads -> 0 or -1 (not finite)
    "zoo_gemv_int8": (ctypes.c_int, [_P] * 6 + [_I, _I, ctypes.c_int]),
    # a zoo_decoder, token, position, logits, the key and value caches' addresses [n],
    # max_len, pos, rotary width, cos, sin, threads -> 0 or -1
    "zoo_decode_step_f32": (
        ctypes.c_int,
        [_P, _I, _I] + [_P] * 3 + [_I] * 3 + [_P, _P, ctypes.c_int],
    ),
    # where to write the layout of the C structures (NULL: none), its room -> its length
    "zoo_abi": (_I, [_P, _I]),
}

_REBUILD = (
    "zoo's native kernels at {path} were built from other C sources than this zoo's ({why}); "
    "zoo runs PyTorch's kernels instead. To rebuild them, run `pip install -e .` (or "
    "`pip install .`) in zoo's source folder."
)


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The built kernels, opened once; ``None`` where any condition in the module's docstring
    fails."""
    if not Settings.from_env().native_kernels:
        return None
    try:
        spec = importlib.util.find_spec(_SOURCE)
    except (ImportError, ValueError):
        return None
    if (
        spec is None
        or not spec.origin
        or not spec.origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    ):
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
    except OSError:  # built for another Python or machine, or a missing libgomp
        return None
    if not _same_sources(lib, spec.origin):
        return None
    if not lib.zoo_native_supported() or not _one_openmp(lib):
        return None
    return lib


def _same_sources(lib: ctypes.CDLL, path: str) -> bool:
    """Whether ``lib`` has every kernel and lays out its structures as
    :mod:`zoo.kernels.native_abi` mirrors them (then its kernels' types are set); a warning that
    says to rebuild where not (a stale build would be handed structures it reads wrongly)."""
    built = native_abi.built_layout(lib)
    missing = [name for name in _SIGNATURES if not hasattr(lib, name)]
    if missing or built != native_abi.layout():
        why = (
            f"it lacks {', '.join(missing)}"
            if missing
            else f"its structures' layout {built} is not {native_abi.layout()}"
        )
        warnings.warn(_REBUILD.format(path=path, why=why), RuntimeWarning, stacklevel=3)
        return False
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return True


def _kernels() -> ctypes.CDLL | None:
    """:func:`_library` where a kernel may run now: ``None`` inside a ``torch.compile`` trace
    too, where PyTorch's ops stay (the compiler fuses them into its own kernels; a ctypes call
    cannot be traced, and each would cut the compiled step into separately compiled graphs)."""
    return None if torch.compiler.is_compiling() else _library()


def _one_openmp(lib: ctypes.CDLL) -> bool:
    """Whether the kernels' OpenMP runtime is PyTorch's: a thread count set with
    ``torch.set_num_threads`` must reach it (it would not in a second runtime, whose idle
    threads would then spin against PyTorch's).

    The counts are tried on a thread of its own: OpenMP keeps the count per thread, so the
    caller's (and every other thread's) count is never changed, not even for the duration
    of the check; the last count set there is the caller's, so what ``torch.set_num_threads``
    sets process-wide beside it (XNNPACK's thread pool) ends as the caller had it. Runs
    once per process (:func:`_library` is cached)."""
    import threading

    caller = torch.get_num_threads()
    found: list[bool] = []

    def check() -> None:
        try:
            same = True
            for count in (1, max(caller, 2)):
                torch.set_num_threads(count)
                same = same and lib.zoo_native_max_threads() == count
            found.append(same)
        finally:
            torch.set_num_threads(caller)

    worker = threading.Thread(target=check, name="zoo-openmp-check", daemon=True)
    worker.start()
    worker.join()
    return found == [True]


def available() -> bool:
    """Whether zoo's kernels run here (built, AVX2 and FMA, PyTorch's OpenMP, not turned
    off)."""
    return _library() is not None


#: The tensor types whose address is their data: a subclass (DTensor, torchao's tensors,
#: ``TwoTensor``) may keep its data elsewhere and report float32, the CPU, contiguous and
#: address 0.
_PLAIN = (Tensor, nn.Parameter)


def _plain(t: Any, dtype: torch.dtype = torch.float32) -> bool:
    """Whether a kernel may be handed ``t``'s address: a plain tensor (exactly ``Tensor`` or
    ``nn.Parameter``, no subclass) of ``dtype`` on the CPU whose elements lie inside its
    storage at a nonzero address (PyTorch refuses a tensor whose storage was freed or shrunk
    under it, e.g. by ``untyped_storage().resize_``; C would read past it)."""
    if type(t) not in _PLAIN or t.dtype is not dtype or not t.is_cpu:
        return False
    extent = t.nbytes  # from the first element to past the last, where contiguous
    if extent == 0:
        return True  # nothing is read
    if not t.is_contiguous():
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
        extent = (last + 1) * t.element_size()
    start = t.storage_offset() * t.element_size()
    return t.data_ptr() != 0 and start + extent <= t.untyped_storage().nbytes()


_DTYPE_CPU = operator.attrgetter("dtype", "is_cpu")
_NBYTES = operator.attrgetter("nbytes")


def _plain_blocks(tensors: Sequence[Tensor]) -> bool:
    """:func:`_plain` (float32) and contiguous, for many tensors at once in C-level passes
    (``map``, a few microseconds for a model's key/value caches at each step)."""
    storages = map(torch.UntypedStorage.nbytes, map(Tensor.untyped_storage, tensors))
    starts = map(
        operator.mul, map(Tensor.storage_offset, tensors), map(Tensor.element_size, tensors)
    )
    return (
        all(map(_PLAIN.__contains__, map(type, tensors)))
        and all(map((torch.float32, True).__eq__, map(_DTYPE_CPU, tensors)))
        and all(map(Tensor.is_contiguous, tensors))
        and all(map(Tensor.data_ptr, tensors))
        and all(map(operator.le, map(operator.add, starts, map(_NBYTES, tensors)), storages))
    )


def _vector(t: Tensor, n: int) -> bool:
    """Whether ``t`` (a bias, a norm's weight) is ``n`` contiguous float32 values on the
    CPU, a plain tensor inside its storage (:func:`_plain`)."""
    return _plain(t) and t.numel() == n and t.is_contiguous()


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor | None:
    """``F.linear(x, weight, bias)`` for one row of float32 ``x`` on the CPU (``(*, K)``
    with one row in all, e.g. ``(1, 1, K)``), on zoo's kernel; ``None`` where the kernel
    does not apply (another dtype or device, several rows, non-contiguous tensors, no
    kernel) and the caller computes it otherwise. No autograd: callers use it without
    gradients.

    Shape:
        ``(*, K) -> (*, N)`` for ``weight`` ``(N, K)``.
    """
    lib = _kernels()
    if lib is None:
        return None
    if weight.dim() != 2:
        return None
    n, k = weight.shape
    if not (
        _row(x)
        and x.shape[-1] == k
        and weight.is_contiguous()
        and _plain(weight)
        and (bias is None or _vector(bias, n))
    ):
        return None
    y = torch.empty((*x.shape[:-1], n))
    lib.zoo_gemv_f32(
        weight.data_ptr(), x.data_ptr(), _address(bias), y.data_ptr(), n, k,
        torch.get_num_threads(),
    )  # fmt: skip
    return y


def _row(x: Tensor) -> bool:
    """Whether ``x`` is one contiguous float32 row on the CPU (``(*, d)``, one row in all), a
    plain tensor inside its storage (:func:`_plain`)."""
    return _plain(x) and x.numel() == x.shape[-1] and x.is_contiguous()


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor | None:
    """``F.layer_norm`` over the last dimension of one float32 row on the CPU, on zoo's
    kernel (mean, variance and centred values in double); ``None`` where it does not apply.

    Shape:
        ``(*, d) -> (*, d)``.
    """
    lib = _kernels()
    d = x.shape[-1]
    if lib is None or not _row(x) or not all(t is None or _vector(t, d) for t in (weight, bias)):
        return None
    y = torch.empty_like(x)
    lib.zoo_layer_norm_f32(x.data_ptr(), _address(weight), _address(bias), y.data_ptr(), d, eps)
    return y


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor | None:
    """``x / sqrt(mean(x^2) + eps) * (weight + offset)`` over the last dimension of one
    float32 row on the CPU (RMSNorm with ``offset`` 0, Gemma's with 1); ``None`` where it
    does not apply.

    Shape:
        ``(*, d) -> (*, d)``.
    """
    lib = _kernels()
    d = x.shape[-1]
    if lib is None or not _row(x) or not _vector(weight, d):
        return None
    y = torch.empty_like(x)
    lib.zoo_rms_norm_f32(x.data_ptr(), weight.data_ptr(), y.data_ptr(), d, eps, offset)
    return y


def attend_one(
    q: Tensor, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, start: int, scale: float
) -> Tensor | None:
    """One decoding step's attention for one sequence: stores the new key and value at
    position ``start`` of the caches, then each query head attends to positions
    ``[0, start]`` of its key/value head (grouped-query when ``H_kv < H``), softmax in
    float32 with ``scale``; no mask. ``None`` (nothing written) where it does not apply:
    another dtype or device, more than one sequence or query, ``start`` past the cache,
    heads whose features are not contiguous, or a cache that is not one contiguous block.

    Shape:
        ``q (1, H, 1, hd)``, ``k``/``v`` ``(1, H_kv, 1, hd)``, caches ``(1, H_kv, max_len,
        hd)`` -> ``(1, 1, H * hd)``.
    """
    lib = _kernels()
    if lib is None or q.shape[0] != 1 or q.shape[2] != 1 or not 0 <= start < cache_k.shape[2]:
        return None
    heads, hd = q.shape[1], q.shape[3]
    kv_heads = k.shape[1]
    tensors = (q, k, v, cache_k, cache_v)
    if not (
        all(t.stride(-1) == 1 and _plain(t) for t in tensors)
        and cache_k.is_contiguous()
        and cache_v.is_contiguous()
        and cache_k.shape == cache_v.shape == (1, kv_heads, cache_k.shape[2], hd)
        and k.shape == v.shape == (1, kv_heads, 1, hd)
        and kv_heads > 0
        and heads % kv_heads == 0
    ):
        return None
    y = torch.empty(1, 1, heads * hd)
    lib.zoo_attend_one_f32(
        q.data_ptr(), q.stride(1), k.data_ptr(), k.stride(1), v.data_ptr(), v.stride(1),
        cache_k.data_ptr(), cache_v.data_ptr(), cache_k.shape[2], start, heads, kv_heads, hd,
        scale, y.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return y


def _address(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
