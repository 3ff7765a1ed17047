"""The training loop: one process, or several under ``torchrun`` (DDP or FSDP2), the same code
for every task.

What differs between a decoder LM, a classifier and an encoder-decoder (the data, the loss, the
blocks FSDP2 shards) is the model's :class:`~zoo.train.task.TaskSpec` (see
:mod:`zoo.train.task`: a model class declares ``train_task``). A run is started by
:mod:`zoo.train.start` (checks, data, sharding, optimizer, resumed state), computes in
:mod:`zoo.train.steps` (one optimizer step, the held-out loss) and shares its state as a
:class:`zoo.train.run.Run`; this module steps it (:func:`_advance`: the step, then its record,
evaluation and checkpoint) until the steps are done or something asks it to stop, and writes
the final model.

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
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..checkpoint import save
from ..devices import check_computes, check_device
from ..nn.base import ZooModel
from .config import TrainConfig
from .errors import RunLockedError
from .memory import out_of_memory_refused
from .report import plot_losses
from .run import Run, diverged, finite, write_record
from .start import start
from .state import plain_model, save_state
from .steps import evaluate_now, optimizer_step
from .time_budget import stop_reason
from .world import World, any_rank, barrier, join, max_rank

if TYPE_CHECKING:
    from ..adapters import BaseRecord
    from ..adapters.lora import LoRA, PartPlan
    from ..kernels.threads import DecodeThreads
    from .adapter import AdapterRun

__all__ = ["TrainResult", "train"]


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        model: the trained model (unwrapped, on its training device).
        checkpoint: ``<out>/model``, a zoo checkpoint (``zoo.load`` takes it); for a LoRA
            run, ``<out>/adapter``, the adapter in peft's format with its base's record.
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


@contextlib.contextmanager
def _stop_requests() -> Iterator[Callable[[], int]]:
    """SIGINT/SIGTERM ask the loop to checkpoint and stop at the end of the step; the
    callable returns the first signal's number (0: none). A second one stops at once
    (``KeyboardInterrupt``, without a new checkpoint): a step or an evaluation may be long,
    and without it nothing but SIGKILL ended one."""
    asked: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if asked:
            raise KeyboardInterrupt(f"signal {signum} again: stopped at once")
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
    adapter: LoRA | None = None,
    quantize: str | None = None,
    base: BaseRecord | None = None,
    threads: int | str | None = None,
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
        adapter: train a LoRA (:class:`zoo.LoRA`) instead of the whole model: the model (the
            base) is frozen, adapters are attached to the LoRA's targets (default: the
            family's, see :mod:`zoo.adapters.lora`) and only they are trained, checkpointed and
            written, as ``<out>/adapter/`` (peft's files and the base's name, repo, revision
            and sha256), not ``<out>/model``. The adapters start from ``config.seed``.
            AdamW decays the adapters' two matrices as any weight matrix
            (``config.weight_decay``), as transformers' Trainer does.
        quantize: with ``adapter``, train on a base quantized to ``"int8"`` or ``"int4"``
            (QLoRA; the fingerprint is of the float weights, taken before).
        base: with ``adapter``, the base's name, repo and revision to record (its sha256 is
            computed here); default: the model's name.
        threads: each CPU step's thread count: ``None`` leaves torch's alone (a library
            call does not change the process's), ``"auto"`` takes the cores other processes
            leave free, re-read as the run goes (:class:`zoo.kernels.threads.DecodeThreads`:
            ``zoo train``'s default, as decoding's), a number fixes it.

    Raises:
        zoo.train.DataError: the data is missing, empty, not UTF-8 or shorter than a window.
        zoo.train.DivergedError: a loss or the weights became NaN or infinite; the last good
            checkpoint is kept (nothing non-finite is ever saved).
        zoo.train.ResumeError: ``<out>/checkpoint/`` is damaged, or was written for another
            model or with other settings.
        zoo.train.RunLockedError: another run is training into ``out``.
        ValueError: a LoRA target the model does not have (the names it has are listed),
            ``quantize`` without ``adapter``, or a LoRA under ``strategy="fsdp"`` with
            several processes.
        zoo.errors.ConfigError: ``device`` is not one this machine has, or is the meta device
            (or ``model`` is on it: shapes without values); or ``config.time_budget`` cannot
            fit one step with the final evaluation and checkpoint (said before step 1).
    """
    clock = time.monotonic()  # the time budget counts from here
    if threads is not None and threads != "auto" and not _a_count(threads):
        raise ValueError(f"threads must be None, 'auto' or a count >= 1, got {threads!r}")
    if strategy not in ("ddp", "fsdp"):
        raise ValueError(f"strategy must be 'ddp' or 'fsdp', got {strategy!r}")
    config = config or TrainConfig()
    out = Path(out)
    if quantize is not None and adapter is None:
        raise ValueError(
            f"quantize={quantize!r} needs adapter=zoo.LoRA(...): a quantized base is frozen, "
            "only a LoRA on it trains (QLoRA)"
        )
    check_computes(check_device(device), model, "train", "zoo train --device cpu")
    world = join(device)
    _check_strategy(adapter, strategy, world)
    adapting = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(out_of_memory_refused())  # an allocation that fails: one line
        if adapter is not None:  # a wrong target is refused before the folder is touched
            adapting = _adapt(model, adapter, config, world, base, quantize)
        lock = _lock(out) if world.main else None
        if lock is not None:
            stack.callback(lock.release)
        if any_rank(world.main and lock is None, world):
            raise RunLockedError(
                f"{out} is being trained into by another run (it holds {out / _LOCK}); wait "
                "for it to finish or stop it, or train into another --out"
            )
        run = start(
            model, data, out, config, tokenizer, world, strategy, log, clock, stack, adapting
        )
        run.threads = _step_threads(threads, run)
        return _train(run)
    raise AssertionError("unreachable")  # pragma: no cover


_LOCK = ".zoo-train-lock"


def _a_count(threads: object) -> bool:
    return isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1


def _step_threads(threads: int | str | None, run: Run) -> DecodeThreads | None:
    """The thread policy of ``run``'s steps (:func:`train`'s ``threads``), off the CPU none."""
    from ..kernels.threads import DecodeThreads

    if threads is None:
        return None
    device = next(run.model.parameters()).device
    return DecodeThreads.for_device(device, None if threads == "auto" else int(threads))


def _adapt(
    model: ZooModel,
    adapter: LoRA,
    config: TrainConfig,
    world: World,
    base: BaseRecord | None,
    quantize: str | None,
) -> AdapterRun:
    """Plan ``adapter`` on ``model``, refuse a plan whose run cannot fit (before anything
    of it is allocated, :func:`~zoo.train.lora_memory.check_lora_plan`), then quantize,
    freeze and attach (:func:`~zoo.train.adapter.adapt`)."""
    from .adapter import adapt
    from .lora_memory import check_lora_plan

    def check(plans: dict[str, PartPlan]) -> None:
        check_lora_plan(
            model, plans, config, world.device, world.size,
            dropout=adapter.dropout, quantize=quantize,
        )  # fmt: skip

    torch.manual_seed(config.seed)  # the adapters' initial A: the run's, on every rank
    return adapt(model, adapter, base=base, quantize=quantize, check=check)


def _check_strategy(adapter: LoRA | None, strategy: str, world: World) -> None:
    """A LoRA trains on one process or under DDP (its frozen base stays out of the reducer);
    FSDP2 is refused (it would shard a frozen, maybe quantized base for gradients it does
    not have)."""
    if adapter is not None and strategy == "fsdp" and world.size > 1:
        raise ValueError(
            "a LoRA run does not shard with --strategy fsdp: the base is frozen and only the "
            "adapters train; use --strategy ddp (each process holds the base, quantized with "
            "--quantize if it is too large)"
        )


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


def _train(run: Run) -> TrainResult:
    """Step until ``config.steps`` are done or the run is asked to stop."""
    stopped, signum = "steps", None
    with _stop_requests() as stop_asked:
        while run.step < run.config.steps:
            stopped, signum = _advance(run, stop_asked)
            if stopped != "steps":
                break
    return _finish(run, stopped, signum)


def _advance(run: Run, stop_asked: Callable[[], int]) -> tuple[str, int | None]:
    """One step, then what follows it: the metrics record, an evaluation, a checkpoint;
    returns why the run stops (``"steps"``: it goes on) and the signal that stopped it."""
    config, world = run.config, run.world
    lr = config.lr_at(run.step)
    step_began = time.monotonic()
    with run.threads.step() if run.threads is not None else contextlib.nullcontext():
        loss = optimizer_step(run, lr)
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
        evaluate_now(run, record, lr)
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


def _why_stop(run: Run, signum: int | None, out_of_time: bool) -> str:
    """``"signal"``, ``"time_budget"``, ``"loss_target"``, or ``"steps"`` (go on)."""
    target = run.config.loss_target
    if signum:
        return "signal"
    if out_of_time:
        return "time_budget"
    if target and run.val_loss is not None and run.val_loss <= target:
        return "loss_target"
    return "steps"


def _checkpoint(run: Run, lr: float) -> None:
    """Save the resumable state (weights checked finite first; nothing non-finite is ever
    saved)."""
    save_began = time.monotonic()
    if not finite(run.model, run.world):
        raise diverged("a weight is NaN or infinite", run.step, lr, run)
    save_state(
        run.out, run.model, run.optimizer, run.step, run.generator, run.history, run.config,
        main=run.world.main, tokenizer=run.tok, adapter=run.adapter,
    )  # fmt: skip
    run.saved_at = run.step
    run.budget.saved(time.monotonic() - save_began)
    write_record(run, "running")


def _finish(run: Run, stopped: str, signum: int | None) -> TrainResult:
    """Write the final model (``<out>/model``; a LoRA run's ``<out>/adapter``) and the last
    plot; the result."""
    seconds = time.monotonic() - run.began
    run.progress.close()
    checkpoint = run.out / ("model" if run.adapter is None else "adapter")
    world = run.world
    if not finite(run.model, world):
        raise diverged("a weight is NaN or infinite", run.step, run.config.lr_at(run.step), run)
    plain = plain_model(run.model) if run.adapter is None else run.model  # collective (FSDP)
    if world.main:
        if run.adapter is not None:
            from .adapter import save_result

            save_result(run.model, run.adapter, run.out, run.tok)
        else:
            plain.tokenizer = run.tok
            save(plain, checkpoint, tokenizer=run.tok)
        if not run.plotting:
            run.say("matplotlib is not installed: no loss.png (pip install 'torch-zoo[train]')")
        elif run.plotted != len(run.history):
            plot_losses(run.out / "loss.png", run.history, title=run.title)
        write_record(run, stopped)
    barrier(world)
    return TrainResult(
        run.model, checkpoint, run.losses, run.val_loss, run.step, seconds, stopped, signum
    )
