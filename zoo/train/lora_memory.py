"""What a LoRA run's adapters will hold, counted from its plan before one is allocated
(``zoo train shakespeare-byte --lora 2000000`` once allocated its adapters, more than the
machine held, before the memory check ran, and was killed by the kernel).

:func:`lora_shape` reads the plan (:func:`zoo.adapters.lora.plan_lora`) against the model's layers,
grouped as :func:`zoo.adapters.lora.attach_lora` groups them, and gives, in elements:

- ``trainable``: every adapted part's ``A`` (``rank x in``) and ``B`` (``rows x rank``); the
  training estimate adds their gradients and AdamW's two moments (4 bytes each);
- ``fixed``: what a step holds whatever its tokens: on a layer with several adapted parts
  (a fused ``qkv``), the stacked ``A``s (``sum of ranks x in``), each ``B`` times its scaling
  and their block-diagonal matrix (``rows x sum of ranks``), each kept for the backward pass
  with a gradient of its size;
- ``per_token``: what a step keeps per token and adapted layer: ``A``'s output (the sum of
  the ranks), the update and the output it is added to (``rows`` each), and the dropped input
  (``in``) with adapter dropout;

and, for a base still to be quantized (QLoRA), ``frozen``: the base's bytes as they will be
held (each ``zoo.nn.Linear`` weight at a byte, half a byte for ``int4``, and a float32 scale
per row; every other tensor as it is), a lower bound of what :func:`~zoo.quant.layers.quantize_`
keeps, so that the plan is refused only where the quantized run cannot fit either (the
check before step 1 counts the quantized model itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from ..errors import InsufficientMemoryError
from ..memory import available_memory
from .memory import TrainingMemory, _largest, check_training_memory

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..adapters.lora import PartPlan
    from .config import TrainConfig

__all__ = ["LoRAShape", "check_lora_plan", "lora_shape"]

#: Bytes a quantized weight element takes, by mode (int4 where the kernels take the shape:
#: half a byte is the lower bound).
_QUANTIZED_BYTES = {"int8": 1.0, "int8-weight": 1.0, "int4": 0.5}


@dataclasses.dataclass(frozen=True)
class LoRAShape:
    """A LoRA's tensors, in elements (see the module's notes); ``frozen`` (bytes) for a base
    not yet frozen, ``None`` once it is (the estimate reads the model's own tensors)."""

    trainable: int
    fixed: int
    per_token: int
    frozen: int | None = None
    tensors: int = 0  # the adapters' parameter tensors (an A and a B a part)


def lora_shape(
    model: nn.Module,
    plans: Mapping[str, PartPlan],
    *,
    dropout: float = 0.0,
    attached: bool = False,
    quantize: str | None = None,
) -> LoRAShape:
    """The tensors ``plans`` gives ``model`` (``attached``: already given: the base is frozen
    and the model's own parameters count as they are; otherwise the whole base is frozen to
    come, quantized with ``quantize``)."""
    from ..adapters.lora import layer_parts, part_path

    trainable = fixed = per_token = tensors = 0
    for layer_path, owner, layer, parts in layer_parts(model):
        if len(parts) > 1 and layer_path in plans:  # a fused layer adapted whole
            parts = ((layer_path.rsplit(".", 1)[-1], sum(rows for _, rows in parts)),)
        ranks = {
            name: (rows, plans[part_path(owner, name)].rank)
            for name, rows in parts
            if part_path(owner, name) in plans
        }
        if not ranks:
            continue
        width = cast(int, layer.in_features)
        rows_out = sum(rows for _, rows in parts)
        rank_sum = sum(rank for _, rank in ranks.values())
        b_elements = sum(rows * rank for rows, rank in ranks.values())
        trainable += rank_sum * width + b_elements
        tensors += 2 * len(ranks)
        per_token += rank_sum + 2 * rows_out + (width if dropout else 0)
        if len(parts) > 1:  # stacked A, scaled Bs, block-diagonal B; and their gradients
            fixed += 2 * (rank_sum * width + b_elements + rows_out * rank_sum)
    frozen = None if attached else _frozen_to_be(model, quantize)
    return LoRAShape(trainable, fixed, per_token, frozen, tensors)


def _frozen_to_be(model: nn.Module, quantize: str | None) -> int:
    """Bytes of ``model``'s tensors once frozen and quantized with ``quantize`` (``None``:
    as they are held now)."""
    from ..quant.layers import quantizable

    seen: set[int] = set()
    held = 0.0
    quantized = {id(m.weight) for m in model.modules() if quantizable(m)} if quantize else set()
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) in seen:
            continue
        seen.add(id(t))
        if id(t) in quantized:
            held += t.numel() * _QUANTIZED_BYTES.get(str(quantize), 1.0) + t.shape[0] * 4
        else:
            held += t.numel() * t.element_size()
    return int(held)


def check_lora_plan(
    model: nn.Module,
    plans: Mapping[str, PartPlan],
    config: TrainConfig,
    device: torch.device,
    processes: int = 1,
    *,
    dropout: float = 0.0,
    quantize: str | None = None,
    available: int | None = None,
) -> TrainingMemory:
    """Refuse, before any adapter is allocated, a LoRA run whose adapters (with their
    gradients, AdamW state and step tensors) and base do not fit: the refusal of
    :func:`~zoo.train.memory.check_training_memory`, with the largest rank that fits.

    Raises:
        zoo.errors.InsufficientMemoryError: the estimate, the memory, and what fits.
    """
    free = available_memory(device) if available is None else available

    def check(ranked: Mapping[str, PartPlan]) -> TrainingMemory:
        shape = lora_shape(model, ranked, dropout=dropout, quantize=quantize)
        return check_training_memory(model, config, device, processes, available=free, lora=shape)

    try:
        return check(plans)
    except InsufficientMemoryError as exc:
        rank = max((p.rank for p in plans.values()), default=1)
        shape = lora_shape(model, plans, dropout=dropout, quantize=quantize)

        def fits(r: int) -> bool:
            try:
                check({k: dataclasses.replace(p, rank=min(p.rank, r)) for k, p in plans.items()})
            except InsufficientMemoryError:
                return False
            return True

        smaller = _largest(rank - 1, fits)
        if smaller:  # a power of two below it: ranks are, and a fit at the edge is fragile
            smaller = 1 << (smaller.bit_length() - 1)
        hint = f" A LoRA of rank {smaller} fits (--lora {smaller})." if smaller else ""
        raise InsufficientMemoryError(
            f"{exc.args[0]} The LoRA of rank {rank} on {len(plans)} part(s) trains "
            f"{shape.trainable:,} parameters.{hint}"
        ) from None
