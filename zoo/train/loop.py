"""The training loop: one process, or several under ``torchrun`` (DDP), the same code.

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
import datetime
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..checkpoint import save
from ..devices import check_device
from ..nn.base import ZooModel
from ..nn.classifier import SequenceClassifier
from ..settings import Settings
from ..tokenizers.base import check_fits
from .config import TrainConfig
from .data import IGNORE, DataError, LabelData, PairData, TokenData, text_files
from .errors import DivergedError, RunLockedError
from .loss import cross_entropy
from .memory import check_training_memory
from .report import MetricsLog, Progress, can_plot, plot_losses
from .state import has_state, load_state, plain_model, save_state

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


# -- processes ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _World:
    rank: int
    size: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def _world(device: str | None) -> _World:
    """Join the process group ``torchrun`` describes (``RANK``/``WORLD_SIZE`` set), or run
    alone. A rank that dies makes the others fail at the next collective within the timeout
    instead of hanging. A device this machine lacks is a ConfigError (zoo's one check)."""
    target = check_device(device)
    if "RANK" not in os.environ or dist.is_initialized():
        if dist.is_initialized():
            rank, size = dist.get_rank(), dist.get_world_size()
        else:
            rank, size = 0, 1
        return _World(rank, size, target)
    cuda = target.type == "cuda"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    target = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(target)
    timeout = datetime.timedelta(seconds=Settings.from_env().dist_timeout)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    return _World(dist.get_rank(), dist.get_world_size(), target)


def _mean(value: float, world: _World) -> float:
    if world.size == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=world.device)  # NCCL: on the GPU
    dist.all_reduce(tensor)
    return float(tensor.item()) / world.size


def _any(flag: bool, world: _World) -> bool:
    """Whether ``flag`` is set on any rank."""
    return bool(_max(int(flag), world))


def _max(value: int, world: _World) -> int:
    """The largest ``value`` over the ranks."""
    if world.size == 1:
        return value
    tensor = torch.tensor([value], device=world.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


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
    tokens), or an encoder-decoder on source/target pairs (teacher forcing).

    SIGINT and SIGTERM end the step under way, evaluate, save a resumable checkpoint and
    *return* (no exception): ``result.interrupted`` is then true and ``result.signal`` names
    the signal (``zoo train`` exits with 128 + its number: 130, 143). Running again on the
    same ``out`` continues the run.

    Args:
        model: a zoo model, built (random init) or loaded (fine-tuning).
        data: for a decoder, a text file or a folder of ``.txt`` files, tokenized once with
            the model's tokenizer into ``<out>/data/`` (reused while text and tokenizer are the
            same); for an encoder-decoder, a ``source<TAB>target`` file.
        out: the run's folder: ``model/`` (the final zoo checkpoint), ``checkpoint/`` (to
            resume: running again on the same folder continues the run), ``metrics.jsonl``
            (a line per step, written as it happens) and ``loss.png`` (redrawn at each
            evaluation). One run at a time: the folder is locked while it trains.
        config: the hyper-parameters.
        tokenizer: defaults to the model's own (``model.tokenizer``, else its named model's).
        device: where to train (default CPU; under ``torchrun`` with ``cuda``, each rank's GPU).
        strategy: with several processes, ``"ddp"`` (every process holds the whole model) or
            ``"fsdp"`` (FSDP2: parameters, gradients and optimizer state sharded per block).
        log: where progress lines go (rank 0 only); ``None`` for silence.

    Raises:
        zoo.train.DataError: the data is missing, empty, not UTF-8 or shorter than a window.
        zoo.train.DivergedError: a loss or the weights became NaN or infinite; the last good
            checkpoint is kept (nothing non-finite is ever saved).
        zoo.train.ResumeError: ``<out>/checkpoint/`` is damaged, or was written for another
            model or with other settings.
        zoo.train.RunLockedError: another run is training into ``out``.
        zoo.errors.ConfigError: ``device`` is not one this machine has.
    """
    clock = time.monotonic()  # the time budget counts from here
    if strategy not in ("ddp", "fsdp"):
        raise ValueError(f"strategy must be 'ddp' or 'fsdp', got {strategy!r}")
    config = config or TrainConfig()
    out = Path(out)
    world = _world(device)
    with contextlib.ExitStack() as stack:
        lock = _lock(out) if world.main else None
        if lock is not None:
            stack.callback(lock.release)
        if _any(world.main and lock is None, world):
            raise RunLockedError(
                f"{out} is being trained into by another run (it holds {out / _LOCK}); wait "
                "for it to finish or stop it, or train into another --out"
            )
        return _train(model, data, out, config, tokenizer, world, strategy, log, clock, stack)
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


def _train(
    model: ZooModel,
    data: str | os.PathLike[str],
    out: Path,
    config: TrainConfig,
    tokenizer: Any,
    world: _World,
    strategy: str,
    log: Callable[[str], None] | None,
    clock: float,
    stack: contextlib.ExitStack,
) -> TrainResult:
    from ..api import tokenizer as named_tokenizer

    say = log if (log is not None and world.main) else (lambda _line: None)
    if config.batch_size % (config.grad_accum * world.size):
        raise ValueError(
            f"batch_size {config.batch_size} must divide by grad_accum x processes "
            f"({config.grad_accum} x {world.size})"
        )
    tok = tokenizer or model.tokenizer or (named_tokenizer(model.name) if model.name else None)
    if tok is None:
        raise DataError("training on text needs a tokenizer: pass tokenizer=...")
    check_fits(tok, model.config.vocab_size)  # type: ignore[attr-defined]
    check_training_memory(model, config, world.device, world.size, strategy)  # before step 1
    context: int = model.config.context_length  # type: ignore[attr-defined]
    source = _data(model, data, tok, out, context, config, world)

    model = model.to(world.device).train()
    wrapped: nn.Module = model
    if world.size > 1 and strategy == "fsdp":
        _shard(model, world)
    elif world.size > 1:
        wrapped = nn.parallel.DistributedDataParallel(model)
    optimizer = _optimizer(model, config)  # after sharding: it holds the shards
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed + world.rank)
    start, history = 0, list[dict[str, Any]]()
    if has_state(out):
        start, history = load_state(out, model, optimizer, generator, config)
        say(f"resumed {out / 'checkpoint'} at step {start}")
    saved_at: int | None = start if start else None  # the step of the last good checkpoint

    micro = config.batch_size // config.grad_accum  # sequences per micro-step, all ranks
    mine = slice(world.rank * micro // world.size, (world.rank + 1) * micro // world.size)
    losses: list[float] = []
    val_loss = next((h["val_loss"] for h in reversed(history) if "val_loss" in h), None)
    title = f"{model.name or 'model'} on {data}"
    metrics = stack.enter_context(MetricsLog(out / "metrics.jsonl", history, enabled=world.main))
    plotting = world.main and can_plot()  # the import is paid here, not in a timed step
    plotted = -1  # the length of the history last drawn
    began = time.monotonic()
    budget = _Budget(config, world, clock)
    step = start
    stopped, signum = "steps", None
    progress = Progress(total=config.steps, initial=start, enabled=world.main and log is not None)
    stack.callback(progress.close)
    if progress.bar is not None and log is print:  # lines above the bar, not through it
        say = progress.write
    tokens_per_step = config.batch_size * context
    with _stop_requests() as stop_asked:
        while step < config.steps:
            lr = config.lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            step_began = time.monotonic()
            total = 0.0
            for k in range(config.grad_accum):
                inputs, targets = source.batch("train", micro, generator)  # global micro-batch
                last_micro = k + 1 == config.grad_accum
                no_sync = getattr(wrapped, "no_sync", contextlib.nullcontext)  # DDP only
                with contextlib.nullcontext() if last_micro else no_sync():
                    mine_in = {k: v[mine] for k, v in inputs.items()}
                    with torch.autocast(world.device.type, torch.bfloat16, enabled=config.bf16):
                        loss = _loss(wrapped, mine_in, targets[mine], world.device)
                    (loss / config.grad_accum).backward()
                total += float(loss.detach()) / config.grad_accum
            loss_value = _mean(total, world)  # the same on every rank: all stop together
            if not math.isfinite(loss_value):
                metrics.append({"step": step + 1, "loss": None, "lr": lr, "diverged": True})
                raise _diverged(f"the training loss is {loss_value}", step + 1, lr, out, saved_at)
            if config.clip:
                nn.utils.clip_grad_norm_(model.parameters(), config.clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            budget.stepped(time.monotonic() - step_began)
            losses.append(loss_value)
            elapsed = time.monotonic() - began
            progress.update(
                loss=loss_value,
                lr=lr,
                tokens_per_second=tokens_per_step * (step - start) / max(elapsed, 1e-9),
            )
            record: dict[str, Any] = {"step": step, "loss": loss_value, "lr": lr}
            last = step == config.steps
            periodic_eval = bool(config.eval_every and step % config.eval_every == 0)
            periodic_save = bool(config.checkpoint_interval)
            periodic_save = periodic_save and step % config.checkpoint_interval == 0
            out_of_time = not last and budget.exhausted(
                now_eval=periodic_eval, now_save=periodic_save
            )
            # every rank must agree to stop at the same step (a signal may reach one only)
            signum = _max(stop_asked(), world) or None
            interrupted = bool(signum) or _any(out_of_time, world)
            if periodic_eval or last or interrupted:  # the result's val_loss is the model's
                eval_began = time.monotonic()
                val_loss = _evaluate(model, source, config, world)
                if not math.isfinite(val_loss):
                    raise _diverged(f"the held-out loss is {val_loss}", step, lr, out, saved_at)
                record["val_loss"] = val_loss
                say(f"step {step}: loss {loss_value:.4f}, val {val_loss:.4f}")
                history.append(record)
                metrics.append(record)
                if plotting:
                    plot_losses(out / "loss.png", history, title=title)
                    plotted = len(history)
                budget.evaluated(time.monotonic() - eval_began)
            else:
                history.append(record)
                metrics.append(record)
            reached = bool(config.loss_target and val_loss is not None)
            reached = reached and val_loss <= config.loss_target  # type: ignore[operator]
            if signum:
                stopped = "signal"
            elif out_of_time:
                stopped = "time_budget"
            elif reached:
                stopped = "loss_target"
            stopping = stopped != "steps"
            if stopping or last or periodic_save:  # a collective under FSDP: every rank
                save_began = time.monotonic()
                if not _finite(model, world):
                    raise _diverged("a weight is NaN or infinite", step, lr, out, saved_at)
                save_state(
                    out, model, optimizer, step, generator, history, config,
                    main=world.main, tokenizer=tok,
                )  # fmt: skip
                saved_at = step
                budget.saved(time.monotonic() - save_began)
            if stopping:
                reason = _reason(stopped, signum, val_loss, config, budget)
                say(f"stopped at step {step}: {reason}")
                break
    seconds = time.monotonic() - began
    progress.close()
    checkpoint = out / "model"
    if not _finite(model, world):
        raise _diverged("a weight is NaN or infinite", step, config.lr_at(step), out, saved_at)
    plain = plain_model(model)
    if world.main:
        plain.tokenizer = tok
        save(plain, checkpoint, tokenizer=tok)
        if not plotting:
            say("matplotlib is not installed: no loss.png (pip install 'torch-zoo[train]')")
        elif plotted != len(history):
            plot_losses(out / "loss.png", history, title=title)
    if world.size > 1:
        dist.barrier()
    return TrainResult(model, checkpoint, losses, val_loss, step, seconds, stopped, signum)


class _Budget:
    """Predicts whether another step, then the final evaluation and checkpoint, ends within
    ``config.time_budget`` seconds of ``clock`` (measured durations; the longest of the
    last steps, as step times vary)."""

    def __init__(self, config: TrainConfig, world: _World, clock: float) -> None:
        self.config, self.world, self.clock = config, world, clock
        self.steps: list[float] = []
        self.eval: float | None = None
        self.save = 0.0
        self.needed = 0.0
        self.first_step_over = False  # the first step alone ended past the budget
        self.at_first_step = 0.0

    def stepped(self, seconds: float) -> None:
        self.steps.append(seconds)

    def evaluated(self, seconds: float) -> None:
        self.eval = seconds

    def saved(self, seconds: float) -> None:
        self.save = seconds

    def used(self) -> float:
        return time.monotonic() - self.clock

    def step_estimate(self) -> float:
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
        if not self.config.time_budget:
            return False
        finish = self.finish_estimate()
        now = (finish - 2 * self.save if now_eval else 0.0) + (self.save if now_save else 0.0)
        self.needed = now + self.step_estimate() + finish
        used = self.used()
        if len(self.steps) == 1 and used > self.config.time_budget:
            self.first_step_over, self.at_first_step = True, used
        return used + self.needed > self.config.time_budget


def _reason(
    stopped: str,
    signum: int | None,
    val_loss: float | None,
    config: TrainConfig,
    budget: _Budget,
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


def _diverged(what: str, step: int, lr: float, out: Path, saved_at: int | None) -> DivergedError:
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


def _finite(model: ZooModel, world: _World) -> bool:
    """Whether every weight is finite, on every rank (each checks its own shards)."""
    from torch.distributed.tensor import DTensor

    bad = False
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            if not bool(torch.isfinite(local).all()):
                bad = True
                break
    return not _any(bad, world)


def _shard(model: ZooModel, world: _World) -> None:
    """FSDP2: each block, then the root (embeddings, head, final norm), sharded over the
    processes; gradients are reduce-scattered, optimizer state lives with the shards."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(world.device.type, (world.size,))
    for block in getattr(model, "blocks", ()):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _data(
    model: ZooModel,
    data: str | os.PathLike[str],
    tok: Any,
    out: Path,
    context: int,
    config: TrainConfig,
    world: _World,
) -> TokenData | PairData | LabelData:
    """Text for a decoder (a token file, made by rank 0 first), pairs for an
    encoder-decoder."""
    if isinstance(model, SequenceClassifier):
        labels = list(model.config.labels)
        return LabelData.read(Path(data), tok, context, config.val_fraction, labels)
    if model.is_encoder_decoder:
        return PairData.read(Path(data), tok, context, config.val_fraction)
    if world.main:
        tokens = TokenData.build(text_files(data), tok, out / "data", config.val_fraction)
    if world.size > 1:
        dist.barrier()
    if not world.main:
        tokens = TokenData.build(text_files(data), tok, out / "data", config.val_fraction)
    return tokens.windows(context, str(data))


def _loss(
    model: nn.Module, inputs: dict[str, Tensor], targets: Tensor, device: torch.device
) -> Tensor:
    """Mean cross-entropy of ``model``'s logits against ``targets`` (padding ignored)."""
    logits = model(**{k: v.to(device) for k, v in inputs.items()})  # (B, T, V) or (B, V)
    return cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        targets.to(device).reshape(-1),
        ignore_index=IGNORE,
    )


def _evaluate(
    model: ZooModel, source: TokenData | PairData | LabelData, config: TrainConfig, world: _World
) -> float:
    """Mean loss on the same ``eval_batches`` held-out windows every time (its own seed)."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    model.eval()
    total = 0.0
    with torch.no_grad():
        for _ in range(config.eval_batches):
            inputs, targets = source.batch("val", config.batch_size // config.grad_accum, generator)
            total += float(_loss(model, inputs, targets, world.device))
    model.train()
    return total / config.eval_batches  # every rank computes the same batches: no reduce
