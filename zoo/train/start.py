"""Everything a run does before step 1 (:func:`start`): the checks, the tokenizer, the data,
the processes' share of the model (DDP, or FSDP2 shards), the optimizer, the seeds, the state
of a resumed run, the time budget's probe, the metrics log, the progress bar and the lines
said first."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import ConfigError
from ..nn.base import ZooModel
from ..tokenizers.base import check_fits
from .config import TrainConfig
from .data import DataError
from .memory import check_training_memory
from .report import MetricsLog, Progress, can_plot
from .run import Run, open_record, seed
from .state import has_state, load_state
from .steps import evaluate
from .task import DataRequest, DataSource, TaskSpec, task_of
from .time_budget import Budget
from .world import World, any_rank

if TYPE_CHECKING:
    from .adapter import AdapterRun

__all__ = ["opening_lines", "optimizer", "start"]


def start(
    model: ZooModel,
    data: str | os.PathLike[str],
    out: Path,
    config: TrainConfig,
    tokenizer: Any,
    world: World,
    strategy: str,
    log: Callable[[str], None] | None,
    clock: float,
    stack: contextlib.ExitStack,
    adapter: AdapterRun | None = None,
) -> Run:
    """Everything before step 1: checks, data, sharding, optimizer, seeds, the resumed state,
    the metrics log and the progress bar (``adapter``: a LoRA run, its adapters attached)."""
    say = log if (log is not None and world.main) else (lambda _line: None)
    spec, tok, context, source = _prepare(
        model, data, out, config, tokenizer, world, strategy, adapter
    )
    model = model.to(world.device).train()
    wrapped = _parallel(model, spec, world, strategy, say)
    adamw = optimizer(model, config)  # after sharding: it holds the shards
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(seed(config, world.rank))
    begin, history = 0, list[dict[str, Any]]()
    if has_state(out):
        begin, history = load_state(out, model, adamw, generator, config, adapter)
        say(f"resumed {out / 'checkpoint'} at step {begin}")
    plotting = world.main and can_plot()  # the import is paid here, not in a timed step
    budget = Budget(config, world, clock)
    if config.time_budget and begin < config.steps:  # a refusal leaves no metrics behind
        _probe(budget, model, source, config, world, spec)
    metrics = stack.enter_context(MetricsLog(out / "metrics.jsonl", history, enabled=world.main))
    began = time.monotonic()
    progress = Progress(total=config.steps, initial=begin, enabled=world.main and log is not None)
    stack.callback(progress.close)
    if progress.bar is not None and log is print:  # lines above the bar, not through it
        say = progress.write
    for line in opening_lines(config, plotting):
        say(line)
    run = Run(
        model, wrapped, spec, source, adamw, generator, config, world, out, tok, context,
        history, metrics, progress, budget, say,
        title=f"{model.name or 'model'} on {data}",
        start=begin,
        step=begin,
        saved_at=begin if begin else None,
        val_loss=_last_val_loss(history),
        plotting=plotting,
        began=began,
        adapter=adapter,
    )  # fmt: skip
    open_record(run, data)
    return run


def _prepare(
    model: ZooModel,
    data: str | os.PathLike[str],
    out: Path,
    config: TrainConfig,
    tokenizer: Any,
    world: World,
    strategy: str,
    adapter: AdapterRun | None = None,
) -> tuple[TaskSpec, Any, int, DataSource]:
    """The checks that need no step (batch split, tokenizer size, memory), then the data:
    the model's task spec, the tokenizer, the context length and the data source."""
    if config.batch_size % (config.grad_accum * world.size):
        raise ValueError(
            f"batch_size {config.batch_size} must divide by grad_accum x processes "
            f"({config.grad_accum} x {world.size})"
        )
    spec = task_of(model)
    tok = _tokenizer(model, tokenizer)
    check_fits(tok, model.config.vocab_size)  # type: ignore[attr-defined]
    lora = None
    if adapter is not None:  # its step tensors too (its weights are the model's trainable ones)
        from .lora_memory import lora_shape

        lora = lora_shape(model, adapter.plans, dropout=adapter.lora.dropout, attached=True)
    check_training_memory(model, config, world.device, world.size, strategy, lora=lora)
    context: int = model.config.context_length  # type: ignore[attr-defined]
    request = DataRequest(data, tok, out, context, config.val_fraction, world)
    return spec, tok, context, spec.read(model, request)


def _last_val_loss(history: list[dict[str, Any]]) -> float | None:
    """The last held-out loss a resumed run's history records."""
    return next((h["val_loss"] for h in reversed(history) if "val_loss" in h), None)


def _tokenizer(model: ZooModel, tokenizer: Any) -> Any:
    """The tokenizer given, else the model's own, else its named model's (which the
    registry resolves)."""
    from ..plugin.current import get_registry

    tok = tokenizer or model.tokenizer
    if not tok and model.name:
        tok = get_registry().model_tokenizer(model.name).load()
    if tok is None:
        raise DataError("training on text needs a tokenizer: pass tokenizer=...")
    return tok


# -- optimizer ------------------------------------------------------------------------------
def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay the weight matrices; never norms, biases or embeddings (tied ones included)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay: list[nn.Parameter] = []
    keep: list[nn.Parameter] = []
    for p in {id(p): p for p in model.parameters() if p.requires_grad}.values():
        (decay if p.ndim >= 2 and id(p) not in embeddings else keep).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": keep, "weight_decay": 0.0},
    ]


def optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over ``model``'s trainable parameters (weight decay on the matrices only),
    fused where torch offers it for this device."""
    groups = _param_groups(model, config.weight_decay)
    try:  # fused where torch offers it for this device
        return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas)


# -- processes ------------------------------------------------------------------------------
def _parallel(
    model: ZooModel, spec: TaskSpec, world: World, strategy: str, say: Callable[[str], None]
) -> nn.Module:
    """Spread ``model`` over the processes; returns what the forward pass calls."""
    if world.size > 1 and strategy == "fsdp":
        _shard(model, spec, world, say)
    elif world.size > 1:
        return nn.parallel.DistributedDataParallel(model)
    return model


def _shard(model: ZooModel, spec: TaskSpec, world: World, say: Callable[[str], None]) -> None:
    """FSDP2: each of the spec's units (the blocks), then the root (embeddings, heads, final
    norms), sharded over the processes; gradients are reduce-scattered, optimizer state lives
    with the shards."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(world.device.type, (world.size,))
    units = spec.units(model)
    if not units:
        say(
            f"FSDP: {type(model).__name__} names no blocks for task {spec.name!r}: the whole "
            "model is sharded as one unit (declare a TaskSpec with units to shard per block)"
        )
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)


# -- before step 1 --------------------------------------------------------------------------
def opening_lines(config: TrainConfig, plotting: bool) -> list[str]:
    """What a run says before its first step about what it will not do as one might expect:
    a warm-up as long as the run (the learning rate never peaks nor decays), no loss plot."""
    lines = []
    if config.warmup >= config.steps:
        reached = config.lr_at(config.steps - 1)
        lines.append(
            f"warning: the warm-up ({config.warmup} steps) is not shorter than the run "
            f"({config.steps} steps): the learning rate reaches {reached:.3g} (the peak is "
            f"{config.lr:g}) at the last step and never decays to {config.min_lr:g}; a tenth "
            f"of the steps (--warmup {config.steps // 10}) reaches the peak, then decays"
        )
    if not plotting:
        lines.append(
            "no loss.png: matplotlib is not installed (pip install 'torch-zoo[train]'); "
            "metrics.jsonl records every step"
        )
    return lines


def _probe(
    budget: Budget,
    model: ZooModel,
    source: DataSource,
    config: TrainConfig,
    world: World,
    spec: TaskSpec,
) -> None:
    """Before step 1 of a run with a time budget: time one held-out batch (the first of
    every evaluation: no random state moves), twice, the first pass paying for warm-up, from
    which the budget estimates the final evaluation; refuse the run when even one step with
    that evaluation and the checkpoint cannot end in time (every rank together)."""
    seconds = []
    for _ in range(2):
        began = time.monotonic()
        evaluate(model, source, config, world, spec, batches=1)
        seconds.append(time.monotonic() - began)
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    budget.probed(min(seconds), 3 * weights)  # weights and AdamW's two moments
    refusal = budget.cannot_start()
    if any_rank(refusal is not None, world):
        raise ConfigError(refusal or "time budget: another process cannot fit one step")
