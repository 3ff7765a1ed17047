"""A training run's peak memory, estimated before the first step, and the refusal when the
machine cannot hold it (the README's quickstart once outgrew its machine and was
OOM-killed).

The estimate, per process, in bytes (``B`` sequences per micro-step on this process, ``T`` the
context, ``L`` the layers, ``d`` ``d_model``, ``f`` ``d_ff``, ``H`` heads, ``V`` the vocabulary):

- weights, gradients and AdamW's two moments: 4 copies of the float32 parameters (divided by
  the processes under FSDP, which shards all four), and AdamW's step count per tensor;
- activations kept for the backward pass: ``L * B * T * (10 d + 2 f)`` floats;
- attention scores, where ``scaled_dot_product_attention`` takes its math path (on the CPU
  with attention dropout during training, or with a padding mask): ``L * B * H * T**2`` x 16
  bytes (the scores, their softmax, the dropout mask and the dropped weights);
- logits: ``B * T * V`` floats, 2 copies (the logits, turned into their own gradient by
  :func:`zoo.train.loss.cross_entropy`, and the gradient flowing into the head), 8 bytes a
  position whether or not bf16 autocast is on (bf16 logits plus their float32 copy);
- 150 MB of allocator and runtime slack;
- a frozen base (a LoRA run, :mod:`zoo.train.adapter`): its weights as they are held (float,
  or a quantized layer's int8/int4 buffers), with no gradients or AdamW state; only the
  trainable parameters (the adapters) get those (see :func:`_frozen`); the adapters' own
  step tensors (:mod:`zoo.train.lora_memory`) join the activations. A LoRA not yet attached
  (``lora`` with a ``frozen`` figure) is counted from its plan: nothing of it is allocated
  before the check.

Calibration: the estimate was checked against the measured peak (CPU, ``ru_maxrss`` of a child
process running two steps of ``loss_of`` + backward + clipping + AdamW, minus its RSS after
``import torch``) of gpt2-124m under several overrides (layers, batch, context, width, dropout
off: no score matrices, the CPU flash kernel) and was at or above every one of them, by at
most about a quarter: on the safe side; the README's quickstart is estimated above what the
measured slope a sequence puts it at, too (docs/benchmarks.md, "Figures behind design
choices", has the figures).

A run is refused when the estimate exceeds 90% of the memory available (a tenth is left for
what the estimate does not see: the data's page cache, the tokenizer, other processes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from ..errors import InsufficientMemoryError
from ..memory import ALLOW_LARGE_ENV, allow_large, available_memory, format_bytes

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .config import TrainConfig
    from .lora_memory import LoRAShape

__all__ = [
    "TrainingMemory",
    "check_training_memory",
    "estimate_training_memory",
    "out_of_memory_refused",
]

#: Share of the available memory a run may plan to use.
HEADROOM = 0.9
_SLACK = 150 * 10**6  # allocator and runtime, measured
_LAYER_FLOATS_D, _LAYER_FLOATS_F = 10, 2  # activations a token keeps per layer: 10 d + 2 f
_SCORE_BYTES = 16  # scores + softmax + dropout mask + dropped weights, per score (math path)
_LOGIT_BYTES = 8  # 2 float32 copies per logit
_STEP_BYTES = 8  # AdamW's step count, a tensor per parameter tensor (float32 or int64)


@dataclasses.dataclass(frozen=True)
class TrainingMemory:
    """The estimated peak memory of one training process, by part, in bytes."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    attention: int
    logits: int
    slack: int = _SLACK
    frozen: int = 0  # a frozen base's weights (no gradients, no optimizer state)

    @property
    def total(self) -> int:
        """The whole estimated peak."""
        return sum(dataclasses.astuple(self))

    def describe(self) -> str:
        """``"24.3 GB (weights 0.3 GB, ...)"``: the total and its non-zero parts."""
        parts = [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("AdamW state", self.optimizer),
            ("activations", self.activations),
            ("attention scores", self.attention),
            ("logits", self.logits),
            ("frozen base", self.frozen),
        ]
        inner = ", ".join(f"{name} {format_bytes(n)}" for name, n in parts if n)
        return f"{format_bytes(self.total)} ({inner})"


def _dims(model: nn.Module) -> dict[str, int]:
    """The sizes the estimate reads from ``model.config`` (0 where a config has none)."""
    config = getattr(model, "config", None)

    def get(name: str, default: int = 0) -> int:
        value = getattr(config, name, default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    d = get("d_model")
    layers = get("n_layers") or get("n_encoder_layers") + get("n_decoder_layers")
    labels = getattr(config, "labels", None)
    outputs = len(labels) if isinstance(labels, (list, tuple)) else get("vocab_size")
    return {
        "d": d,
        "f": get("d_ff", 4 * d),
        "heads": get("n_heads"),
        "layers": layers,
        "context": get("context_length"),
        "outputs": outputs,
        "per_sequence": int(isinstance(labels, (list, tuple))),  # a classifier: 1 output row
    }


def estimate_training_memory(
    model: nn.Module,
    *,
    micro_batch: int,
    device: torch.device,
    context: int | None = None,
    shards: int = 1,
    lora: LoRAShape | None = None,
) -> TrainingMemory:
    """Estimate the peak memory of a process training ``model`` on ``micro_batch`` sequences
    of ``context`` tokens (default: the model's ``context_length``) per step.

    Args:
        model: the model (its parameters and ``config`` are read; works on ``meta``).
        micro_batch: sequences this process runs through forward and backward at once.
        device: where it trains (the CPU takes ``scaled_dot_product_attention``'s math path
            with attention dropout, materialising the scores).
        context: tokens per sequence.
        shards: processes that FSDP shards weights, gradients and optimizer state over.
        lora: a LoRA run's adapters (:func:`zoo.train.lora_memory.lora_shape`): attached
            already (``frozen`` is ``None``), or planned on a base that is not yet frozen
            (the base then counts as ``frozen`` bytes, the adapters as the trainable ones).
    """
    if lora is not None and lora.frozen is not None:  # planned: nothing of it exists yet
        weights, tensors, frozen = lora.trainable * 4, lora.tensors, lora.frozen
    else:
        (weights, tensors), frozen = _trainable(model), _frozen(model)
    weights //= shards
    dims = _dims(model)
    t = context or dims["context"]
    tokens = micro_batch * t
    activations = (
        dims["layers"] * tokens * (_LAYER_FLOATS_D * dims["d"] + _LAYER_FLOATS_F * dims["f"])
    )
    if lora is not None:
        activations += tokens * lora.per_token + lora.fixed
    config = getattr(model, "config", None)
    dropout = getattr(config, "dropout", 0.0)
    masked = bool(getattr(model, "is_encoder_decoder", False))  # padding masks: math path
    math_path = masked or (device.type == "cpu" and isinstance(dropout, float) and dropout > 0)
    attention = (
        dims["layers"] * micro_batch * dims["heads"] * t * t * _SCORE_BYTES if math_path else 0
    )
    rows = micro_batch if dims["per_sequence"] else tokens
    return TrainingMemory(
        weights=weights,
        gradients=weights,
        optimizer=2 * weights + _STEP_BYTES * tensors,
        activations=activations * 4,
        attention=attention,
        logits=rows * dims["outputs"] * _LOGIT_BYTES,
        frozen=frozen,
    )


def _trainable(model: nn.Module) -> tuple[int, int]:
    """Bytes of ``model``'s trainable parameters as float32 master weights (bf16 is autocast
    only), each shared one counted once, and how many tensors they are."""
    unique = {id(p): p for p in model.parameters() if p.requires_grad}
    return sum(p.numel() * 4 for p in unique.values()), len(unique)


def _packed_layers(model: nn.Module) -> list[nn.Module]:
    """Linear layers that hold their weight out of sight, neither a parameter nor a buffer
    (torch's dynamic int8 packs it): a quantized, frozen base's."""
    return [
        m
        for m in model.modules()
        if isinstance(getattr(m, "in_features", None), int)
        and isinstance(getattr(m, "out_features", None), int)
        and not any(True for _ in m.parameters(recurse=False))
        and not any(True for _ in m.buffers(recurse=False))
    ]


def _frozen(model: nn.Module) -> int:
    """Bytes of ``model``'s frozen weights: parameters without gradients, buffers (a
    quantized layer's int8/int4 weights and scales) and packed weights at a byte each (0 for
    a model that trains every parameter and holds no buffers)."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    held = sum(t.numel() * t.element_size() for t in [*frozen, *model.buffers()])
    packed = [(m.in_features, m.out_features) for m in _packed_layers(model)]
    return held + sum(cast(int, i) * cast(int, o) for i, o in packed)


def _held(model: nn.Module, device: torch.device) -> int:
    """Bytes of ``model``'s parameters and buffers already on ``device`` (no longer in its
    free memory)."""
    seen: set[int] = set()
    held = 0
    for p in model.parameters():
        if id(p) not in seen and p.device.type == device.type:
            seen.add(id(p))
            held += p.numel() * p.element_size()
    here = [b for b in model.buffers() if b.device.type == device.type]
    return held + sum(b.numel() * b.element_size() for b in here)


def check_training_memory(
    model: nn.Module,
    config: TrainConfig,
    device: torch.device,
    processes: int = 1,
    strategy: str = "ddp",
    *,
    available: int | None = None,
    lora: LoRAShape | None = None,
) -> TrainingMemory:
    """Refuse, before the first step, a run whose estimated peak memory does not fit.

    Every process checks its own share: ``config.batch_size // config.grad_accum //
    processes`` sequences per micro-step, and its shard of the weights, gradients and optimizer
    state under ``strategy="fsdp"``. On the CPU the processes of one machine
    (``LOCAL_WORLD_SIZE``) share its memory.

    Args:
        available: bytes free on ``device`` (default: :func:`zoo.memory.available_memory`).
        lora: a LoRA run's adapters, attached or planned (see
            :func:`estimate_training_memory`): a plan is checked before anything of it is
            allocated.

    Returns:
        The estimate, when it fits (or when ``ZOO_ALLOW_LARGE=1``, or the memory is unknown).

    Raises:
        zoo.errors.InsufficientMemoryError: with the estimate, the memory available and
            settings that would fit (a smaller ``--batch-size``, ``--grad-accum``, a shorter
            ``context_length``).
    """
    micro = max(1, config.batch_size // config.grad_accum // processes)
    shards = processes if strategy == "fsdp" else 1
    estimate = estimate_training_memory(
        model, micro_batch=micro, device=device, shards=shards, lora=lora
    )
    free = available_memory(device) if available is None else available
    if free is None or allow_large():
        return estimate
    local = int(os.environ.get("LOCAL_WORLD_SIZE", processes)) if device.type == "cpu" else 1
    held = _held(model, device) // shards
    budget = HEADROOM * free

    def fits(e: TrainingMemory) -> bool:
        return local * (e.total - held) <= budget

    if fits(estimate):
        return estimate
    name = getattr(model, "name", None) or type(model).__name__
    sharing = f" for {local} processes" if local > 1 else ""
    advice = _what_fits(model, config, device, processes, shards, fits, lora)
    raise InsufficientMemoryError(
        f"training {name} with --batch-size {config.batch_size} (--grad-accum "
        f"{config.grad_accum}, {micro} sequence(s) of {_dims(model)['context'] or '?'} tokens "
        f"per step and process) needs about {estimate.describe()} per process at its peak, but "
        f"{format_bytes(free)} is available on {device}{sharing} and a run may plan on "
        f"{HEADROOM:.0%} of it. {advice} "
        f"({ALLOW_LARGE_ENV}=1 skips this check.)"
    )


def _what_fits(
    model: nn.Module,
    config: TrainConfig,
    device: torch.device,
    processes: int,
    shards: int,
    fits: Any,
    lora: LoRAShape | None = None,
) -> str:
    """Settings that would fit, in words."""
    micro = max(1, config.batch_size // config.grad_accum // processes)

    def estimate(micro_batch: int, context: int | None = None) -> TrainingMemory:
        return estimate_training_memory(
            model,
            micro_batch=micro_batch,
            device=device,
            context=context,
            shards=shards,
            lora=lora,
        )

    options = []
    smaller = _largest(micro - 1, lambda b: fits(estimate(b)))
    if smaller is not None:
        batch = smaller * config.grad_accum * processes
        options.append(f"--batch-size {batch}")
        first = max(config.grad_accum + 1, -(-config.batch_size // (processes * smaller)))
        accum = next(
            (
                k  # the first k that can do; a bounded search (a batch may be 2**62)
                for k in range(first, min(config.batch_size, first + _ACCUM_TRIES) + 1)
                if config.batch_size % (k * processes) == 0
                and config.batch_size // k // processes <= smaller
            ),
            None,
        )
        if accum is not None:
            options.append(
                f"--batch-size {config.batch_size} --grad-accum {accum} (the same batch, "
                f"{config.batch_size // accum // processes} sequence(s) at a time)"
            )
    context = _dims(model)["context"]
    shorter = context // 2
    while shorter >= 16 and not fits(estimate(micro, shorter)):
        shorter //= 2
    if shorter >= 16:
        options.append(f"--set context_length={shorter} (a new model)")
    if not options:
        floor = estimate(1, 16)
        if lora is not None:
            return (
                f"Even one sequence of 16 tokens needs about {format_bytes(floor.total)} with "
                "this LoRA: give it a smaller rank (--lora) or fewer targets (--lora-targets)."
            )
        return (
            f"Even one sequence of 16 tokens needs about {format_bytes(floor.total)}: the model "
            "is too large for this machine; make it smaller (--set n_layers=..., d_model=...)"
            + (", or shard it with --strategy fsdp under torchrun" if shards == 1 else "")
            + "."
        )
    return "Settings that fit: " + "; or ".join(options) + "."


_ACCUM_TRIES = 2**16  # --grad-accum values tried for the advice


def _largest(high: int, ok: Any) -> int | None:
    """The largest ``n`` in ``1..high`` with ``ok(n)``, where ``ok`` holds up to some ``n``
    and not beyond (an estimate grows with the batch), by bisection; ``None`` if none."""
    low = 0  # ok(low) is taken as true; ok(high + 1) false
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if ok(mid) else (low, mid - 1)
    return low or None


#: How torch says an allocation failed (CPU, CUDA, MPS), beside ``torch.OutOfMemoryError``.
_OUT_OF_MEMORY = ("can't allocate memory", "out of memory", "cannot allocate memory")


@contextlib.contextmanager
def out_of_memory_refused() -> Iterator[None]:
    """Turn an allocation that fails inside (``MemoryError``, torch's ``OutOfMemoryError`` or
    its CPU allocator's ``RuntimeError``) into an
    :class:`~zoo.errors.InsufficientMemoryError` that says what happened and what to do: the
    estimate checked before step 1 cannot see other processes, and ``ZOO_ALLOW_LARGE=1``
    skips it."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        text = str(exc).strip()
        if not isinstance(exc, MemoryError) and not any(
            words in text.lower() for words in _OUT_OF_MEMORY
        ):
            raise
        said = (text.splitlines()[0] if text else type(exc).__name__)[:300]
        raise InsufficientMemoryError(
            f"training ran out of memory ({said}). The estimate checked before step 1 does not "
            f"see what other processes take, and {ALLOW_LARGE_ENV}=1 skips it: free memory, or "
            "train with less (a smaller --batch-size or a larger --grad-accum, a smaller --lora "
            "rank, a shorter context_length)."
        ) from exc
