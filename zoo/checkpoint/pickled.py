"""The one place zoo reads a pickle-based checkpoint: an explicit, opt-in conversion."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, UnsafeCheckpointError
from .commit import atomic_directory
from .files import WEIGHTS_FILE, write_safetensors
from .manifest import CONFIG_FILE

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["convert_pickle_checkpoint"]


def _state_dict(obj: Any, path: Path) -> dict[str, Tensor]:
    import torch

    for key in ("state_dict", "model"):  # common wrappers around the state dict
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(f"{path} does not hold a state dict (a dict of tensors)")
    tensors = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not tensors:
        raise CheckpointError(f"{path} holds no tensors")
    return tensors


def convert_pickle_checkpoint(
    path: str | os.PathLike[str], output: str | os.PathLike[str], *, allow_pickle: bool = False
) -> Path:
    """Convert a ``torch.save`` / ``pytorch_model.bin`` checkpoint to ``model.safetensors``.

    Only for files from sources you trust: it uses ``torch.load(weights_only=True)``, whose
    restricted unpickler refuses arbitrary objects, but a pickle is still a program.

    Args:
        path: the pickle-based file.
        output: directory to write ``model.safetensors`` into (atomically); a ``config.json``
            next to ``path`` is copied along, so a Hugging Face directory stays loadable.
        allow_pickle: must be ``True``: the explicit opt-in.

    Returns:
        the output directory, which :func:`zoo.load` reads.
    """
    import torch

    path = Path(path)
    if not allow_pickle:
        raise UnsafeCheckpointError(
            f"converting {path} means unpickling it; pass allow_pickle=True if you trust its source"
        )
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # the restricted unpickler refuses anything but tensors & co.
        raise CheckpointError(
            f"cannot read {path} with torch.load(weights_only=True): {exc}"
        ) from exc
    tensors = _state_dict(obj, path)
    seen: set[tuple[int, int]] = set()
    out: dict[str, Tensor] = {}
    for key, tensor in tensors.items():  # safetensors refuses shared storage: copy repeats
        ident = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        out[key] = tensor.clone().contiguous() if ident in seen else tensor.contiguous()
        seen.add(ident)
    with atomic_directory(output) as staging:
        write_safetensors(out, staging / WEIGHTS_FILE, {"format": "pt"})
        config = path.parent / CONFIG_FILE
        if config.is_file():
            shutil.copyfile(config, staging / CONFIG_FILE)
    return Path(output)
