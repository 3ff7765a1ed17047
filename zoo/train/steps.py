"""What a run computes: :func:`optimizer_step` (one optimizer step over ``grad_accum``
micro-batches, each rank on its slice of the global batch) and :func:`evaluate` (the held-out
loss), through :func:`loss_of`, the model's task loss on one batch."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.base import ZooModel
from .config import TrainConfig
from .data import IGNORE
from .report import plot_losses
from .run import Run, diverged, seed
from .task import DataSource, TaskSpec, token_loss
from .world import World, mean

__all__ = ["evaluate", "evaluate_now", "loss_of", "optimizer_step", "share"]


def optimizer_step(run: Run, lr: float) -> float:
    """One optimizer step at learning rate ``lr`` over ``grad_accum`` micro-batches; returns
    its loss, the mean over the ranks (the same on every rank: all stop together)."""
    config, world = run.config, run.world
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    total = 0.0
    for k in range(config.grad_accum):
        inputs, targets = run.source.batch("train", run.micro, run.generator)  # global batch
        last_micro = k + 1 == config.grad_accum
        no_sync = getattr(run.wrapped, "no_sync", contextlib.nullcontext)  # DDP only
        with contextlib.nullcontext() if last_micro else no_sync():
            mine = {name: value[run.mine] for name, value in inputs.items()}
            with torch.autocast(world.device.type, torch.bfloat16, enabled=config.bf16):
                loss = loss_of(run.wrapped, mine, targets[run.mine], world.device, run.spec.loss)
            if world.size > 1:
                loss = loss * share(targets, run.mine, world.size)
            (loss / config.grad_accum).backward()
        total += float(loss.detach()) / config.grad_accum
    loss_value = mean(total, world)
    if not math.isfinite(loss_value):
        run.metrics.append({"step": run.step + 1, "loss": None, "lr": lr, "diverged": True})
        raise diverged(f"the training loss is {loss_value}", run.step + 1, lr, run)
    if config.clip:
        nn.utils.clip_grad_norm_(run.model.parameters(), config.clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss_value


def share(targets: Tensor, mine: slice, ranks: int) -> float:
    """The weight of this rank's mean loss: its part of the micro-batch's counted targets
    (not ``IGNORE``), times the number of ranks. DDP and FSDP2 average the ranks' gradients
    and the loop their losses, so the result is the whole micro-batch's mean, as on one
    process, when rows count different numbers of targets (padded pairs); 1 when they count
    the same (text windows, labels)."""
    counted = targets != IGNORE
    return float(counted[mine].sum()) * ranks / float(counted.sum())


def evaluate_now(run: Run, record: dict[str, Any], lr: float) -> None:
    """Evaluate, then log the step's record with its ``val_loss`` and redraw the plot."""
    eval_began = time.monotonic()
    val_loss = evaluate(run.model, run.source, run.config, run.world, run.spec)
    if not math.isfinite(val_loss):
        raise diverged(f"the held-out loss is {val_loss}", run.step, lr, run)
    run.val_loss = record["val_loss"] = val_loss
    run.say(f"step {run.step}: loss {record['loss']:.4f}, val {val_loss:.4f}")
    run.history.append(record)
    run.metrics.append(record)
    if run.plotting:
        plot_losses(run.out / "loss.png", run.history, title=run.title)
        run.plotted = len(run.history)
    run.budget.evaluated(time.monotonic() - eval_began)


def loss_of(
    model: nn.Module,
    inputs: dict[str, Tensor],
    targets: Tensor,
    device: torch.device,
    loss: Callable[[nn.Module, dict[str, Tensor], Tensor], Tensor] = token_loss,
) -> Tensor:
    """``loss`` (a task spec's; default the mean token cross-entropy, padding ignored) of
    ``model`` on ``inputs`` and ``targets`` moved to ``device``."""
    return loss(model, {k: v.to(device) for k, v in inputs.items()}, targets.to(device))


def evaluate(
    model: ZooModel,
    source: DataSource,
    config: TrainConfig,
    world: World,
    spec: TaskSpec,
    batches: int | None = None,
) -> float:
    """Mean loss on the same ``eval_batches`` held-out windows every time (its own seed);
    the first ``batches`` of them when given."""
    generator = torch.Generator().manual_seed(seed(config, 1))
    count = config.eval_batches if batches is None else batches
    model.eval()
    total = 0.0
    with torch.no_grad():
        for _ in range(count):
            inputs, targets = source.batch("val", config.batch_size // config.grad_accum, generator)
            total += float(loss_of(model, inputs, targets, world.device, spec.loss))
    model.train()
    return total / count  # every rank computes the same batches: no reduce
