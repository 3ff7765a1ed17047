"""zoo's own CPU kernels for batch-1 decoding: one input row times a weight matrix.

Why: a batch-1 decoding step reads every weight once, so its speed is the rate at which its
matrix-vector products stream the weights from memory. On a 2-core AVX2 machine PyTorch's
kernels for a single row stream at 60-75% of what the cores can read: over gpt2-124m's 49
float32 weights (494 MB), oneDNN's linear took 40.5 ms, MKL's 65-75 ms, OpenBLAS's (numpy)
42 ms, torch.compile's fused multiply-and-sum 47 ms, while a plain ``sum`` over the same
weights took 30.9 ms and :func:`linear` 30.8 ms (``benchmarks/bench_native.py``). No kernel
shipped with PyTorch or its usual companions streams at that rate, so zoo carries a small one
in C (``zoo/nn/_native.c``), built by ``pip install`` where a C compiler with OpenMP is
found.

The kernels are optional at every level: a missing build, a CPU without AVX2 and FMA, a
PyTorch whose threads are not OpenMP's, or ``ZOO_NATIVE_KERNELS=0``
(:class:`zoo.settings.Settings`) leave PyTorch's kernels in place, and :func:`available`
says which. They run on PyTorch's own OpenMP thread team (the library links
``libgomp.so.1``, which resolves to the copy PyTorch loaded; :func:`_one_openmp` checks that
the thread count set with ``torch.set_num_threads`` reaches it, which a second OpenMP runtime
would not), so they never compete with PyTorch's threads, and ``torch.set_num_threads``
(and :class:`zoo.nn.threads.DecodeThreads`) size them.

Numerics: each output is one dot product over a contiguous weight row, summed in a fixed
order by one thread in float32 (eight lanes, then the lanes, then the bias), so it does not
depend on the thread count. It differs from oneDNN's in the last bits, as two BLAS libraries
do.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util

import torch
from torch import Tensor

from ..settings import Settings

__all__ = ["available", "linear"]

_SOURCE = "zoo.nn._native"  # the extension setuptools builds from zoo/nn/_native.c


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
    if spec is None or not spec.origin or not spec.origin.endswith(tuple(_suffixes())):
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
    except OSError:  # built for another Python or machine, or a missing libgomp
        return None
    lib.zoo_native_supported.restype = ctypes.c_int
    lib.zoo_native_max_threads.restype = ctypes.c_int
    lib.zoo_gemv_f32.restype = None
    lib.zoo_gemv_f32.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2 + [ctypes.c_int]
    if not lib.zoo_native_supported() or not _one_openmp(lib):
        return None
    return lib


def _suffixes() -> list[str]:
    import importlib.machinery

    return importlib.machinery.EXTENSION_SUFFIXES


def _one_openmp(lib: ctypes.CDLL) -> bool:
    """Whether the kernels' OpenMP runtime is PyTorch's: a thread count set with
    ``torch.set_num_threads`` must reach it (it would not in a second runtime, whose idle
    threads would then spin against PyTorch's)."""
    before = torch.get_num_threads()
    try:
        for count in {1, max(before, 2)}:
            torch.set_num_threads(count)
            if lib.zoo_native_max_threads() != count:
                return False
        return True
    finally:
        torch.set_num_threads(before)


def available() -> bool:
    """Whether zoo's kernels run here (built, AVX2 and FMA, PyTorch's OpenMP, not turned
    off)."""
    return _library() is not None


def _vector(bias: Tensor, n: int) -> bool:
    """Whether ``bias`` is ``n`` contiguous float32 values on the CPU."""
    return (
        bias.dtype is torch.float32 and bias.is_cpu and bias.numel() == n and bias.is_contiguous()
    )


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor | None:
    """``F.linear(x, weight, bias)`` for one row of float32 ``x`` on the CPU (``(*, K)``
    with one row in all, e.g. ``(1, 1, K)``), on zoo's kernel; ``None`` where the kernel
    does not apply (another dtype or device, several rows, non-contiguous tensors, no
    kernel) and the caller computes it otherwise. No autograd: callers use it without
    gradients.

    Shape:
        ``(*, K) -> (*, N)`` for ``weight`` ``(N, K)``.
    """
    lib = _library()
    if lib is None:
        return None
    if weight.dim() != 2:
        return None
    n, k = weight.shape
    if not (
        x.dtype is torch.float32
        and weight.dtype is torch.float32
        and x.is_cpu
        and weight.is_cpu
        and x.numel() == k == x.shape[-1]
        and x.is_contiguous()
        and weight.is_contiguous()
        and (bias is None or _vector(bias, n))
    ):
        return None
    y = torch.empty((*x.shape[:-1], n))
    lib.zoo_gemv_f32(
        weight.data_ptr(),
        x.data_ptr(),
        None if bias is None else bias.data_ptr(),
        y.data_ptr(),
        n,
        k,
        torch.get_num_threads(),
    )
    return y
