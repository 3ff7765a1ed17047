"""Checking the ``device`` and ``dtype`` arguments every public entry point takes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["check_computes", "check_device", "check_dtype"]


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


def check_computes(device: torch.device, model: nn.Module | None, doing: str, fix: str) -> None:
    """Raise :class:`ConfigError` (a ``ValueError``) when ``device`` is the meta device, or
    ``model`` (when given) holds a parameter there: shapes without values, on which a model
    cannot ``doing`` (``"generate"``, ``"train"``); ``fix`` is the command that works."""
    if device.type == "meta" or (model is not None and any(p.is_meta for p in model.parameters())):
        raise ConfigError(
            "on the meta device a model's parameters have shapes but no values, so it cannot "
            f"{doing} there; build or load it on 'cpu' or 'cuda' ({fix})"
        )
