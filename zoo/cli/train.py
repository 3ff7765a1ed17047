"""``zoo train``: a model trained on text, pairs or labelled text. Its training flags are
made from :class:`~zoo.train.TrainConfig`'s fields (:mod:`zoo.cli.flags`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .. import api
from ..options import MAX_DISTINCT_BYTES
from ..train.config import TrainConfig
from .flags import Derived, add_dataclass_flags, dataclass_values
from .parser import Command, positive

if TYPE_CHECKING:
    from ..nn.base import ZooModel
    from ..tokenizers import Tokenizer

__all__ = ["COMMANDS", "DERIVED"]

#: Training flags whose default follows another flag's value.
DERIVED = {"min_lr": Derived("--lr / 10", lambda values: values["lr"] / 10)}


def cmd_train(args: argparse.Namespace) -> int:
    """Train a model (new, or fine-tune weights with --from) on text, pairs or labelled text;
    works under torchrun. Exit status: 0 when done, 2 on an error (a diverged run included),
    130/143 after SIGINT/SIGTERM (checkpoint saved: the same command resumes)."""
    from ..devices import check_computes
    from ..train import classifier, labels_in, train

    # before anything is loaded: the checks zoo generate makes (the meta device included)
    check_computes(api.check_device(args.device), None, "train", "zoo train --device cpu")
    config = train_config(args)  # its errors too, before a model is built or a tokenizer trained
    overrides = dict(_override(item) for item in args.set or ())
    tokenizer = _tokenizer(args, overrides)
    model = _model(args, overrides)
    if args.task == "classify":  # a linear head over the labels the data uses
        model = classifier(model, labels_in(args.data))
    result = train(
        model,
        args.data,
        args.out,
        config=config,
        tokenizer=tokenizer,
        device=args.device,
        strategy=args.strategy,
    )
    if result.val_loss is not None:
        print(f"val loss {result.val_loss:.4f} after {result.steps} steps")
    print(f"model: {result.checkpoint}")
    return 128 + result.signal if result.signal else 0  # 130 (SIGINT), 143 (SIGTERM)


def _tokenizer(args: argparse.Namespace, overrides: dict[str, Any]) -> Tokenizer | None:
    """The tokenizer ``--tokenizer`` loads or ``--train-tokenizer`` trains (which sizes the
    new model's vocabulary in ``overrides``), or ``None``: the model's own."""
    if args.tokenizer is not None:
        from ..tokenizers import load_directory

        return load_directory(args.tokenizer)
    if args.train_tokenizer is None:
        return None
    from ..train import train_tokenizer

    # with a new model: _check_train said so
    tokenizer = train_tokenizer(
        args.data, args.train_tokenizer, args.tokenizer_max_distinct or MAX_DISTINCT_BYTES
    )
    overrides.setdefault("vocab_size", tokenizer.vocab_size)
    return tokenizer


def _model(args: argparse.Namespace, overrides: dict[str, Any]) -> ZooModel:
    """A new model from NAME (random weights, seeded by ``--seed``) or the weights of
    ``--from``."""
    import torch

    from .. import loading

    if args.source is None:
        torch.manual_seed(args.seed)
        return api.build(args.model, **overrides)
    return loading.load(args.source)  # without --set: _check_train said so


def train_config(args: argparse.Namespace) -> TrainConfig:
    """``zoo train``'s training flags as a checked :class:`~zoo.train.TrainConfig` (no torch)."""
    return TrainConfig(**dataclass_values(args, TrainConfig, DERIVED))


def _override(text: str) -> tuple[str, Any]:
    """``key=value`` from the command line; the value parsed as JSON when it can be."""
    import json

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--set takes key=value, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _check_train(args: argparse.Namespace) -> None:
    from .. import loading
    from ..tokenizers.files import read_manifest
    from ..train.files import text_files

    if (args.model is None) == (args.source is None):
        raise ValueError(
            "name the model once: NAME for a new model with random weights, or --from SOURCE "
            "(a checkpoint directory, hf:org/name, or a named model with weights) to fine-tune"
        )
    if args.tokenizer_max_distinct is not None and args.train_tokenizer is None:
        raise ValueError("--tokenizer-max-distinct goes with --train-tokenizer")
    if args.model is not None:
        api.resolve_config(args.model, **dict(_override(item) for item in args.set or ()))
    else:
        if args.train_tokenizer is not None:
            raise ValueError("--train-tokenizer makes a new vocabulary: it needs a new model")
        if args.set:
            raise ValueError("--set changes the config of a new model: it cannot go with --from")
        loading.check_source(args.source)
    text_files(args.data)
    if args.tokenizer is not None:
        read_manifest(args.tokenizer)
    train_config(args)


def _train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        nargs="?",
        metavar="NAME",
        help="a named model to train from random weights (its config, changed by --set)",
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="SOURCE",
        help="weights to fine-tune instead: a checkpoint directory, hf:org/name[@rev], or a "
        "named model with weights (gpt2-124m) (default: none, NAME from random weights)",
    )
    p.add_argument(
        "--data",
        required=True,
        help="text (a file or a folder of .txt files); for an encoder-decoder a "
        "source<TAB>target file; with --task classify a text<TAB>label file",
    )
    p.add_argument(
        "--task",
        choices=("lm", "classify"),
        default="lm",
        help="lm: the model's own task; classify: fine-tune it as a sequence classifier (a "
        "linear head on the last token, saved with the checkpoint) (default: lm)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="the run's folder (running again resumes; one run at a time)",
    )
    tokens = p.add_mutually_exclusive_group()
    tokens.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="a saved tokenizer (default: the model's own)",
    )
    tokens.add_argument(
        "--train-tokenizer",
        type=int,
        metavar="VOCAB_SIZE",
        help="first train a byte-level BPE of this many ids on --data (both columns of a "
        "TSV) and size the new model's vocabulary to it; saved with the checkpoint "
        "(default: none)",
    )
    p.add_argument(
        "--tokenizer-max-distinct",
        type=positive,
        metavar="BYTES",
        help="with --train-tokenizer: learn from the data until its distinct words take this "
        "many bytes, then warn and stop reading; the trainer holds up to ~120 bytes of memory "
        f"per byte of it (default: {MAX_DISTINCT_BYTES:,})",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="change the new model's config, e.g. --set context_length=256 (repeatable; "
        "default: the named model's config)",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cpu)")
    p.add_argument(
        "--strategy",
        choices=("ddp", "fsdp"),
        default="ddp",
        help="under torchrun: ddp (whole model per process) or fsdp (FSDP2 sharding) "
        "(default: ddp)",
    )
    add_dataclass_flags(
        p.add_argument_group("training (zoo.train.TrainConfig)"), TrainConfig, DERIVED
    )


COMMANDS = {"train": Command(cmd_train, _train_arguments, _check_train)}
