"""The base an adapter was trained on: :class:`BaseRecord` (kept, torch-free, in
:mod:`zoo.checkpoint.adapter_record`) and :func:`base_fingerprint`."""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from ..checkpoint.adapter_record import METADATA_KEY, BaseRecord
from .lora import adapted_layers

__all__ = ["METADATA_KEY", "BaseRecord", "base_fingerprint"]


def base_fingerprint(model: nn.Module) -> str:
    """The sha256 of ``model``'s weights without its adapters: every state-dict entry in key
    order, each as its key, dtype, shape and bytes. The same weights give the same
    fingerprint whatever folder they were loaded from (a Hugging Face checkpoint or zoo's
    save); another dtype gives another. Take it before quantizing: a quantized model's
    weights are not the base's.

    Raises:
        ValueError: a quantized model (any mode of :func:`zoo.quant.layers.quantize_`),
            weights on the meta device or quantized tensors (take the fingerprint of the
            float model).
    """
    mode = getattr(model, "quantized", None)  # set by zoo.quant.layers.quantize_
    if mode:
        raise ValueError(
            f"cannot fingerprint a model quantized to {mode}: its weights are not the base's; "
            "take base_fingerprint of the loaded float model, before quantizing "
            "(apply_adapter(..., fingerprint=))"
        )
    skip = tuple(f"{path}.lora." for path in adapted_layers(model))
    digest = hashlib.sha256()
    state = model.state_dict()
    for key in sorted(state):
        if key.startswith(skip):
            continue
        tensor = state[key]
        if not isinstance(tensor, torch.Tensor) or tensor.is_quantized or tensor.is_meta:
            where = "on the meta device" if getattr(tensor, "is_meta", False) else "quantized"
            raise ValueError(
                f"cannot fingerprint {key}: it is {where}; take base_fingerprint of the "
                "loaded float model, before quantizing (apply_adapter(..., fingerprint=))"
            )
        flat = tensor.detach().reshape(-1).contiguous().cpu()  # (numel,): a view when it can be
        digest.update(f"{key}\0{flat.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(flat.view(torch.uint8).numpy().data)
    return digest.hexdigest()
