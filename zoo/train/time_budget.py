"""The time budget of a run: whether another step, then the final evaluation and checkpoint,
still ends in time (and before step 1, whether one can); and the words for why a run
stopped."""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable

from .config import TrainConfig
from .world import World

__all__ = ["Budget", "stop_reason"]


#: Bytes a second a checkpoint is taken to be written at before one is measured: a slow disk
#: (a laptop SSD writes many times faster), so that the first estimate errs on the budget's
#: side.
WRITE_RATE = 100 * 10**6


class Budget:
    """Predicts whether another step, then the final evaluation and checkpoint, ends within
    ``config.time_budget`` seconds of ``clock`` (a ``now()`` reading).

    The estimates are measured and follow the run: a step lasts as long as the longest of the
    last ten (the first step, which pays for warm-up, is left out once another is measured);
    an evaluation as long as the last one, or before any, ``eval_batches`` times the one
    held-out batch timed before step 1 (:meth:`probed`), and never less than the steps now
    imply (:meth:`eval_estimate`); a save as long as the last one, or before any, its bytes
    at :data:`WRITE_RATE`. ``now`` is the clock (injectable: tests
    drive a fake one)."""

    def __init__(
        self,
        config: TrainConfig,
        world: World,
        clock: float,
        *,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config, self.world, self.clock, self.now = config, world, clock, now
        self.steps: list[float] = []
        self.eval: float | None = None
        self.eval_batch: float | None = None  # one held-out batch, timed before step 1
        self.save = 0.0
        self.saved_once = False
        self.needed = 0.0
        self.first_step_over = False  # the first step alone ended past the budget
        self.at_first_step = 0.0

    def probed(self, batch_seconds: float, checkpoint_bytes: int) -> None:
        """Before step 1: one held-out batch took ``batch_seconds``, and a checkpoint will
        write about ``checkpoint_bytes`` (weights and optimizer state)."""
        self.eval_batch = batch_seconds
        self.save = checkpoint_bytes / WRITE_RATE

    def stepped(self, seconds: float) -> None:
        """A training step took ``seconds``."""
        self.steps.append(seconds)

    def evaluated(self, seconds: float) -> None:
        """An evaluation took ``seconds``."""
        self.eval = seconds

    def saved(self, seconds: float) -> None:
        """A checkpoint took ``seconds``."""
        self.save, self.saved_once = seconds, True

    def used(self) -> float:
        """Seconds since the run's clock started."""
        return self.now() - self.clock

    def step_estimate(self) -> float:
        """The next step's duration: the longest of the last ten, the first step left out
        once a later one is measured (it pays for warm-up: allocation, kernel choice)."""
        recent = self.steps[1:] or self.steps
        return max(recent[-10:]) if recent else self.first_step_floor()

    def first_step_floor(self) -> float:
        """The least a step can take before one is measured: a forward pass of this process's
        share of the batch (the backward pass takes about twice as long again)."""
        config = self.config
        return (self.eval_batch or 0.0) * config.grad_accum / self.world.size

    def eval_estimate(self) -> float:
        """An evaluation's duration: the last one measured, else ``eval_batches`` times the
        batch timed before step 1; and at least ``eval_batches`` forward passes of a third of
        a training micro-step each (forward and backward take about 3 forward passes), which
        follows the steps when the machine slows down after the last measurement."""
        config = self.config
        steady = self.steps[1:][-10:]  # not the first: its warm-up is no forward pass's
        micro_step = (max(steady) if steady else 0.0) * self.world.size / config.grad_accum
        following = config.eval_batches * micro_step / 3
        if self.eval is not None:
            return max(self.eval, following)
        if self.eval_batch is not None:
            return max(config.eval_batches * self.eval_batch, following)
        # nothing probed: each batch as long as a micro-step (about 3 times too long)
        return config.eval_batches * self.step_estimate() * self.world.size / config.grad_accum

    def finish_estimate(self) -> float:
        """The final evaluation and two saves (the checkpoint, then the model)."""
        return self.eval_estimate() + 2 * self.save

    def exhausted(self, *, now_eval: bool, now_save: bool) -> bool:
        """Whether this step's evaluation and save (``now_eval``, ``now_save``), another
        step and the finish would end past the budget (never, without one)."""
        if not self.config.time_budget:
            return False
        now = (self.eval_estimate() if now_eval else 0.0) + (self.save if now_save else 0.0)
        self.needed = now + self.step_estimate() + self.finish_estimate()
        used = self.used()
        if len(self.steps) == 1 and used > self.config.time_budget:
            self.first_step_over, self.at_first_step = True, used
        return used + self.needed > self.config.time_budget

    def cannot_start(self) -> str | None:
        """Before step 1: why not even one step, the final evaluation and the checkpoint can
        end within the budget (each taken at its least: a step as one forward pass), in
        words with the figures; ``None`` when they may."""
        limit = self.config.time_budget
        if not limit:
            return None
        used, step, finish = self.used(), self.first_step_floor(), self.finish_estimate()
        if used + step + finish <= limit:
            return None
        return (
            f"time budget ({limit:g} s) cannot fit one step: {used:.1f} s are used already "
            f"(data preparation included), and a step (at least {step:.1f} s), the final "
            f"evaluation ({self.config.eval_batches} held-out batches, ~{self.eval_estimate():.1f}"
            f" s) and the checkpoint (~{2 * self.save:.1f} s) need ~{step + finish:.1f} s more. "
            f"Give --time-budget {math.ceil(used + 3 * step + finish)} or more (a step is about "
            "3 forward passes), or fewer --eval-batches; a second run on the same --out reuses "
            "its prepared data"
        )


def stop_reason(
    stopped: str,
    signum: int | None,
    val_loss: float | None,
    config: TrainConfig,
    budget: Budget,
) -> str:
    """Why the run stopped, in words."""
    if stopped == "signal" and signum:
        name = signal.Signals(signum).name
        return f"{name} (checkpoint saved: run the same command again to resume)"
    if stopped == "loss_target":
        return f"loss target reached (val {val_loss:.4f} <= {config.loss_target:g})"
    limit = config.time_budget
    if budget.first_step_over:
        return (
            f"time budget ({limit:g} s): the first step alone ended past it, "
            f"{budget.at_first_step:.1f} s after the start (data preparation included)"
        )
    return (
        f"time budget ({limit:g} s): {budget.used():.1f} s used; another step with the final "
        f"evaluation and checkpoint (~{budget.needed:.1f} s) would end past it"
    )
