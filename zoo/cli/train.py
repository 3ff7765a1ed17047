"""``zoo train``: a model trained on text, pairs or labelled text, whole or through a LoRA
(``--lora RANK``, on a base that may be quantized). Its training flags are made from
:class:`~zoo.train.TrainConfig`'s fields (:mod:`zoo.cli.flags`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Literal

from .. import api, jsonfile
from ..options import MAX_DISTINCT_BYTES, QUANTIZE_MODES
from ..train.config import TrainConfig
from .bounds import check_counts, train_bounds
from .flags import Derived, add_dataclass_flags, dataclass_values
from .parser import Command, positive

if TYPE_CHECKING:
    from ..adapters import BaseRecord
    from ..adapters.lora import LoRA
    from ..nn.base import ZooModel
    from ..tokenizers import Tokenizer

__all__ = ["COMMANDS", "DERIVED"]

#: Training flags whose default follows another flag's value.
DERIVED = {"min_lr": Derived("--lr / 10", lambda values: values["lr"] / 10)}


def cmd_train(args: argparse.Namespace) -> int:
    """Train a model (new, or fine-tune weights with --from, or a LoRA on a base with --lora)
    on text, pairs or labelled text; works under torchrun. Exit status: 0 when done, 2 on an
    error (a diverged run included), 130/143 after SIGINT/SIGTERM (checkpoint saved: the same
    command resumes)."""
    from ..devices import check_computes
    from ..train import classifier, labels_in, train

    # before anything is loaded: the checks zoo generate makes (the meta device included)
    check_computes(api.check_device(args.device), None, "train", "zoo train --device cpu")
    config = train_config(args)  # its errors too, before a model is built or a tokenizer trained
    overrides = dict(_override(item) for item in args.set or ())
    tokenizer = _tokenizer(args, overrides)
    model = _model(args, overrides)
    if args.task == "seq2seq" and not model.is_encoder_decoder:
        raise ValueError(
            f"--task seq2seq trains an encoder-decoder on source<TAB>target pairs, and "
            f"{model.name or 'this model'} is a decoder: train it on text (--task lm)"
        )
    if args.task == "classify":  # a linear head over the labels the data uses
        model = classifier(model, labels_in(args.data))
    if args.task == "chat":  # conversations through a chat template (zoo.train.chat_data)
        tokenizer = _chat_tokenizer(args, model, tokenizer)
    result = train(
        model,
        args.data,
        args.out,
        config=config,
        tokenizer=tokenizer,
        device=args.device,
        strategy=args.strategy,
        adapter=_lora(args),
        quantize=args.quantize,
        base=_base_record(args, model) if args.lora else None,
        threads=_threads(),
    )
    if result.val_loss is not None:
        print(f"val loss {result.val_loss:.4f} after {result.steps} steps")
    print(f"{'adapter' if args.lora else 'model'}: {result.checkpoint}")
    return 128 + result.signal if result.signal else 0  # 130 (SIGINT), 143 (SIGTERM)


def _threads() -> int | Literal["auto"] | None:
    """Each step's threads: ``ZOO_TRAIN_THREADS`` (:func:`zoo.settings.threads_argument`)."""
    from ..settings import Settings, threads_argument

    return threads_argument(Settings.from_env().train_threads)


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


def _chat_tokenizer(args: argparse.Namespace, model: ZooModel, tokenizer: Any) -> Any:
    """The tokenizer that renders ``--task chat``'s conversations (``--chat-template``'s in
    place of its own template when given); ``model`` set to train on them."""
    from ..tokenizers.chat_files import read_template_file
    from ..train.chat_data import for_chat

    template = None if args.chat_template is None else read_template_file(args.chat_template)
    return for_chat(model, tokenizer, template)


def _model(args: argparse.Namespace, overrides: dict[str, Any]) -> ZooModel:
    """A new model from NAME (random weights, seeded by ``--seed``) or the weights of
    ``--from``."""
    import torch

    from .. import loading

    if args.lora:  # the base: NAME_OR_PATH or --from (_check_train said which)
        return loading.load(_base_source(args))
    if args.source is None:
        torch.manual_seed(args.seed)
        return api.build(args.model, **overrides)
    return loading.load(args.source)  # without --set: _check_train said so


def _base_source(args: argparse.Namespace) -> str:
    """The base a ``--lora`` run adapts: NAME_OR_PATH, or ``--from``."""
    return str(args.model if args.source is None else args.source)


def _lora(args: argparse.Namespace) -> LoRA | None:
    """The LoRA of ``--lora RANK`` and its flags, or ``None``: train the whole model."""
    if not args.lora:
        return None
    from ..adapters.lora import LoRA

    targets = tuple(args.lora_targets) if args.lora_targets else None
    return LoRA(args.lora, args.lora_alpha, args.lora_dropout, targets)


def _base_record(args: argparse.Namespace, model: ZooModel) -> BaseRecord:
    """What the adapter records of its base: the Hub repo and revision of an ``hf:`` base,
    else the model's name (the sha256 is computed by zoo.train)."""
    from ..adapters import BaseRecord
    from ..hub.source import parse_hf_source

    source = _base_source(args)
    unset = "0" * 64  # replaced by the fingerprint of the float weights
    if source.startswith("hf:"):
        hub = parse_hf_source(source)
        return BaseRecord(name=model.name, repo=hub.repo_id, revision=hub.revision, sha256=unset)
    return BaseRecord(name=model.name, repo=None, revision=None, sha256=unset)


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
        return key, jsonfile.loads(value)
    except jsonfile.JSONError as exc:
        raise ValueError(f"--set {key}=...: {exc}") from None
    except json.JSONDecodeError:
        return key, value


def _check_lora(args: argparse.Namespace) -> None:
    """``--lora``'s flags: a base with weights (NAME_OR_PATH or --from, not both), a valid
    LoRA; without ``--lora`` none of its flags."""
    from .. import loading

    if not args.lora:
        given = [
            name
            for name, value in (
                ("--lora-alpha", args.lora_alpha != _ALPHA),
                ("--lora-dropout", args.lora_dropout != 0.0),
                ("--lora-targets", args.lora_targets),
                ("--quantize", args.quantize),
            )
            if value
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)} go(es) with --lora RANK: a LoRA on a frozen base "
                "(--quantize: QLoRA, a quantized frozen base)"
            )
        return
    if (args.model is None) == (args.source is None):
        raise ValueError("--lora adapts one base: NAME_OR_PATH (or --from SOURCE), once")
    for flag, value in (("--set", args.set), ("--train-tokenizer", args.train_tokenizer)):
        if value:
            raise ValueError(f"{flag} makes a new model; --lora adapts trained weights")
    if args.task == "classify":
        raise ValueError("--task classify trains a new head; it cannot go with --lora")
    source = _base_source(args)
    loading.check_source(source)
    from ..plugin.current import get_registry

    registry = get_registry()
    named = source in registry and not source.startswith("hf:")  # a name: the named model
    if named and registry.model(source).weights is None:
        raise ValueError(
            f"--lora adapts trained weights, and {source} has none (random weights only); "
            "name a model with weights (zoo list shows them), a checkpoint folder or "
            "hf:org/name"
        )
    _lora(args)  # rank, alpha, dropout, targets checked


def _check_chat(args: argparse.Namespace) -> None:
    """``--chat-template`` goes with ``--task chat``, and is a template that compiles."""
    if args.chat_template is None:
        return
    if args.task != "chat":
        raise ValueError("--chat-template renders conversations: it goes with --task chat")
    from ..tokenizers.chat_files import read_template_file

    read_template_file(args.chat_template)


def _check_train(args: argparse.Namespace) -> None:
    from ..tokenizers.vocab_files import read_manifest
    from ..train.data_files import text_files

    check_counts(args, train_bounds())
    _check_lora(args)
    _check_chat(args)
    if args.tokenizer_max_distinct is not None and args.train_tokenizer is None:
        raise ValueError("--tokenizer-max-distinct goes with --train-tokenizer")
    if not args.lora:
        _check_model(args)
    text_files(args.data)
    if args.task == "chat":  # every line, in one streaming pass: a bad one said before loading
        from ..train.chat_lines import count_conversations

        count_conversations(args.data)
    if args.tokenizer is not None:
        read_manifest(args.tokenizer)
    train_config(args)


def _check_model(args: argparse.Namespace) -> None:
    """NAME (a new model, its config changed by ``--set``) or ``--from`` (weights), once."""
    from .. import loading

    if (args.model is None) == (args.source is None):
        raise ValueError(
            "name the model once: NAME for a new model with random weights, or --from SOURCE "
            "(a checkpoint directory, hf:org/name, or a named model with weights) to fine-tune"
        )
    if args.model is not None:
        api.resolve_config(args.model, **dict(_override(item) for item in args.set or ()))
        return
    if args.train_tokenizer is not None:
        raise ValueError("--train-tokenizer makes a new vocabulary: it needs a new model")
    if args.set:
        raise ValueError("--set changes the config of a new model: it cannot go with --from")
    loading.check_source(args.source)


def _train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        nargs="?",
        metavar="NAME_OR_PATH",
        help="a named model to train from random weights (its config, changed by --set); "
        "with --lora, the base to adapt: a named model with weights, a checkpoint folder or "
        "hf:org/name[@rev]",
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
        choices=("lm", "seq2seq", "classify", "chat"),
        default="lm",
        help="lm: the model's own task; seq2seq: an encoder-decoder's own task, said outright "
        "(refused for a decoder): source<TAB>target pairs, teacher forcing, framed as its "
        "checkpoint trains it; classify: fine-tune it as a sequence classifier (a "
        "linear head on the last token, saved with the checkpoint); chat: fine-tune a "
        'decoder on conversations (a .jsonl file, one {"messages": [...]} per line), the '
        "loss on the assistant's replies only (default: lm)",
    )
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="with --task chat: render the conversations with this Jinja chat template "
        "instead of the tokenizer's own; saved with the result, so zoo chat uses it "
        "(default: the tokenizer's own)",
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
    _lora_arguments(p.add_argument_group("LoRA (zoo.LoRA)"))
    add_dataclass_flags(
        p.add_argument_group("training (zoo.train.TrainConfig)"), TrainConfig, DERIVED
    )


_ALPHA = 16.0  # zoo.LoRA's default (this module imports no torch to say so)


def _lora_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--lora",
        type=positive,
        metavar="RANK",
        help="train a LoRA of this rank on the frozen base instead of every weight; the run "
        "writes <out>/adapter/ (peft's format, with the base's name and sha256) (default: none)",
    )
    g.add_argument(
        "--lora-alpha",
        type=float,
        default=_ALPHA,
        metavar="A",
        help=f"the update is scaled by A / RANK (default: {_ALPHA:g})",
    )
    g.add_argument(
        "--lora-dropout",
        type=float,
        default=0.0,
        metavar="P",
        help="dropout on the adapters' input while training (default: 0)",
    )
    g.add_argument(
        "--lora-targets",
        nargs="+",
        metavar="NAME",
        help="the layers to adapt, by zoo module name (attn.qkv, attn.q, attn.proj, ffn.fc, "
        "ffn.proj, ...; a wrong one lists the model's) (default: the family's, attention's "
        "and the feed-forward's projections)",
    )
    g.add_argument(
        "--quantize",
        choices=QUANTIZE_MODES,
        help="with --lora: quantize the frozen base (QLoRA); the adapters train in float "
        "(default: none)",
    )


COMMANDS = {"train": Command(cmd_train, _train_arguments, _check_train)}
