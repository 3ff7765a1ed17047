"""What training does for each kind of model: one :class:`TaskSpec` per task.

The loop (:mod:`zoo.train.loop`) is the same for every model; a spec tells it the three
things that differ between tasks:

- ``read(model, request)``: how the data file becomes batches (a :class:`DataSource`);
- ``loss(model, inputs, targets)``: the training loss of one batch;
- ``units(model)``: the sub-modules FSDP2 shards one by one (each block), before the root.

Four specs are built in (:data:`TASKS`):

- ``"causal-lm"``: a decoder on text, random windows of ``context_length + 1`` tokens
  (:class:`~zoo.train.data.TokenData`); its blocks are ``model.blocks``.
- ``"classify"``: a classifier on ``text<TAB>label`` lines
  (:class:`~zoo.train.data.LabelData`); its blocks are its body's ``blocks``.
- ``"seq2seq"``: an encoder-decoder on ``source<TAB>target`` lines, teacher forcing
  (:class:`~zoo.train.data.PairData`: a checkpoint's decoder starts at its
  ``decoder_start_token_id`` and learns its tokenizer's sequence tokens, as transformers
  trains Marian, BART and T5); its blocks are ``model.encoder`` and ``model.decoder``.
- ``"chat"``: a decoder on conversations (a ``.jsonl`` file in OpenAI's messages format)
  rendered through the tokenizer's chat template and packed in rows of ``context_length + 1``
  tokens, the loss on the assistant's replies only (:mod:`zoo.train.chat_data`); its blocks are
  ``model.blocks``. No model declares it: ``zoo train --task chat`` (or
  ``model.train_task = "chat"``) picks it for a decoder.

Each uses the mean token cross-entropy, padding ignored.

**The seam.** A model class declares its task in a class attribute ``train_task``: the name of
a built-in spec, or a :class:`TaskSpec` of its own (how a plugin adds a task, with no
registration step)::

    class MyTagger(ZooModel):
        train_task = TaskSpec("tag", read=read_tags, units=lambda m: list(m.layers))

A model that declares nothing trains as ``"seq2seq"`` when ``is_encoder_decoder``, else as
``"causal-lm"``. :func:`task_of` makes that choice.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from ..nn.base import ZooModel
from .data import IGNORE, Batch, LabelData, PairData, TokenData, text_files
from .loss import cross_entropy
from .world import World, barrier

__all__ = [
    "TASKS",
    "DataRequest",
    "DataSource",
    "TaskSpec",
    "task_of",
    "token_loss",
]


class DataSource(Protocol):
    """Training data, ready to draw batches from."""

    def batch(self, part: str, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` random examples of ``part`` (``"train"`` or ``"val"``): the model's
        keyword inputs and the targets (positions to ignore hold ``IGNORE``)."""
        ...


@dataclasses.dataclass(frozen=True)
class DataRequest:
    """What a spec's ``read`` is given.

    Attributes:
        data: the ``data`` argument of :func:`zoo.train.train`, as given.
        tokenizer: the tokenizer to encode it with.
        out: the run's folder (a spec may keep prepared data under it).
        context: the model's ``context_length``.
        val_fraction: the last part of the data to hold out.
        world: the processes (a spec that writes prepared data lets rank 0 write it first).
    """

    data: str | os.PathLike[str]
    tokenizer: Any
    out: Path
    context: int
    val_fraction: float
    world: World


def token_loss(model: nn.Module, inputs: dict[str, Tensor], targets: Tensor) -> Tensor:
    """Mean cross-entropy of ``model(**inputs)`` against ``targets`` (``IGNORE`` skipped):
    logits ``(B, T, V)`` against ``(B, T)``, or ``(B, V)`` against ``(B,)``."""
    logits = model(**inputs)  # (B, T, V) or (B, V)
    return cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=IGNORE,
    )


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """How to train one kind of model.

    Args:
        name: the task's name (in messages).
        read: ``(model, request) -> DataSource``: the data, read and checked.
        units: ``model -> sub-modules`` FSDP2 shards one at a time (each block, in any
            order, none inside another), then the root; an empty list shards the root alone.
        loss: ``(model, inputs, targets) -> scalar``, inputs and targets on the model's
            device; default :func:`token_loss`.
    """

    name: str
    read: Callable[[ZooModel, DataRequest], DataSource]
    units: Callable[[nn.Module], Sequence[nn.Module]]
    loss: Callable[[nn.Module, dict[str, Tensor], Tensor], Tensor] = token_loss


def _read_text(model: ZooModel, request: DataRequest) -> DataSource:
    """Text files tokenized once into ``<out>/data/`` (rank 0 first, the others reuse it),
    drawn in windows of ``context + 1`` tokens."""
    world = request.world

    def build() -> TokenData:
        files = text_files(request.data)
        return TokenData.build(files, request.tokenizer, request.out / "data", request.val_fraction)

    if world.main:
        tokens = build()
    barrier(world)
    if not world.main:
        tokens = build()
    return tokens.windows(request.context, str(request.data))


def _read_labels(model: ZooModel, request: DataRequest) -> DataSource:
    labels = list(model.config.labels)  # type: ignore[attr-defined]
    path, tok = Path(request.data), request.tokenizer
    return LabelData.read(path, tok, request.context, request.val_fraction, labels)


def _read_pairs(model: ZooModel, request: DataRequest) -> DataSource:
    """``source<TAB>target`` pairs, framed as the model's checkpoint trains it when it names
    its decoder's start (its config's ``decoder_start_id``, else its
    ``generation_config.json``'s ``decoder_start_token_id``), else as zoo's encoder-decoder
    does (:class:`~zoo.train.data.PairData`)."""
    path = Path(request.data)
    start = getattr(model.config, "decoder_start_id", None)
    if start is None:
        generation = getattr(model, "generation_config", None)
        start = getattr(generation, "decoder_start_token_id", None)
    return PairData.read(
        path, request.tokenizer, request.context, request.val_fraction, decoder_start=start
    )


def _read_chat(model: ZooModel, request: DataRequest) -> DataSource:
    from .chat_data import read_chat  # (imports the chat template renderer on first use)

    return read_chat(model, request)


def _decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """A decoder's ``blocks`` (zoo.nn.DecoderLM's and the plugin guide's); none when it has
    no such attribute (FSDP2 then shards the root alone, and the run says so)."""
    return list(getattr(model, "blocks", ()))


def _classifier_blocks(model: nn.Module) -> list[nn.Module]:
    return _decoder_blocks(model.get_submodule("body"))


def _encoder_decoder_blocks(model: nn.Module) -> list[nn.Module]:
    encoder, decoder = model.get_submodule("encoder"), model.get_submodule("decoder")
    return [*encoder.children(), *decoder.children()]  # their blocks


#: The built-in specs by name (what ``train_task = "..."`` names).
TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec("causal-lm", read=_read_text, units=_decoder_blocks),
        TaskSpec("classify", read=_read_labels, units=_classifier_blocks),
        TaskSpec("seq2seq", read=_read_pairs, units=_encoder_decoder_blocks),
        TaskSpec("chat", read=_read_chat, units=_decoder_blocks),
    )
}


def task_of(model: ZooModel) -> TaskSpec:
    """The spec ``model`` trains with: its class's ``train_task`` (a name in :data:`TASKS`
    or a :class:`TaskSpec`), else ``"seq2seq"`` for an encoder-decoder and ``"causal-lm"``
    for the rest."""
    declared = getattr(model, "train_task", None)
    if declared is None:
        declared = "seq2seq" if model.is_encoder_decoder else "causal-lm"
    if not isinstance(declared, str):
        return declared
    if declared not in TASKS:
        raise ConfigError(
            f"{type(model).__name__}.train_task is {declared!r}, not a task zoo knows "
            f"({', '.join(sorted(TASKS))}); name one of them, or set it to a "
            "zoo.train.task.TaskSpec of the model's own"
        )
    return TASKS[declared]
