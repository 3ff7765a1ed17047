"""``zoo generate`` and ``zoo classify``: one prompt continued, or texts labelled; and the
sampling flags ``zoo chat`` shares."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import api
from ..config import MAX_TOKENS
from ..options import GENERATION_DEFAULTS
from .bounds import MAX_SLOTS, Bound, check_counts, generation_bounds
from .parser import Command, check_utf8
from .source import add_model_loading, check_model, given_tokenizer, load_for_generation

if TYPE_CHECKING:
    from ..generation import GenerationConfig

__all__ = ["COMMANDS", "add_sampling", "generation_config", "print_pieces"]


def add_sampling(
    p: argparse.ArgumentParser, max_new_tokens: int | None, help_default: str | None = None
) -> None:
    """``--max-new-tokens``, ``--temperature``, ``--top-k``, ``--top-p`` and ``--seed``
    (``zoo generate``'s and ``zoo chat``'s); the defaults are ``zoo.generate``'s, so the same
    seed gives the same text (``zoo chat``'s ``--max-new-tokens`` defaults to ``None``: what
    the context leaves, said by ``help_default``)."""
    defaults = GENERATION_DEFAULTS
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=max_new_tokens,
        help=help_default or f"default: {max_new_tokens}",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=defaults.temperature,
        help=f"0 = greedy (default: {defaults.temperature})",
    )
    p.add_argument("--top-k", type=int, default=defaults.top_k, help="default: no filter")
    p.add_argument("--top-p", type=float, default=defaults.top_p, help="default: no filter")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="makes sampling reproducible: an integer from 0 to 2**64 - 1 (as zoo.generate's "
        "seed=)",
    )


def generation_config(
    args: argparse.Namespace,
    stop: tuple[str, ...] = (),
    default_max_new_tokens: int = GENERATION_DEFAULTS.max_new_tokens,
) -> GenerationConfig:
    """The sampling flags of ``zoo generate`` and ``zoo chat`` as a :class:`GenerationConfig`:
    every setting checked before anything is loaded or seeded. The steps' CPU threads are
    the command line's policy, ``ZOO_DECODE_THREADS`` (default: the cores other processes
    leave free, :class:`zoo.kernels.threads.DecodeThreads`). A ``--max-new-tokens`` left unset
    (``None``) is ``default_max_new_tokens``."""
    from ..generation import GenerationConfig
    from ..settings import Settings, threads_argument

    check_counts(args, generation_bounds())
    return GenerationConfig(
        max_new_tokens=(
            default_max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
        ),
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=stop,
        compile=args.compile,
        threads=threads_argument(Settings.from_env().decode_threads),
    )


def print_pieces(pieces: Iterable[str]) -> str:
    """Print ``pieces`` as they arrive, then end the line (on an error too, so that it is
    printed on a line of its own); returns the text printed."""
    printed = []
    try:
        for piece in pieces:
            print(piece, end="", flush=True)
            printed.append(piece)
    finally:
        print(flush=True)
    return "".join(printed)


#: ``zoo generate``'s beam-search flags: (argument's dest, its flag, the bound, why).
_SEARCH_BOUNDS: list[Bound] = [
    ("num_beams", "--num-beams", MAX_SLOTS, "beams decode together, each with its own cache"),
    ("no_repeat_ngram_size", "--no-repeat-ngram-size", MAX_TOKENS, "the longest context"),
    ("min_new_tokens", "--min-new-tokens", MAX_TOKENS, "the longest context a model has"),
]

#: The beam-search and constraint flags' dests, each a GenerationConfig field.
_SEARCH_FIELDS = ("num_beams", "length_penalty", "early_stopping", "no_repeat_ngram_size",
                  "min_new_tokens")  # fmt: skip


def add_search(p: argparse.ArgumentParser) -> None:
    """``zoo generate``'s beam-search flags (``zoo.generate``'s ``num_beams`` ...); each
    unset one is the checkpoint's ``generation_config.json``'s, else zoo's default."""
    p.add_argument(
        "--num-beams",
        type=int,
        default=None,
        help="beam search with N beams, transformers' to the token (default: 1, or the "
        "checkpoint's generation_config.json); the text is printed once it is found",
    )
    p.add_argument(
        "--length-penalty",
        type=float,
        default=None,
        help="beam search: a hypothesis scores its log-probability / length**this (default: 1)",
    )
    p.add_argument(
        "--early-stopping",
        choices=("true", "false", "never"),
        default=None,
        help="when a beam search ends (default: false: transformers' heuristic)",
    )
    p.add_argument(
        "--no-repeat-ngram-size",
        type=int,
        default=None,
        help="no n-gram of this many tokens occurs twice (default: 0, no check)",
    )
    p.add_argument(
        "--min-new-tokens",
        type=int,
        default=None,
        help="the end-of-text is not picked before this many new tokens (default: 0)",
    )


def _search_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The beam-search flags given, as GenerationConfig values."""
    values: dict[str, Any] = {
        name: getattr(args, name) for name in _SEARCH_FIELDS if getattr(args, name) is not None
    }
    stopping = values.get("early_stopping")
    if stopping is not None:
        values["early_stopping"] = {"true": True, "false": False}.get(str(stopping), stopping)
    return values


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate text from a prompt, streaming it to the terminal (a beam search's text is
    printed once found): a decoder's prompt and its continuation, an encoder-decoder's
    target alone (the prompt is its source)."""
    from ..generation import generate_text, stream_text
    from ..generation.checkpoint_defaults import with_checkpoint_defaults

    config = _generate_config(args)
    model = load_for_generation(args, args.adapter)
    tokenizer = given_tokenizer(args)
    given = [*_search_settings(args)]
    if args.max_new_tokens is not None:
        given.append("max_new_tokens")
    config = with_checkpoint_defaults(config, model, given)
    # a decoder's text continues the prompt; an encoder-decoder's (a translation) stands alone
    echo = "" if model.is_encoder_decoder else args.prompt
    if config.num_beams > 1:
        text = generate_text(model, args.prompt, config, tokenizer=tokenizer)
        print(echo + text, flush=True)
        return 0
    # the tokenizer and the prompt are checked here, before anything is printed
    pieces = stream_text(model, args.prompt, config, tokenizer=tokenizer)
    print(echo, end="", flush=True)
    print_pieces(pieces)
    return 0


def _generate_config(args: argparse.Namespace) -> GenerationConfig:
    """``zoo generate``'s prompt, stop strings, sampling and beam-search flags, checked (no
    torch)."""
    import dataclasses

    check_utf8(args.prompt, "the prompt")
    for stop in args.stop or ():
        check_utf8(stop, "a --stop string")
    check_counts(args, _SEARCH_BOUNDS)
    config = generation_config(args, stop=tuple(args.stop or ()))
    return dataclasses.replace(config, **_search_settings(args))


def _check_generate(args: argparse.Namespace) -> None:
    _generate_config(args)
    check_model(args, adapter=True)


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        metavar="NAME_OR_SOURCE",
        help="named model (official weights), hf:org/name[@rev], or a directory",
    )
    p.add_argument(
        "prompt", help="the text to continue (an encoder-decoder's source: its target is printed)"
    )
    add_sampling(
        p,
        None,
        f"default: {GENERATION_DEFAULTS.max_new_tokens}, or the checkpoint's "
        "generation_config.json's",
    )
    add_search(p)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument(
        "--tokenizer",
        metavar="NAME",
        default=None,
        help="the tokenizer to use: a named model's or a registered tokenizer's name "
        "(default: the one saved with the checkpoint or declared by its named model)",
    )
    add_model_loading(p, adapter=True)


def cmd_classify(args: argparse.Namespace) -> int:
    """Label texts with a sequence classifier (a checkpoint saved by `zoo train --task
    classify`): prints each text's label, its probability and the text, tab-separated."""
    import torch

    from .. import loading

    model = loading.load(args.checkpoint, device=args.device)
    labels = getattr(model.config, "labels", None)
    if not isinstance(labels, list):
        raise ValueError(
            f"{args.checkpoint} is a {type(model).__name__} ({type(model.config).architecture}), "
            "not a sequence classifier: it has no labels. Continue text with `zoo generate`; "
            "train a classifier with `zoo train --task classify`"
        )
    tokenizer = api.tokenizer(args.tokenizer) if args.tokenizer else model.tokenizer
    if tokenizer is None:
        raise ValueError(
            f"{args.checkpoint} was loaded without a tokenizer "
            f"({model.tokenizer_error or 'none was saved with it'}); pass --tokenizer NAME"
        )
    device = next(model.parameters()).device
    for i, text in enumerate(args.texts):
        ids = tokenizer.encode(text)
        if not ids:
            raise ValueError(f"text {i + 1} is empty: give some text to classify")
        with torch.inference_mode():
            logits = model(torch.tensor([ids], device=device))  # (1, n_labels)
        probs = logits.float().softmax(dim=-1)[0]
        best = int(probs.argmax())
        print(f"{labels[best]}\t{float(probs[best]):.4f}\t{text}", flush=True)
    return 0


def _check_classify(args: argparse.Namespace) -> None:
    from .. import loading

    for i, text in enumerate(args.texts):
        check_utf8(text, f"text {i + 1}")
    loading.check_source(args.checkpoint)
    if args.tokenizer:
        api.check_tokenizer(args.tokenizer)


def _classify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a classifier: a directory written by zoo train --task classify, or hf:org/name",
    )
    p.add_argument("texts", nargs="+", metavar="TEXT", help="the texts to label")
    p.add_argument(
        "--tokenizer",
        metavar="NAME",
        default=None,
        help="a named model's or a registered tokenizer's name (default: the checkpoint's)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cpu)")


COMMANDS = {
    "generate": Command(cmd_generate, _generate_arguments, _check_generate),
    "classify": Command(cmd_classify, _classify_arguments, _check_classify),
}
