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
import json
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
from ..checkpoint.commit import atomic_directory
from ..loading import load
from ..nn.base import ZooModel
from ..nn.classifier import SequenceClassifier
from ..tokenizers.base import check_fits
from .config import TrainConfig
from .data import IGNORE, DataError, LabelData, PairData, TokenData, text_files
from .loss import cross_entropy
from .report import Progress, plot_losses, write_metrics

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
    """

    model: ZooModel
    checkpoint: Path
    losses: list[float]
    val_loss: float | None
    steps: int
    seconds: float


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
    instead of hanging."""
    if "RANK" not in os.environ or dist.is_initialized():
        if dist.is_initialized():
            rank, size = dist.get_rank(), dist.get_world_size()
        else:
            rank, size = 0, 1
        return _World(rank, size, torch.device(device or "cpu"))
    cuda = (device or "cpu").startswith("cuda")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    target = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(target)
    timeout = datetime.timedelta(seconds=float(os.environ.get("ZOO_DIST_TIMEOUT", "120")))
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
    if world.size == 1:
        return flag
    tensor = torch.tensor([int(flag)], device=world.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


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


# -- resumable state (safetensors + JSON, never pickle) -------------------------------------
_STATE = "trainer.json"
_TENSORS = "state.safetensors"


def _full() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True)


def _plain_model(model: ZooModel) -> ZooModel:
    """``model`` with whole tensors on the CPU, as zoo.save takes it: the model itself, or a
    copy assembled from the full state dict when FSDP shards it (a collective call: every
    rank must make it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return model
    from ..api import build

    state: dict[str, Any] = get_model_state_dict(model, options=_full())
    plain = build(model.config, device="cpu")
    plain.load_state_dict({k: v.cpu() for k, v in state.items()})
    plain.name = model.name
    return plain


def _save_state(
    out: Path,
    model: ZooModel,
    optimizer: torch.optim.Optimizer,
    step: int,
    generator: torch.Generator,
    history: list[dict[str, Any]],
    world: _World,
) -> None:
    """The resumable state, keyed by parameter names (so it loads on another world size):
    the model as a zoo checkpoint, the optimizer's tensors and the RNG states in safetensors,
    the rest in JSON. Collective under FSDP; only rank 0 writes."""
    import safetensors.torch
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    plain = _plain_model(model)
    state: Any = get_optimizer_state_dict(model, optimizer, options=_full())
    if not world.main:
        return
    tensors: dict[str, Tensor] = {
        "rng.torch": torch.get_rng_state(),
        "rng.data": generator.get_state(),
    }
    scalars: dict[str, Any] = {}
    for name, values in state["state"].items():
        for key, value in values.items():
            if isinstance(value, Tensor):
                tensors[f"optimizer/{name}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{name}/{key}"] = value
    meta = {
        "step": step,
        "param_groups": state["param_groups"],
        "scalars": scalars,
        "history": history,
    }
    with atomic_directory(out / "checkpoint") as staging:
        save(plain, staging / "model")
        safetensors.torch.save_file(tensors, str(staging / _TENSORS))
        (staging / _STATE).write_text(json.dumps(meta, indent=1), encoding="utf-8")


def _load_state(
    out: Path, model: ZooModel, optimizer: torch.optim.Optimizer, generator: torch.Generator
) -> tuple[int, list[dict[str, Any]]]:
    import safetensors.torch
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    folder = out / "checkpoint"
    meta = json.loads((folder / _STATE).read_text(encoding="utf-8"))
    tensors = safetensors.torch.load_file(str(folder / _TENSORS))
    saved = load(folder / "model", tokenizer=False)
    set_model_state_dict(model, saved.state_dict(), options=_full())
    state: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer/"):
            _, name, field = key.split("/", 2)
            state.setdefault(name, {})[field] = value
    for key, value in meta["scalars"].items():
        name, field = key.split("/", 1)
        state.setdefault(name, {})[field] = value
    groups = meta["param_groups"]
    for group in groups:
        group["betas"] = tuple(group["betas"])
    full: Any = {"state": state, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, full, options=_full())
    torch.set_rng_state(tensors["rng.torch"])
    generator.set_state(tensors["rng.data"])
    return int(meta["step"]), list(meta["history"])


@contextlib.contextmanager
def _stop_requests() -> Iterator[Callable[[], bool]]:
    """SIGINT/SIGTERM ask the loop to checkpoint and stop at the end of the step."""
    asked: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        asked.append(signum)

    previous = {}
    with contextlib.suppress(ValueError):  # not the main thread: no handlers
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield lambda: bool(asked)
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

    Args:
        model: a zoo model, built (random init) or loaded (fine-tuning).
        data: for a decoder, a text file or a folder of ``.txt`` files, tokenized once with
            the model's tokenizer into ``<out>/data/`` (reused while text and tokenizer are the
            same); for an encoder-decoder, a ``source<TAB>target`` file.
        out: the run's folder: ``model/`` (the final zoo checkpoint), ``checkpoint/`` (to
            resume: running again on the same folder continues the run), ``metrics.jsonl``.
        config: the hyper-parameters.
        tokenizer: defaults to the model's own (``model.tokenizer``, else its named model's).
        device: where to train (default CPU; under ``torchrun`` with ``cuda``, each rank's GPU).
        strategy: with several processes, ``"ddp"`` (every process holds the whole model) or
            ``"fsdp"`` (FSDP2: parameters, gradients and optimizer state sharded per block).
        log: where progress lines go (rank 0 only); ``None`` for silence.

    Raises:
        zoo.train.DataError: the data is missing, empty, not UTF-8 or shorter than a window.
    """
    from ..api import tokenizer as named_tokenizer

    if strategy not in ("ddp", "fsdp"):
        raise ValueError(f"strategy must be 'ddp' or 'fsdp', got {strategy!r}")
    config = config or TrainConfig()
    out = Path(out)
    world = _world(device)
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
    if (out / "checkpoint" / _STATE).exists():
        start, history = _load_state(out, model, optimizer, generator)
        say(f"resumed {out / 'checkpoint'} at step {start}")

    micro = config.batch_size // config.grad_accum  # sequences per micro-step, all ranks
    mine = slice(world.rank * micro // world.size, (world.rank + 1) * micro // world.size)
    losses: list[float] = []
    val_loss = next((h["val_loss"] for h in reversed(history) if "val_loss" in h), None)
    began = time.monotonic()
    step = start
    progress = Progress(total=config.steps, initial=start, enabled=world.main and log is not None)
    if progress.bar is not None and log is print:  # lines above the bar, not through it
        say = progress.write
    tokens_per_step = config.batch_size * context
    with _stop_requests() as stop_asked:
        while step < config.steps:
            for group in optimizer.param_groups:
                group["lr"] = config.lr_at(step)
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
            if config.clip:
                nn.utils.clip_grad_norm_(model.parameters(), config.clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_value = _mean(total, world)
            losses.append(loss_value)
            elapsed = time.monotonic() - began
            progress.update(
                loss=loss_value,
                lr=config.lr_at(step - 1),
                tokens_per_second=tokens_per_step * (step - start) / max(elapsed, 1e-9),
            )
            record: dict[str, Any] = {"step": step, "loss": loss_value}
            record["lr"] = config.lr_at(step - 1)
            last = step == config.steps
            out_of_time = config.time_budget and time.monotonic() - began > config.time_budget
            # every rank must agree to stop at the same step (a signal may reach one only)
            interrupted = _any(bool(stop_asked() or out_of_time), world)
            periodic_eval = config.eval_every and step % config.eval_every == 0
            if periodic_eval or last or interrupted:  # the result's val_loss is the model's
                val_loss = _evaluate(model, source, config, world)
                record["val_loss"] = val_loss
                say(f"step {step}: loss {loss_value:.4f}, val {val_loss:.4f}")
            history.append(record)
            reached = config.loss_target and val_loss is not None and val_loss <= config.loss_target
            stopping = bool(interrupted or reached)
            periodic = config.checkpoint_every and step % config.checkpoint_every == 0
            if stopping or last or periodic:  # a collective under FSDP: every rank takes part
                _save_state(out, model, optimizer, step, generator, history, world)
            if stopping:
                say(f"stopped at step {step} ({'signal' if stop_asked() else 'budget'})")
                break
    seconds = time.monotonic() - began
    progress.close()
    checkpoint = out / "model"
    plain = _plain_model(model)
    if world.main:
        plain.tokenizer = tok
        save(plain, checkpoint, tokenizer=tok)
        write_metrics(out / "metrics.jsonl", history)
        if not plot_losses(out / "loss.png", history, title=f"{model.name or 'model'} on {data}"):
            say("matplotlib is not installed: no loss.png (pip install 'torch-zoo[train]')")
    if world.size > 1:
        dist.barrier()
    return TrainResult(model, checkpoint, losses, val_loss, step, seconds)


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
