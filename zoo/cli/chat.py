"""``zoo chat``: a conversation with an instruct model through its chat template."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .generate import add_sampling, generation_config, print_pieces
from .output import printable
from .parser import Command, check_utf8
from .source import add_model_loading, check_model, given_tokenizer, load_for_generation

if TYPE_CHECKING:
    from ..generation import GenerationConfig
    from ..nn.base import ZooModel
    from ..tokenizers import Tokenizer

__all__ = ["CHAT_MAX_NEW_TOKENS", "COMMANDS"]

#: The longest reply ``zoo chat`` generates by default: each turn takes what the context
#: leaves after its prompt, up to this many tokens (``--max-new-tokens`` fixes the length).
CHAT_MAX_NEW_TOKENS = 512


def cmd_chat(args: argparse.Namespace) -> int:
    """Chat with an instruct model: each line you type is a message, the reply streams back.
    The whole conversation goes through the model's chat template every turn; /reset starts
    over, /exit or end of input quits."""
    from ..generation.text import resolve_tokenizer
    from ..tokenizers import ChatTemplateError

    config = _chat_config(args)
    model = load_for_generation(args, args.adapter)
    context = _check_fits(args, model)
    tokenizer = resolve_tokenizer(model, given_tokenizer(args), "zoo chat")
    if tokenizer.chat_template is None:
        raise ChatTemplateError(
            f"{args.source} has no chat template: its tokenizer ({tokenizer.name}) defines none "
            "(no chat_template in tokenizer_config.json, no chat_template.jinja). zoo chat "
            "needs an instruct model's; continue plain text with `zoo generate`, or give a "
            "tokenizer folder that has one with --tokenizer DIR"
        )
    opening = [] if args.system is None else [{"role": "system", "content": args.system}]
    history = list(opening)
    reply = _replier(model, tokenizer, _Lengths(config, context, args.max_new_tokens is None))
    unanswered = 0
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"zoo chat with {args.source}: /reset starts over, /exit quits", file=sys.stderr)
    for line in _input_lines(interactive):
        text = line.strip()
        if text == "/exit":
            break
        if text == "/reset":
            history = list(opening)
            print("(conversation cleared)", file=sys.stderr, flush=True)
            continue
        if text:
            answered = _chat_turn(reply, tokenizer, history, line)
            unanswered += answered is None
            history = history if answered is None else answered
    return 1 if unanswered else 0


class _Lengths:
    """Each turn's generation settings: ``config`` with ``max_new_tokens`` set to what the
    context leaves after the prompt, up to :data:`CHAT_MAX_NEW_TOKENS` (``fit``), or as
    given (a prompt that leaves less is then refused by the decoding, as every path does)."""

    def __init__(self, config: GenerationConfig, context: int | None, fit: bool) -> None:
        self.config, self.context, self.fit = config, context, fit

    def __call__(self, prompt_tokens: int) -> GenerationConfig:
        if not self.fit or self.context is None or prompt_tokens >= self.context:
            return self.config  # (a full context: the decoding's own error says so)
        room = min(CHAT_MAX_NEW_TOKENS, self.context - prompt_tokens)
        return dataclasses.replace(self.config, max_new_tokens=room)


def _check_fits(args: argparse.Namespace, model: ZooModel) -> int | None:
    """The model's context length; a ``--max-new-tokens`` that leaves no room for a prompt
    in it is refused now (no turn could be answered)."""
    context = getattr(model.config, "context_length", None)
    asked = args.max_new_tokens
    if isinstance(context, int) and asked is not None and asked >= context:
        raise ValueError(
            f"--max-new-tokens {asked} leaves no room for a prompt in {args.source}'s "
            f"{context}-token context: give at most {context - 1}, or leave it out (each "
            f"reply then takes what the context leaves, up to {CHAT_MAX_NEW_TOKENS})"
        )
    return context if isinstance(context, int) else None


#: What streams a turn's reply: its prompt ids in, its text out in pieces.
Replier = Callable[[list[int]], Iterator[str]]


def _replier(model: ZooModel, tokenizer: Tokenizer, lengths: _Lengths) -> Replier:
    """How the turns are answered: on a one-slot engine whose prefix cache keeps the
    conversation so far (each turn computes only what it adds), or, for a model that cannot
    decode in slots, by :func:`stream_continuation` afresh."""
    from ..generation import stream_continuation
    from ..generation.text import with_tokenizer
    from ..runtime.slots import check_batchable

    try:
        check_batchable(model)
    except ValueError:
        return lambda ids: stream_continuation(model, ids, lengths(len(ids)), tokenizer=tokenizer)
    from ..serve.local import Turns
    from ..settings import Settings

    settings = Settings.from_env()
    turns = Turns(
        model,  # type: ignore[arg-type]  # a DecoderLM: checked
        tokenizer,
        decode_threads=settings.decode_threads,
        compile=lengths.config.compile,
        cuda_graphs=settings.cuda_graphs,
    )
    return lambda ids: turns.stream(ids, with_tokenizer(lengths(len(ids)), tokenizer, model))


def _chat_config(args: argparse.Namespace) -> GenerationConfig:
    """``zoo chat``'s system message and sampling flags, checked (no torch)."""
    if args.system is not None:
        check_utf8(args.system, "--system")
    return generation_config(args, default_max_new_tokens=CHAT_MAX_NEW_TOKENS)


def _check_chat(args: argparse.Namespace) -> None:
    _chat_config(args)
    check_model(args, adapter=True)


def _input_lines(prompt: bool) -> Iterator[str]:
    """The lines of standard input, decoded as UTF-8 (a byte that is not becomes U+FFFD),
    without their line ends; ``> `` before each on a terminal."""
    stream = getattr(sys.stdin, "buffer", None)
    while True:
        if prompt:
            print("> ", end="", file=sys.stderr, flush=True)
        raw = stream.readline() if stream is not None else sys.stdin.readline()
        if not raw:
            return
        line = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        yield line.rstrip("\r\n")


def _chat_turn(
    reply: Replier,
    tokenizer: Tokenizer,
    history: list[dict[str, str]],
    message: str,
) -> list[dict[str, str]] | None:
    """Send ``message`` after ``history``, stream the reply to stdout, and return the
    conversation with both; a turn the template or the model refuses (a conversation too
    long for the context) is reported and left out (``None``)."""
    turn = [*history, {"role": "user", "content": message}]
    try:
        ids = tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=True)
        pieces = reply(ids)
    except ValueError as exc:  # ChatTemplateError, or a prompt the context cannot hold
        print(f"zoo: error: {printable(exc)} (/reset starts over)", file=sys.stderr)
        return None
    return [*turn, {"role": "assistant", "content": print_pieces(pieces)}]


def _chat_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        metavar="NAME_OR_SOURCE",
        help="an instruct model with a chat template: a named model, hf:org/name[@rev], or a "
        "directory",
    )
    p.add_argument(
        "--system",
        metavar="TEXT",
        default=None,
        help="a system message that opens the conversation (default: none, the template's)",
    )
    add_sampling(
        p,
        None,
        f"default: what the context leaves after the conversation, up to {CHAT_MAX_NEW_TOKENS}",
    )
    p.add_argument(
        "--tokenizer",
        metavar="NAME_OR_DIR",
        default=None,
        help="the tokenizer (and its chat template) to use: a named model's or a registered "
        "tokenizer's name, or a tokenizer folder (default: the model's own)",
    )
    add_model_loading(p, adapter=True)


COMMANDS = {"chat": Command(cmd_chat, _chat_arguments, _check_chat)}
