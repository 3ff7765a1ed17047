"""What a training run does: a frozen, validated config."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..errors import ConfigError
from ..fields import check_fields, check_seed, short_int

__all__ = ["TrainConfig"]

_ZERO = {
    "warmup": "no warm-up",
    "eval_every": "evaluate only at the end",
    "checkpoint_every": "checkpoint only at the end and on a signal",
}
_FLOATS = ("lr", "min_lr", "weight_decay", "clip", "val_fraction", "time_budget", "loss_target")
_COUNTS = (
    "steps", "batch_size", "grad_accum", "warmup", "eval_every", "eval_batches", "checkpoint_every"
)  # fmt: skip
#: Bounds on what a count controls (``--eval-batches 4611686018427387904`` was once taken,
#: and the run never ended): a billion optimizer steps (the longest published runs
#: take about a million; warm-up, evaluation and checkpoint intervals are steps too), a
#: million sequences a step, and 10,000 batches an evaluation (held-out batches are drawn
#: again and again from the same windows; each costs a forward pass as long as a step's).
MAX_STEPS = 10**9
MAX_BATCH = 2**20
MAX_EVAL_BATCHES = 10_000
_BOUNDS = {
    "steps": (MAX_STEPS, "a billion optimizer steps"),
    "warmup": (MAX_STEPS, "the run's steps are at most a billion"),
    "eval_every": (MAX_STEPS, "the run's steps are at most a billion"),
    "checkpoint_every": (MAX_STEPS, "the run's steps are at most a billion"),
    "batch_size": (MAX_BATCH, "a million sequences a step; memory bounds each micro-step"),
    "eval_batches": (MAX_EVAL_BATCHES, "each is a forward pass as long as a step's"),
}
_MAY_CHANGE_ON_RESUME = frozenset(
    {"eval_every", "eval_batches", "checkpoint_every", "time_budget", "loss_target"}
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Hyper-parameters of :func:`zoo.train.train` (nanoGPT's names where they exist).

    Args:
        steps: optimizer steps to run (the schedule's length; at most a billion, as are
            the warm-up and the evaluation and checkpoint intervals).
        batch_size: sequences per optimizer step, across every process and accumulation
            step, each of the model's context_length tokens (at most 2**20).
        grad_accum: micro-batches per optimizer step (``batch_size`` must divide by
            ``grad_accum`` times the number of processes).
        lr: peak learning rate.
        min_lr: where the cosine decay ends, at ``steps``.
        warmup: steps of linear warm-up from 0 to ``lr`` (a run that is not longer than its
            warm-up never reaches ``lr`` nor decays: it says so in its first lines).
        weight_decay: AdamW decay of the matrices (never of norms, biases, embeddings).
        betas: AdamW betas.
        clip: gradient-norm clipping (0: none).
        eval_every: steps between evaluations on the held-out split (0: only at the end).
        eval_batches: batches per evaluation, the same held-out ones each time (at most
            10,000).
        checkpoint_every: steps between resumable checkpoints (0: only at the end and on a
            signal; ``None``: at every evaluation, every ``eval_every`` steps).
        seed: makes the run repeatable (initialisation, data order, dropout): an integer
            from 0 to 2**64 - 1 (negative ones down to -2**63 wrap around), as
            :func:`zoo.generate` takes.
        val_fraction: the last part of the data held out for evaluation.
        time_budget: seconds of wall time for one call (data preparation included; 0: no
            budget): a step that would end past it, with the final evaluation and
            checkpoint, is not started (estimated from measured steps, evaluations and
            saves, and one held-out batch timed before step 1); a budget that cannot fit
            one step with them is refused before it.
        loss_target: stop once the evaluated loss is at most this (0: no target).
        bf16: run forward and loss under bfloat16 autocast (weights and optimizer state stay
            float32); CUDA and recent CPUs support it.
    """

    steps: int = 1000
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    clip: float = 1.0
    eval_every: int = 200
    eval_batches: int = 20
    checkpoint_every: int | None = None
    seed: int = 0
    val_fraction: float = 0.1
    time_budget: float = 0.0
    loss_target: float = 0.0
    bf16: bool = False

    def __post_init__(self) -> None:
        check_fields(self)  # types, by annotation (zoo.fields): a bool is not a number here
        self._check_ranges()

    def _check_ranges(self) -> None:
        """Counts, intervals, rates and fractions within their ranges."""
        for name in _FLOATS:
            if getattr(self, name) < 0:
                raise ConfigError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        self._check_counts()
        if not self.lr > 0 or self.min_lr > self.lr:
            raise ConfigError(f"need 0 < min_lr <= lr, got lr={self.lr}, min_lr={self.min_lr}")
        if not 0 < self.val_fraction < 1:
            raise ConfigError(
                f"TrainConfig.val_fraction must be in (0, 1), got {self.val_fraction}"
            )
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"TrainConfig.betas must be two numbers in [0, 1), got {self.betas}")
        self._check_bounds()
        check_seed(self.seed)  # the range zoo generate takes: the one a torch.Generator takes

    def _check_bounds(self) -> None:
        """Each count within what it controls (:data:`MAX_STEPS`, :data:`MAX_BATCH`,
        :data:`MAX_EVAL_BATCHES`; ``grad_accum`` at most ``batch_size``, which it divides)."""
        bounds = {**_BOUNDS, "grad_accum": (self.batch_size, "it divides --batch-size")}
        for name in _COUNTS:
            value = getattr(self, name)
            high, why = bounds[name]
            if value is not None and value > high:
                raise ConfigError(
                    f"TrainConfig.{name} (--{name.replace('_', '-')}) must be at most "
                    f"{high:,} ({why}), got {short_int(value)}"
                )

    def _check_counts(self) -> None:
        """Counts at least 1, intervals at least 0 (what 0 means said)."""
        for name in ("steps", "batch_size", "grad_accum", "eval_batches"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"TrainConfig.{name} must be at least 1, got {getattr(self, name)}"
                )
        for name in ("warmup", "eval_every", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(
                    f"TrainConfig.{name} must be >= 0 (0: {_ZERO[name]}), got {value}"
                )

    @property
    def checkpoint_interval(self) -> int:
        """Steps between periodic checkpoints (0: none): ``checkpoint_every``, or
        ``eval_every`` when it is ``None``."""
        return self.eval_every if self.checkpoint_every is None else self.checkpoint_every

    def trajectory(self) -> dict[str, Any]:
        """The fields that decide which steps a run takes (JSON-ready): a run resumes only
        with the same ones. The others (evaluation, checkpoints, when to stop) may change."""
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in dataclasses.fields(self)
            if f.name not in _MAY_CHANGE_ON_RESUME
        }

    def lr_at(self, step: int) -> float:
        """Linear warm-up to ``lr``, then cosine decay to ``min_lr`` at ``steps``."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.steps - self.warmup))
        return self.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (self.lr - self.min_lr)
