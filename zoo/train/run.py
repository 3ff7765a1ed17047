"""A run under way: :class:`Run`, what the loop's parts share (the model, its data, optimizer,
generator, log and budget, the step reached), and what they all say about it: its record in
``<out>/run.json``, the error when it diverges, whether its weights are still finite."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..nn.base import ZooModel
from .config import TrainConfig
from .data_files import text_files
from .errors import DivergedError
from .report import MetricsLog, Progress, read_run_record, utc_now, write_run_record
from .task import DataSource, TaskSpec
from .time_budget import Budget
from .world import World, any_rank

if TYPE_CHECKING:
    from ..kernels.threads import DecodeThreads
    from .adapter import AdapterRun

__all__ = ["Run", "diverged", "finite", "open_record", "seed", "write_record"]


@dataclasses.dataclass
class Run:
    """A run under way: what the optimizer step and the evaluation
    (:mod:`zoo.train.steps`) and the loop's checkpoints share."""

    model: ZooModel  # unwrapped (FSDP2 shards it in place)
    wrapped: nn.Module  # what the forward pass calls (DDP's wrapper, or the model)
    spec: TaskSpec
    source: DataSource
    optimizer: torch.optim.Optimizer
    generator: torch.Generator  # the data order
    config: TrainConfig
    world: World
    out: Path
    tok: Any
    context: int
    history: list[dict[str, Any]]
    metrics: MetricsLog
    progress: Progress
    budget: Budget
    say: Callable[[str], None]
    title: str
    start: int  # the step resumed from
    step: int = 0
    saved_at: int | None = None  # the step of the last good checkpoint
    val_loss: float | None = None
    losses: list[float] = dataclasses.field(default_factory=list)
    plotting: bool = False
    plotted: int = -1  # the length of the history last drawn
    began: float = 0.0
    record: dict[str, Any] = dataclasses.field(default_factory=dict)  # run.json
    earlier: float = 0.0  # wall seconds of the earlier calls this run resumed
    adapter: AdapterRun | None = None  # a LoRA run: what it adapts (zoo.train.adapter)
    threads: DecodeThreads | None = None  # each step's CPU threads (None: torch's, untouched)

    @property
    def micro(self) -> int:
        """Sequences per micro-step, all ranks together."""
        return self.config.batch_size // self.config.grad_accum

    @property
    def mine(self) -> slice:
        """This rank's rows of a micro-batch."""
        micro, world = self.micro, self.world
        return slice(world.rank * micro // world.size, (world.rank + 1) * micro // world.size)


def seed(config: TrainConfig, offset: int) -> int:
    """The seed ``offset`` after ``config.seed``, wrapped modulo 2**64 as torch wraps a
    negative one (the same seed as ``config.seed + offset`` wherever that is in range)."""
    return (config.seed + offset) % 2**64


def open_record(run: Run, data: str | os.PathLike[str]) -> None:
    """Start ``<out>/run.json`` (rank 0): the data, the settings ``zoo info`` shows, when
    the run began and the wall time of the calls it resumed."""
    if not run.world.main:
        return
    earlier = read_run_record(run.out) if run.start else {}  # a new run starts a new record
    seconds = earlier.get("seconds")
    run.earlier = float(seconds) if isinstance(seconds, (int, float)) and run.start else 0.0
    started = earlier.get("started")
    run.record = {
        "model": run.model.name,
        "task": run.spec.name,
        "data": str(Path(data).resolve()),
        "files": len(text_files(data)),
        "steps": run.config.steps,
        "batch_size": run.config.batch_size,
        "context": run.context,
        "started": started if isinstance(started, str) else utc_now(),
    }
    if run.adapter is not None:
        base = run.adapter.base
        run.record["adapter"] = {
            "rank": run.adapter.lora.rank,
            "alpha": run.adapter.lora.alpha,
            "parts": len(run.adapter.plans),
            "base": base.name or base.repo,
            "quantize": run.adapter.quantize,
        }
    write_record(run, "running")


def write_record(run: Run, state: str) -> None:
    """Bring ``<out>/run.json`` up to date: steps done, wall time, ``state`` (``"running"``
    or why the run stopped)."""
    if not run.world.main:
        return
    seconds = run.earlier + run.budget.used()
    run.record.update(step=run.step, seconds=round(seconds, 3), updated=utc_now(), stopped=state)
    write_run_record(run.out, run.record)


def diverged(what: str, step: int, lr: float, run: Run) -> DivergedError:
    """The error of a run that diverged at ``step``: what went wrong and which checkpoint
    still holds good weights."""
    out, saved_at = run.out, run.saved_at
    kept = (
        f"{out / 'checkpoint'} still holds step {saved_at} (nothing was saved over it)"
        if saved_at
        else "no checkpoint was saved"
    )
    return DivergedError(
        f"step {step}: {what} (learning rate {lr:.3g}): the run diverged; {kept}. Lower --lr, "
        f"lengthen --warmup or keep --clip on, and start again (another --out, or delete "
        f"{out / 'checkpoint'}: a resumed run must keep its settings)"
    )


def finite(model: ZooModel, world: World) -> bool:
    """Whether every weight is finite, on every rank (each checks its own shards)."""
    from torch.distributed.tensor import DTensor

    bad = False
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            if not bool(torch.isfinite(local).all()):
                bad = True
                break
    return not any_rank(bad, world)
