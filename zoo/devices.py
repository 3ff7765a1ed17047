"""Checking the ``device`` and ``dtype`` arguments every public entry point takes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["check_device", "check_dtype"]


def check_dtype(dtype: Any) -> None:
    """Raise :class:`ConfigError` unless ``dtype`` is ``None`` or a floating torch dtype."""
    import torch

    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ConfigError(
            f"dtype must be a floating torch.dtype such as torch.bfloat16, got {dtype!r}"
        )


def check_device(device: Any) -> torch.device:
    """``device`` as a ``torch.device`` (``None`` is the CPU), or a :class:`ConfigError` that
    says what is wrong: not a device name, or a device this machine does not have."""
    import torch

    try:
        target = torch.device(device if device is not None else "cpu")
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"device {device!r} is not a torch device ({exc}); use 'cpu', 'cuda', 'cuda:1', "
            "'mps' or 'meta'"
        ) from None
    if target.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(
                f"device {device!r}: this torch ({torch.__version__}) sees no CUDA device; use "
                "device='cpu', or install a CUDA build of torch on a machine with a GPU"
            )
        if target.index is not None and target.index >= count:
            raise ConfigError(f"device {device!r}: only {count} CUDA device(s), cuda:0..")
    if target.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {device!r}: MPS is not available here; use device='cpu'")
    return target
