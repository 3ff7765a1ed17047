"""zoo's built C kernels, found, opened once and checked, and what they may be handed.

The library (``zoo.kernels._native``, built by ``pip install`` from ``zoo/kernels/_native.c``,
``_native_int8.c`` and ``_native_block.c``) is opened with ctypes the first time a kernel is
asked for (:func:`_library`), and refused where the kernels cannot run: not built,
``ZOO_NATIVE_KERNELS=0`` (:class:`zoo.settings.Settings`), a CPU without AVX2 and FMA, a
second OpenMP runtime beside PyTorch's, or C structures other than those
:mod:`zoo.kernels.native_abi` mirrors (a stale build, refused with a warning that says to
rebuild).

What C is handed: only plain tensors (exactly ``torch.Tensor`` or ``nn.Parameter``; a
subclass such as DTensor, torchao's tensors or ``TwoTensor`` may keep its data elsewhere and
report float32, the CPU, contiguous and address 0) of the kernel's dtype on the CPU, whose
elements lie at a nonzero address inside their storage (:func:`_plain`). The kernels' callers
(:mod:`zoo.kernels.ops`, the one-call step's plan) check each tensor with these functions
before they take its address.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import math
import operator
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..settings import NATIVE_ISAS, Settings
from . import native_abi

__all__ = ["available", "isa_name"]

_SOURCE = "zoo.kernels._native"  # the extension setuptools builds from zoo/kernels/_native.c

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
#: Each kernel of zoo/kernels/_native.c and _native_int8.c: its result type and argument types.
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "zoo_native_supported": (ctypes.c_int, []),
    "zoo_native_max_threads": (ctypes.c_int, []),
    # the instruction set the kernels run on (0 AVX2, 1 AVX-512); choose one
    "zoo_native_isa": (ctypes.c_int, []),
    "zoo_native_set_isa": (ctypes.c_int, [ctypes.c_int]),
    "zoo_gemv_f32": (None, [_P, _P, _P, _P, _I, _I, ctypes.c_int]),
    # W, X, b, Y, M, N, K, threads
    "zoo_gemm_f32": (None, [_P, _P, _P, _P, _I, _I, _I, ctypes.c_int]),
    "zoo_layer_norm_f32": (None, [_P, _P, _P, _P, _I, _F]),
    "zoo_rms_norm_f32": (None, [_P, _P, _P, _I, _F, _F]),
    # q, its row and head strides, k and v likewise; the caches, their row, head and position
    # strides; pos, len, keep, rows, heads, kv heads, hd, scale, y, threads
    "zoo_attend_rows_f32": (
        None,
        [_P, _I, _I] * 3 + [_P, _P] + [_I] * 5 + [_P] + [_I] * 4 + [_F, _P, ctypes.c_int],
    ),
    # x, int8 rows, their scales, their sums, bias, y, N, K, threads -> 0 or -1 (not finite)
    "zoo_gemv_int8": (ctypes.c_int, [_P] * 6 + [_I, _I, ctypes.c_int]),
    # X, int8 rows, their scales, their sums, bias, Y, M, N, K, threads -> 0 or -1
    "zoo_linear_int8": (ctypes.c_int, [_P] * 6 + [_I, _I, _I, ctypes.c_int]),
    # a zoo_decoder, rows, their tokens, positions, slots and cache positions [rows], the
    # rows output and which [outputs], logits, the key and value caches' addresses [layers],
    # max_len, rotary width, cos, sin, threads -> 0 or -1
    "zoo_decode_rows_f32": (
        ctypes.c_int,
        [_P, _I] + [_P] * 4 + [_I] + [_P] * 4 + [_I, _I, _P, _P, ctypes.c_int],
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
    """The built kernels, opened once; ``None`` where any condition in this module's docstring
    fails."""
    settings = Settings.from_env()
    if not settings.native_kernels:
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
    _choose_isa(lib, settings.native_isa)
    return lib


def _choose_isa(lib: ctypes.CDLL, isa: str | None) -> None:
    """Run the kernels' variant for ``isa`` (``ZOO_NATIVE_ISA``; ``None``: the widest this CPU
    has), or warn that this CPU lacks it and keep the widest."""
    if isa is not None and lib.zoo_native_set_isa(NATIVE_ISAS.index(isa)) != 0:
        warnings.warn(
            f"ZOO_NATIVE_ISA={isa}: this CPU lacks {isa}; zoo's kernels run on "
            f"{NATIVE_ISAS[lib.zoo_native_isa()]}",
            RuntimeWarning,
            stacklevel=4,
        )


def isa_name() -> str | None:
    """The instruction set zoo's kernels run on (``"avx2"`` or ``"avx512"``: the few-row
    float32 products' larger tiles, and VNNI's int8 products where the CPU has it), or
    ``None`` where zoo's kernels do not run."""
    lib = _library()
    return None if lib is None else NATIVE_ISAS[lib.zoo_native_isa()]


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


def _row(x: Tensor) -> bool:
    """Whether ``x`` is one contiguous float32 row on the CPU (``(*, d)``, one row in all), a
    plain tensor inside its storage (:func:`_plain`)."""
    return _rows(x, 1) == 1


def _rows(x: Tensor, most: int) -> int:
    """How many rows contiguous float32 ``x`` ``(*, d)`` on the CPU has, a plain tensor inside
    its storage (:func:`_plain`), where that is 1 to ``most``; else 0."""
    if x.dim() == 0 or not x.is_contiguous() or not _plain(x):
        return 0
    rows = math.prod(x.shape[:-1])
    return rows if 0 < rows <= most else 0


def _address(t: Tensor | None) -> int | None:
    """``t``'s address, ``None`` (C's NULL) for no tensor."""
    return None if t is None else t.data_ptr()
