"""The time budget of a run: whether another step, then the final evaluation and checkpoint,
still ends in time; and the words for why a run stopped."""

from __future__ import annotations

import signal
import time

from .config import TrainConfig
from .world import World

__all__ = ["Budget", "stop_reason"]


class Budget:
    """Predicts whether another step, then the final evaluation and checkpoint, ends within
    ``config.time_budget`` seconds of ``clock`` (measured durations; the longest of the
    last steps, as step times vary)."""

    def __init__(self, config: TrainConfig, world: World, clock: float) -> None:
        self.config, self.world, self.clock = config, world, clock
        self.steps: list[float] = []
        self.eval: float | None = None
        self.save = 0.0
        self.needed = 0.0
        self.first_step_over = False  # the first step alone ended past the budget
        self.at_first_step = 0.0

    def stepped(self, seconds: float) -> None:
        """A training step took ``seconds``."""
        self.steps.append(seconds)

    def evaluated(self, seconds: float) -> None:
        """An evaluation took ``seconds``."""
        self.eval = seconds

    def saved(self, seconds: float) -> None:
        """A checkpoint took ``seconds``."""
        self.save = seconds

    def used(self) -> float:
        """Seconds since the run's clock started."""
        return time.monotonic() - self.clock

    def step_estimate(self) -> float:
        """The next step's duration: the longest of the last ten."""
        return max(self.steps[-10:]) if self.steps else 0.0

    def finish_estimate(self) -> float:
        """The final evaluation and two saves (the checkpoint, then the model). Before an
        evaluation is measured, each of its ``eval_batches`` forward passes (of a whole
        micro-batch, on every process) is taken to last as long as a training micro-step:
        an over-estimate (about 3 times) that errs on the side of the budget."""
        config = self.config
        prior = config.eval_batches * self.step_estimate() * self.world.size / config.grad_accum
        return (self.eval if self.eval is not None else prior) + 2 * self.save

    def exhausted(self, *, now_eval: bool, now_save: bool) -> bool:
        """Whether this step's evaluation and save (``now_eval``, ``now_save``), another
        step and the finish would end past the budget (never, without one)."""
        if not self.config.time_budget:
            return False
        finish = self.finish_estimate()
        now = (finish - 2 * self.save if now_eval else 0.0) + (self.save if now_save else 0.0)
        self.needed = now + self.step_estimate() + finish
        used = self.used()
        if len(self.steps) == 1 and used > self.config.time_budget:
            self.first_step_over, self.at_first_step = True, used
        return used + self.needed > self.config.time_budget


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
