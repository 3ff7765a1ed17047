"""Adapter folders, PEFT-compatible both ways: :func:`save_adapter` writes a model's LoRA
adapters as peft does (``adapter_config.json`` + ``adapter_model.safetensors``, peft's key
names through the model's checkpoint layout, zoo's record of the base in the metadata),
:func:`read_adapter` reads zoo's or peft's, and :func:`apply_adapter` attaches one to its
base. See docs/peft.md.

LoRA itself lives here too: an adapter's shape and plan without torch
(:mod:`~zoo.adapters.lora_config`), the adapters on zoo's linear layers
(:mod:`~zoo.adapters.lora`), the check that an update is finite and in range
(:mod:`~zoo.adapters.lora_check`) and many adapters on one model, one per batch row
(:mod:`~zoo.adapters.lora_bank`)."""

from __future__ import annotations

from .folder import Adapter, apply_adapter, check_adapter_base, read_adapter, save_adapter
from .layout import per_part
from .peft_config import CONFIG_FILE, WEIGHTS_FILE
from .record import BaseRecord, base_fingerprint

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "Adapter",
    "BaseRecord",
    "apply_adapter",
    "base_fingerprint",
    "check_adapter_base",
    "per_part",
    "read_adapter",
    "save_adapter",
]
