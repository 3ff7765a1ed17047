"""How much memory a build needs, how much the machine has, and the refusal when it cannot.

Config bounds (:data:`zoo.config.MAX_LAYERS` ...) stop absurd single values, but sizes each
within bounds multiply: ``d_model=8192, d_ff=32768, n_layers=4096`` is 3.3e12 parameters. Before
any tensor is allocated, :func:`check_build_fits` counts the model's tensors on the ``meta``
device (no memory, no initialisation) and refuses what the target device cannot hold, saying
how much it needs, how much there is, and how to proceed anyway.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InsufficientMemoryError
from .settings import VARIABLES, Settings

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "ALLOW_LARGE_ENV",
    "allow_large",
    "available_memory",
    "check_build_fits",
    "format_bytes",
    "tensor_bytes",
]

#: Setting this environment variable to 1 skips the memory checks (builds and training).
ALLOW_LARGE_ENV = VARIABLES["allow_large"][0]


def allow_large() -> bool:
    """Whether ``ZOO_ALLOW_LARGE`` asks zoo to skip its memory checks."""
    return Settings.from_env().allow_large


def format_bytes(n: float) -> str:
    """``n`` bytes for a person: ``"9.8 GB"``, ``"13.2 TB"`` (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _meminfo_available(path: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """What this process's cgroup (v2) may still allocate, when it has a limit."""
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((root / "memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def _address_space_headroom(status: Path = Path("/proc/self/status")) -> int | None:
    """What this process may still map under its address-space limit (``ulimit -v``,
    ``RLIMIT_AS``), when it has one: the limit less its mapped size (``VmSize``)."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY or limit < 0:
            return None
        for line in status.read_text().splitlines():
            if line.startswith("VmSize:"):
                return max(0, limit - int(line.split()[1]) * 1024)
    except (ImportError, OSError, ValueError, IndexError):
        return None
    return limit


def available_memory(device: Any = "cpu") -> int | None:
    """Bytes that can still be allocated on ``device``, ``None`` when unknown (``meta``, or
    a platform that does not say).

    CPU: ``MemAvailable`` of ``/proc/meminfo`` (``os.sysconf`` where there is none), capped by
    the cgroup's limit when the process runs under one, and by what its address-space limit
    (``ulimit -v``) leaves it. CUDA: the device's free memory.
    """
    import torch

    target = torch.device(device if device is not None else "cpu")
    if target.type == "cuda":
        index = target.index if target.index is not None else torch.cuda.current_device()
        return int(torch.cuda.mem_get_info(index)[0])
    if target.type != "cpu":
        return None
    free = _meminfo_available()
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            free = None
    for headroom in (_cgroup_headroom(), _address_space_headroom()):
        if headroom is not None:
            free = headroom if free is None else min(free, headroom)
    return free


def tensor_bytes(model: nn.Module, dtype: torch.dtype | None = None) -> tuple[int, int]:
    """``(parameters, bytes)`` of ``model``'s tensors (each shared tensor counted once) once
    floating tensors are converted to ``dtype`` (``None``: as they are). Works on ``meta``."""
    seen: set[int] = set()
    count = 0
    size = 0
    for is_param, tensors in ((True, model.parameters()), (False, model.buffers())):
        for t in tensors:
            if id(t) in seen:
                continue
            seen.add(id(t))
            count += t.numel() if is_param else 0
            itemsize = t.element_size()
            if dtype is not None and t.is_floating_point():
                itemsize = dtype.itemsize
            size += t.numel() * itemsize
    return count, size


def check_build_fits(
    meta_model: nn.Module,
    *,
    device: torch.device,
    dtype: torch.dtype | None,
    what: str,
    available: int | None = None,
) -> None:
    """Raise :class:`~zoo.errors.InsufficientMemoryError` when building ``meta_model`` (the
    model built on ``meta``) on ``device`` needs more memory than is available there.

    A build allocates its tensors in the default dtype, then converts them to ``dtype``:
    both copies count. ``available`` overrides :func:`available_memory` (tests).
    ``ZOO_ALLOW_LARGE=1`` skips the check.
    """
    import torch

    if device.type == "meta" or allow_large():
        return
    free = available_memory(device) if available is None else available
    if free is None:
        return
    count, needed = tensor_bytes(meta_model)
    if dtype is not None and dtype != torch.get_default_dtype():
        needed += tensor_bytes(meta_model, dtype)[1]
    if needed <= free:
        return
    kind = "free on the GPU" if device.type == "cuda" else "available"
    raise InsufficientMemoryError(
        f"building {what} ({count:,} parameters) needs about {format_bytes(needed)} of memory "
        f"on {device}, but only {format_bytes(free)} is {kind}. Make it smaller (n_layers, "
        "d_model, d_ff, vocab_size), build it on device='meta' to inspect it without memory, "
        f"or set {ALLOW_LARGE_ENV}=1 to build it anyway."
    )
