"""LoRA training (``zoo.train.train(..., adapter=zoo.LoRA(...))``, ``zoo train BASE --lora
RANK``): the base is fingerprinted, optionally quantized (QLoRA), frozen and given adapters
before the run starts; only the adapters reach the optimizer, the resumable checkpoint and the
run's result, ``<out>/adapter/`` (peft's files and the record of the base, written by
:func:`zoo.adapters.save_adapter`).

The checkpoint of a LoRA run holds the adapters' weights (``checkpoint/adapter.safetensors``,
keyed by the model's parameter names) and the optimizer's state for them, never a copy of the
base; ``trainer.json`` records the adapter's shape and the base's fingerprint, and a resumed
run with another shape or another base is refused, naming both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..adapters.lora import DEFAULT_TARGETS, LoRA, PartPlan, adapted_layers, attach_lora, plan_lora
from ..options import QUANTIZE_MODES

if TYPE_CHECKING:
    from ..adapters import BaseRecord
    from ..nn.base import ZooModel

__all__ = ["AdapterRun", "adapt", "default_targets", "save_result", "trainable_state"]


@dataclasses.dataclass(frozen=True)
class AdapterRun:
    """What a LoRA run trains: the adapter's shape, the part paths it adapts, the base it
    adapts (fingerprinted before any quantization) and the base's quantization."""

    lora: LoRA
    plans: dict[str, PartPlan]
    base: BaseRecord
    quantize: str | None = None

    def record(self) -> dict[str, Any]:
        """What ``trainer.json`` keeps of it (JSON-ready); a resumed run must match it."""
        return {
            "rank": self.lora.rank,
            "alpha": self.lora.alpha,
            "dropout": self.lora.dropout,
            "parts": sorted(self.plans),
            "base_sha256": self.base.sha256,
            "quantize": self.quantize,
        }


def default_targets(model: ZooModel) -> tuple[str, ...]:
    """The layers a LoRA adapts on ``model`` when it names none: its architecture's
    ``lora_targets``, else :data:`~zoo.adapters.lora.DEFAULT_TARGETS`."""
    from ..errors import ZooError
    from ..plugin.current import get_registry

    architecture = getattr(type(getattr(model, "config", None)), "architecture", None)
    if not isinstance(architecture, str):
        return DEFAULT_TARGETS
    try:
        spec = get_registry().architecture(architecture)
    except ZooError:  # a model built outside the registry
        return DEFAULT_TARGETS
    return spec.lora_targets or DEFAULT_TARGETS


def adapt(
    model: ZooModel,
    lora: LoRA,
    *,
    base: BaseRecord | None = None,
    quantize: str | None = None,
    check: Callable[[dict[str, PartPlan]], object] | None = None,
) -> AdapterRun:
    """Fingerprint ``model``'s float weights, quantize it (``quantize``: one of inference's
    modes, :data:`zoo.options.QUANTIZE_MODES`), then freeze it and attach ``lora``'s
    adapters, in place.

    Args:
        base: the base's name, repo and revision to record (its ``sha256`` is replaced by the
            fingerprint computed here); default: the model's name.
        check: called with the plan before anything is quantized or allocated (the run's
            memory check, :func:`zoo.train.lora_memory.check_lora_plan`); it raises to
            refuse.

    Raises:
        ValueError: a target the model does not have (the message lists its names), an
            unknown quantization, or a model that already carries adapters.
    """
    from ..adapters import BaseRecord, base_fingerprint, per_part

    if quantize is not None and quantize not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {quantize!r}")
    if adapted_layers(model):
        raise ValueError(
            "this model already carries a LoRA adapter (an adapter or a LoRA run was given as "
            "the base): merge it first (zoo merge BASE ADAPTER OUT, or zoo.merge) and train "
            "on the merged model"
        )
    plans = plan_lora(model, lora, default_targets=default_targets(model), per_part=per_part(model))
    if check is not None:
        check(plans)
    sha = base_fingerprint(model)  # of the float weights, before any quantization
    if base is None:
        base = BaseRecord(name=model.name, repo=None, revision=None, sha256=sha)
    else:
        base = dataclasses.replace(base, sha256=sha)
    if quantize is not None:
        from ..quant.layers import quantize_

        quantize_(model, quantize)
    attach_lora(model, plans, dropout=lora.dropout)
    return AdapterRun(lora, plans, base, quantize)


def trainable_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """The parameters a LoRA run trains, by the model's own names (detached, on the CPU)."""
    return {
        name: p.detach().cpu().contiguous()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def save_result(model: ZooModel, run: AdapterRun, out: Path, tokenizer: Any) -> Path:
    """Write ``<out>/adapter/`` (peft's files and the base's record) and, when the run's
    tokenizer is not one rebuilt from its name (a trained one, or one given with
    ``--tokenizer``), ``<out>/tokenizer/``; returns the adapter's folder."""
    from ..adapters import save_adapter
    from ..checkpoint.commit import atomic_directory

    folder = save_adapter(model, out / "adapter", base=run.base, lora=run.lora)
    if tokenizer is not None and not getattr(tokenizer, "by_name", True):
        with atomic_directory(out / "tokenizer") as staging:
            tokenizer.save(staging)
    return Path(folder)
