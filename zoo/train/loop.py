"""The training loop: one process, or several under ``torchrun`` (DDP or FSDP2), the same code
for every task.

What differs between a decoder LM, a classifier and an encoder-decoder (the data, the loss, the
blocks FSDP2 shards) is the model's :class:`~zoo.train.task.TaskSpec` (see
:mod:`zoo.train.task`: a model class declares ``train_task``); the loop itself is
:func:`_step` (one optimizer step), :func:`_evaluate_now` (the held-out loss, its log line
and plot) and :func:`_checkpoint` (the resumable state), run by :func:`_train` until the steps
are done or something asks it to stop.

Every process draws the same global batch from one seeded generator and trains on its own
slice of it, so a run on N processes with global batch B takes the same steps as one process
with batch B. Only rank 0 logs and writes. A resumable checkpoint (``<out>/checkpoint/``:
the model as a zoo checkpoint, the optimizer state in safetensors, step, data generator and
RNG states in safetensors and JSON; never pickle) is written atomically, and a run started
again on the same ``out`` folder continues from it bit for bit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..checkpoint import save
from ..devices import check_computes, check_device
from ..errors import ConfigError
from ..nn.base import ZooModel
from ..tokenizers.base import check_fits
from .budget import Budget, stop_reason
from .config import TrainConfig
from .data import IGNORE, DataError
from .errors import DivergedError, RunLockedError
from .memory import check_training_memory
from .report import (
    MetricsLog,
    Progress,
    can_plot,
    plot_losses,
    read_run_record,
    utc_now,
    write_run_record,
)
from .state import has_state, load_state, plain_model, save_state
from .task import DataRequest, DataSource, TaskSpec, task_of, token_loss
from .world import World, any_rank, barrier, join, max_rank, mean

__all__ = ["TrainResult", "train"]


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        model: the trained model (unwrapped, on its training device).
        checkpoint: ``<out>/model``, a zoo checkpoint (``zoo.load`` takes it).
        losses: the training loss of every step run by this call (resumed steps excluded).
        val_loss: the last evaluated held-out loss.
        steps: the optimizer steps done in all (resumed ones included).
        seconds: wall time of this call's training steps (evaluations and checkpoints
            included; data preparation and start-up not).
        stopped: why the run ended: ``"steps"`` (all ``config.steps`` done),
            ``"loss_target"``, ``"time_budget"`` or ``"signal"``.
        signal: the signal that stopped it (``signal.SIGINT``, ``signal.SIGTERM``), else
            ``None``.
    """

    model: ZooModel
    checkpoint: Path
    losses: list[float]
    val_loss: float | None
    steps: int
    seconds: float
    stopped: str = "steps"
    signal: int | None = None

    @property
    def interrupted(self) -> bool:
        """Whether a signal stopped the run (its checkpoint resumes it)."""
        return self.signal is not None


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


def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    groups = _param_groups(model, config.weight_decay)
    try:  # fused where torch offers it for this device
        return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas)


@contextlib.contextmanager
def _stop_requests() -> Iterator[Callable[[], int]]:
    """SIGINT/SIGTERM ask the loop to checkpoint and stop at the end of the step; the
    callable returns the first signal's number (0: none)."""
    asked: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        asked.append(signum)

    previous = {}
    with contextlib.suppress(ValueError):  # not the main thread: no handlers
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield lambda: asked[0] if asked else 0
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# -- the loop -------------------------------------------------------------------------------
def train(
    model: ZooModel,
    data: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    config: TrainConfig | None = None,
    tokenizer: Any = None,
    device: str | None = None,
    strategy: str = "ddp",
    log: Callable[[str], None] | None = print,
) -> TrainResult:
    """Train a zoo model: a decoder LM on text (random windows of ``context_length + 1``
    tokens), a classifier on labelled texts, or an encoder-decoder on source/target pairs
    (teacher forcing); the model's task spec (:mod:`zoo.train.task`) says which.

    SIGINT and SIGTERM end the step under way, evaluate, save a resumable checkpoint and
    *return* (no exception): ``result.interrupted`` is then true and ``result.signal`` names
    the signal (``zoo train`` exits with 128 + its number: 130, 143). Running again on the
    same ``out`` continues the run.

    Args:
        model: a zoo model, built (random init) or loaded (fine-tuning).
        data: for a decoder, a text file or a folder of ``.txt`` files, tokenized once with
            the model's tokenizer into ``<out>/data/`` (reused while text and tokenizer are the
            same); for a classifier, a ``text<TAB>label`` file; for an encoder-decoder, a
            ``source<TAB>target`` file.
        out: the run's folder: ``model/`` (the final zoo checkpoint), ``checkpoint/`` (to
            resume: running again on the same folder continues the run), ``metrics.jsonl``
            (a line per step, written as it happens) and ``loss.png`` (redrawn at each
            evaluation). One run at a time: the folder is locked while it trains.
        config: the hyper-parameters.
        tokenizer: defaults to the model's own (``model.tokenizer``, else its named model's).
        device: where to train (default CPU; under ``torchrun`` with ``cuda``, each rank's GPU).
        strategy: with several processes, ``"ddp"`` (every process holds the whole model) or
            ``"fsdp"`` (FSDP2: parameters, gradients and optimizer state sharded per block:
            the task spec's ``units``, then the root).
        log: where progress lines go (rank 0 only); ``None`` for silence.

    Raises:
        zoo.train.DataError: the data is missing, empty, not UTF-8 or shorter than a window.
        zoo.train.DivergedError: a loss or the weights became NaN or infinite; the last good
            checkpoint is kept (nothing non-finite is ever saved).
        zoo.train.ResumeError: ``<out>/checkpoint/`` is damaged, or was written for another
            model or with other settings.
        zoo.train.RunLockedError: another run is training into ``out``.
        zoo.errors.ConfigError: ``device`` is not one this machine has, or is the meta device
            (or ``model`` is on it: shapes without values); or ``config.time_budget`` cannot
            fit one step with the final evaluation and checkpoint (said before step 1).
    """
    clock = time.monotonic()  # the time budget counts from here
    if strategy not in ("ddp", "fsdp"):
        raise ValueError(f"strategy must be 'ddp' or 'fsdp', got {strategy!r}")
    config = config or TrainConfig()
    out = Path(out)
    check_computes(check_device(device), model, "train", "zoo train --device cpu")
    world = join(device)
    with contextlib.ExitStack() as stack:
        lock = _lock(out) if world.main else None
        if lock is not None:
            stack.callback(lock.release)
        if any_rank(world.main and lock is None, world):
            raise RunLockedError(
                f"{out} is being trained into by another run (it holds {out / _LOCK}); wait "
                "for it to finish or stop it, or train into another --out"
            )
        run = _start(model, data, out, config, tokenizer, world, strategy, log, clock, stack)
        return _train(run)
    raise AssertionError("unreachable")  # pragma: no cover


_LOCK = ".zoo-train-lock"


def _lock(out: Path) -> Any:
    """The run's lock on ``out`` (an OS file lock: a process killed with -9 loses it), or
    ``None`` when another process holds it."""
    from filelock import FileLock, Timeout

    out.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out / _LOCK), blocking=False)
    try:
        lock.acquire()
    except Timeout:
        return None
    return lock


@dataclasses.dataclass
class _Run:
    """A run under way: what :func:`_step`, :func:`_evaluate_now` and :func:`_checkpoint`
    share."""

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

    @property
    def micro(self) -> int:
        """Sequences per micro-step, all ranks together."""
        return self.config.batch_size // self.config.grad_accum

    @property
    def mine(self) -> slice:
        """This rank's rows of a micro-batch."""
        micro, world = self.micro, self.world
        return slice(world.rank * micro // world.size, (world.rank + 1) * micro // world.size)


def _tokenizer(model: ZooModel, tokenizer: Any) -> Any:
    """The tokenizer given, else the model's own, else its named model's."""
    from ..api import tokenizer as named_tokenizer

    tok = tokenizer or model.tokenizer or (named_tokenizer(model.name) if model.name else None)
    if tok is None:
        raise DataError("training on text needs a tokenizer: pass tokenizer=...")
    return tok


def _parallel(
    model: ZooModel, spec: TaskSpec, world: World, strategy: str, say: Callable[[str], None]
) -> nn.Module:
    """Spread ``model`` over the processes; returns what the forward pass calls."""
    if world.size > 1 and strategy == "fsdp":
        _shard(model, spec, world, say)
    elif world.size > 1:
        return nn.parallel.DistributedDataParallel(model)
    return model


def _seed(config: TrainConfig, offset: int) -> int:
    """The seed ``offset`` after ``config.seed``, wrapped modulo 2**64 as torch wraps a
    negative one (the same seed as ``config.seed + offset`` wherever that is in range)."""
    return (config.seed + offset) % 2**64


def _start(
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
) -> _Run:
    """Everything before step 1: checks, data, sharding, optimizer, seeds, the resumed state,
    the metrics log and the progress bar."""
    say = log if (log is not None and world.main) else (lambda _line: None)
    if config.batch_size % (config.grad_accum * world.size):
        raise ValueError(
            f"batch_size {config.batch_size} must divide by grad_accum x processes "
            f"({config.grad_accum} x {world.size})"
        )
    spec = task_of(model)
    tok = _tokenizer(model, tokenizer)
    check_fits(tok, model.config.vocab_size)  # type: ignore[attr-defined]
    check_training_memory(model, config, world.device, world.size, strategy)  # before step 1
    context: int = model.config.context_length  # type: ignore[attr-defined]
    request = DataRequest(data, tok, out, context, config.val_fraction, world)
    source = spec.read(model, request)

    model = model.to(world.device).train()
    wrapped = _parallel(model, spec, world, strategy, say)
    optimizer = _optimizer(model, config)  # after sharding: it holds the shards
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(_seed(config, world.rank))
    start, history = 0, list[dict[str, Any]]()
    if has_state(out):
        start, history = load_state(out, model, optimizer, generator, config)
        say(f"resumed {out / 'checkpoint'} at step {start}")
    plotting = world.main and can_plot()  # the import is paid here, not in a timed step
    budget = Budget(config, world, clock)
    if config.time_budget and start < config.steps:  # a refusal leaves no metrics behind
        _probe(budget, model, source, config, world, spec)
    metrics = stack.enter_context(MetricsLog(out / "metrics.jsonl", history, enabled=world.main))
    began = time.monotonic()
    progress = Progress(total=config.steps, initial=start, enabled=world.main and log is not None)
    stack.callback(progress.close)
    if progress.bar is not None and log is print:  # lines above the bar, not through it
        say = progress.write
    for line in _opening_lines(config, plotting):
        say(line)
    run = _Run(
        model, wrapped, spec, source, optimizer, generator, config, world, out, tok, context,
        history, metrics, progress, budget, say,
        title=f"{model.name or 'model'} on {data}",
        start=start,
        step=start,
        saved_at=start if start else None,
        val_loss=next((h["val_loss"] for h in reversed(history) if "val_loss" in h), None),
        plotting=plotting,
        began=began,
    )  # fmt: skip
    _open_record(run, data)
    return run


def _open_record(run: _Run, data: str | os.PathLike[str]) -> None:
    """Start ``<out>/run.json`` (rank 0): the data, the settings ``zoo info`` shows, when
    the run began and the wall time of the calls it resumed."""
    from .files import text_files

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
    _write_record(run, "running")


def _write_record(run: _Run, state: str) -> None:
    """Bring ``<out>/run.json`` up to date: steps done, wall time, ``state`` (``"running"``
    or why the run stopped)."""
    if not run.world.main:
        return
    seconds = run.earlier + run.budget.used()
    run.record.update(step=run.step, seconds=round(seconds, 3), updated=utc_now(), stopped=state)
    write_run_record(run.out, run.record)


def _opening_lines(config: TrainConfig, plotting: bool) -> list[str]:
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
        _evaluate(model, source, config, world, spec, batches=1)
        seconds.append(time.monotonic() - began)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    budget.probed(min(seconds), 3 * weights)  # weights and AdamW's two moments
    refusal = budget.cannot_start()
    if any_rank(refusal is not None, world):
        raise ConfigError(refusal or "time budget: another process cannot fit one step")


def _train(run: _Run) -> TrainResult:
    """Step until ``config.steps`` are done or the run is asked to stop."""
    stopped, signum = "steps", None
    with _stop_requests() as stop_asked:
        while run.step < run.config.steps:
            stopped, signum = _advance(run, stop_asked)
            if stopped != "steps":
                break
    return _finish(run, stopped, signum)


def _advance(run: _Run, stop_asked: Callable[[], int]) -> tuple[str, int | None]:
    """One step, then what follows it: the metrics record, an evaluation, a checkpoint;
    returns why the run stops (``"steps"``: it goes on) and the signal that stopped it."""
    config, world = run.config, run.world
    lr = config.lr_at(run.step)
    step_began = time.monotonic()
    loss = _step(run, lr)
    run.step += 1
    step = run.step
    run.budget.stepped(time.monotonic() - step_began)
    run.losses.append(loss)
    elapsed = time.monotonic() - run.began
    run.progress.update(
        loss=loss,
        lr=lr,
        tokens_per_second=config.batch_size * run.context * (step - run.start) / max(elapsed, 1e-9),
    )
    record: dict[str, Any] = {"step": step, "loss": loss, "lr": lr}
    last = step == config.steps
    periodic_eval = bool(config.eval_every and step % config.eval_every == 0)
    interval = config.checkpoint_interval
    periodic_save = bool(interval) and step % interval == 0
    out_of_time = not last and run.budget.exhausted(now_eval=periodic_eval, now_save=periodic_save)
    # every rank must agree to stop at the same step (a signal may reach one only)
    signum = max_rank(stop_asked(), world) or None
    interrupted = bool(signum) or any_rank(out_of_time, world)
    if periodic_eval or last or interrupted:  # the result's val_loss is the model's
        _evaluate_now(run, record, lr)
    else:
        run.history.append(record)
        run.metrics.append(record)
    stopped = _why_stop(run, signum, out_of_time)
    if stopped != "steps" or last or periodic_save:  # a collective under FSDP: every rank
        _checkpoint(run, lr)
    if stopped != "steps":
        reason = stop_reason(stopped, signum, run.val_loss, config, run.budget)
        run.say(f"stopped at step {step}: {reason}")
    return stopped, signum


def _step(run: _Run, lr: float) -> float:
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
                loss = _loss(run.wrapped, mine, targets[run.mine], world.device, run.spec.loss)
            if world.size > 1:
                loss = loss * _share(targets, run.mine, world.size)
            (loss / config.grad_accum).backward()
        total += float(loss.detach()) / config.grad_accum
    loss_value = mean(total, world)
    if not math.isfinite(loss_value):
        run.metrics.append({"step": run.step + 1, "loss": None, "lr": lr, "diverged": True})
        raise _diverged(f"the training loss is {loss_value}", run.step + 1, lr, run)
    if config.clip:
        nn.utils.clip_grad_norm_(run.model.parameters(), config.clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss_value


def _share(targets: Tensor, mine: slice, ranks: int) -> float:
    """The weight of this rank's mean loss: its part of the micro-batch's counted targets
    (not ``IGNORE``), times the number of ranks. DDP and FSDP2 average the ranks' gradients
    and the loop their losses, so the result is the whole micro-batch's mean, as on one
    process, when rows count different numbers of targets (padded pairs); 1 when they count
    the same (text windows, labels)."""
    counted = targets != IGNORE
    return float(counted[mine].sum()) * ranks / float(counted.sum())


def _evaluate_now(run: _Run, record: dict[str, Any], lr: float) -> None:
    """Evaluate, then log the step's record with its ``val_loss`` and redraw the plot."""
    eval_began = time.monotonic()
    val_loss = _evaluate(run.model, run.source, run.config, run.world, run.spec)
    if not math.isfinite(val_loss):
        raise _diverged(f"the held-out loss is {val_loss}", run.step, lr, run)
    run.val_loss = record["val_loss"] = val_loss
    run.say(f"step {run.step}: loss {record['loss']:.4f}, val {val_loss:.4f}")
    run.history.append(record)
    run.metrics.append(record)
    if run.plotting:
        plot_losses(run.out / "loss.png", run.history, title=run.title)
        run.plotted = len(run.history)
    run.budget.evaluated(time.monotonic() - eval_began)


def _why_stop(run: _Run, signum: int | None, out_of_time: bool) -> str:
    """``"signal"``, ``"time_budget"``, ``"loss_target"``, or ``"steps"`` (go on)."""
    target = run.config.loss_target
    if signum:
        return "signal"
    if out_of_time:
        return "time_budget"
    if target and run.val_loss is not None and run.val_loss <= target:
        return "loss_target"
    return "steps"


def _checkpoint(run: _Run, lr: float) -> None:
    """Save the resumable state (weights checked finite first; nothing non-finite is ever
    saved)."""
    save_began = time.monotonic()
    if not _finite(run.model, run.world):
        raise _diverged("a weight is NaN or infinite", run.step, lr, run)
    save_state(
        run.out, run.model, run.optimizer, run.step, run.generator, run.history, run.config,
        main=run.world.main, tokenizer=run.tok,
    )  # fmt: skip
    run.saved_at = run.step
    run.budget.saved(time.monotonic() - save_began)
    _write_record(run, "running")


def _finish(run: _Run, stopped: str, signum: int | None) -> TrainResult:
    """Write the final model (``<out>/model``) and the last plot; the result."""
    seconds = time.monotonic() - run.began
    run.progress.close()
    checkpoint = run.out / "model"
    world = run.world
    if not _finite(run.model, world):
        raise _diverged("a weight is NaN or infinite", run.step, run.config.lr_at(run.step), run)
    plain = plain_model(run.model)
    if world.main:
        plain.tokenizer = run.tok
        save(plain, checkpoint, tokenizer=run.tok)
        if not run.plotting:
            run.say("matplotlib is not installed: no loss.png (pip install 'torch-zoo[train]')")
        elif run.plotted != len(run.history):
            plot_losses(run.out / "loss.png", run.history, title=run.title)
        _write_record(run, stopped)
    barrier(world)
    return TrainResult(
        run.model, checkpoint, run.losses, run.val_loss, run.step, seconds, stopped, signum
    )


def _diverged(what: str, step: int, lr: float, run: _Run) -> DivergedError:
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


def _finite(model: ZooModel, world: World) -> bool:
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


def _loss(
    model: nn.Module,
    inputs: dict[str, Tensor],
    targets: Tensor,
    device: torch.device,
    loss: Callable[[nn.Module, dict[str, Tensor], Tensor], Tensor] = token_loss,
) -> Tensor:
    """``loss`` (a task spec's; default the mean token cross-entropy, padding ignored) of
    ``model`` on ``inputs`` and ``targets`` moved to ``device``."""
    return loss(model, {k: v.to(device) for k, v in inputs.items()}, targets.to(device))


def _evaluate(
    model: ZooModel,
    source: DataSource,
    config: TrainConfig,
    world: World,
    spec: TaskSpec,
    batches: int | None = None,
) -> float:
    """Mean loss on the same ``eval_batches`` held-out windows every time (its own seed);
    the first ``batches`` of them when given."""
    generator = torch.Generator().manual_seed(_seed(config, 1))
    count = config.eval_batches if batches is None else batches
    model.eval()
    total = 0.0
    with torch.no_grad():
        for _ in range(count):
            inputs, targets = source.batch("val", config.batch_size // config.grad_accum, generator)
            total += float(_loss(model, inputs, targets, world.device, spec.loss))
    model.train()
    return total / count  # every rank computes the same batches: no reduce
