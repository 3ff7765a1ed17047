"""Text in, text out: thin wrappers over :mod:`zoo.generation.core` that encode the prompt,
fill the tokenizer's end ids, bos and vocabulary size into the settings, and decode the
new tokens (cut at the first stop string) through one :class:`~zoo.generation.reply.Reply`
per row. :func:`stream_text` yields the same text in pieces as the tokens arrive;
:func:`stream_continuation` does so for a prompt of ids (a chat template's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from ..tokenizers.base import check_fits
from .config import GenerationConfig, check_text
from .core import left_pad, new_tokens, stream_ids
from .reply import Reply

if TYPE_CHECKING:
    from ..nn.base import ZooModel
    from ..tokenizers import Tokenizer

__all__ = [
    "generate_text",
    "generate_texts",
    "resolve_tokenizer",
    "stream_continuation",
    "stream_text",
    "with_tokenizer",
]


def resolve_tokenizer(model: ZooModel, tokenizer: Tokenizer | None, why: str) -> Tokenizer:
    """The tokenizer to use: the one given, the model's own, or its named model's; it must
    fit the model's vocabulary. ``why`` says what needs it, for the error."""
    if tokenizer is None:
        tokenizer = model.tokenizer
    if tokenizer is None and model.tokenizer_error is not None:
        raise ValueError(
            f"{why} needs a tokenizer, and this model was loaded without its tokenizer: "
            f"{model.tokenizer_error}. Pass tokenizer=..., or give ids instead of text"
        )
    if tokenizer is None and model.name:
        from ..plugin.current import get_registry  # only here: a model that brings none

        tokenizer = get_registry().model_tokenizer(model.name).load()
    if tokenizer is None:
        raise ValueError(f"{why} needs a tokenizer: pass tokenizer=... (the model has none)")
    check_fits(tokenizer, model.config.vocab_size)  # type: ignore[attr-defined]
    return tokenizer


def with_tokenizer(
    config: GenerationConfig, tokenizer: Tokenizer | None, model: ZooModel
) -> GenerationConfig:
    """``config`` with what it leaves open taken from ``tokenizer``: the end-of-text id and
    the other end ids (:attr:`~zoo.tokenizers.Tokenizer.end_ids`, when neither ``eos_id`` nor
    ``stop_ids`` is set), the vocabulary size (ids the tokenizer lacks are never picked) and,
    for an encoder-decoder, the start token (its bos)."""
    if tokenizer is None:
        return config
    start_id = config.start_id
    if start_id is None and model.is_encoder_decoder:
        start_id = tokenizer.bos_id
    stop_ids = config.stop_ids
    if stop_ids is None and config.eos_id is None:
        stop_ids = tuple(getattr(tokenizer, "end_ids", ()))  # (a duck-typed one may lack them)
    return dataclasses.replace(
        config,
        eos_id=config.eos_id if config.eos_id is not None else tokenizer.eos_id,
        stop_ids=stop_ids,
        vocab_limit=config.vocab_limit if config.vocab_limit is not None else tokenizer.vocab_size,
        start_id=start_id,
    )


def _encode(
    model: ZooModel, prompts: Sequence[str], config: GenerationConfig, tokenizer: Tokenizer | None
) -> tuple[Tokenizer, GenerationConfig, list[list[int]]]:
    for i, prompt in enumerate(prompts):
        check_text(prompt, f"prompt {i}")
    tok = resolve_tokenizer(model, tokenizer, "a text prompt")
    return tok, with_tokenizer(config, tok, model), [_prompt_ids(model, tok, p) for p in prompts]


def _prompt_ids(model: ZooModel, tok: Tokenizer, prompt: str) -> list[int]:
    """A decoder's prompt as its ids; an encoder-decoder's source with the sequence tokens
    where its tokenizer says a source has them (``transformers``' tokenizers: Marian's and
    T5's ``</s>``, BART's ``<s> ... </s>``)."""
    if model.is_encoder_decoder and getattr(tok, "source_special_tokens", False):
        return tok.encode(prompt, add_special_tokens=True)
    return tok.encode(prompt)


def _contexts(model: ZooModel, rows: list[list[int]]) -> list[list[int]]:
    """What each row's text is decoded after: a decoder's prompt; nothing for an
    encoder-decoder, whose target stands alone."""
    return [[] if model.is_encoder_decoder else row for row in rows]


def generate_texts(
    model: ZooModel,
    prompts: Sequence[str],
    config: GenerationConfig | None = None,
    *,
    tokenizer: Tokenizer | None = None,
) -> list[str]:
    """The continuation of each prompt, as text (prompts of different lengths are
    left-padded into one batch; each gives what it would alone). With
    ``config.num_return_sequences`` above 1 (a beam search), each prompt's best
    continuations in turn, best first.

    The new tokens are decoded together with their prompt and returned as the text that
    follows the prompt's, so word boundaries are kept; the text ends before the end-of-text
    token and before the first of ``config.stop``.

    Args:
        model: a zoo model (decoder-only or encoder-decoder: the prompt is then the source).
        prompts: the texts to continue.
        config: the settings (default: :class:`GenerationConfig`'s defaults).
        tokenizer: defaults to ``model.tokenizer`` or the named model's.
    """
    config = config if config is not None else GenerationConfig()
    tok, config, rows = _encode(model, prompts, config, tokenizer)
    ids, keep = left_pad(rows, torch.device("cpu"))
    new = new_tokens(model, ids, keep, config).tolist()  # (B * returned, N)
    each = config.num_return_sequences  # a beam search's hypotheses, each prompt's in turn
    contexts = [context for context in _contexts(model, rows) for _ in range(each)]
    return [
        "".join(_pieces(tokens, Reply(tok, context, config)))
        for context, tokens in zip(contexts, new, strict=True)
    ]


def generate_text(
    model: ZooModel,
    prompt: str,
    config: GenerationConfig | None = None,
    *,
    tokenizer: Tokenizer | None = None,
) -> str:
    """The continuation of ``prompt``, as text: :func:`generate_texts` of one prompt (whose
    ``num_return_sequences`` must be 1: :func:`generate_texts` of ``[prompt]`` returns
    several)."""
    check_text(prompt)
    if config is not None and config.num_return_sequences > 1:
        raise ValueError(
            f"num_return_sequences={config.num_return_sequences} returns several texts, and "
            "generate_text returns one: call generate_texts([prompt], ...) for the list"
        )
    return generate_texts(model, [prompt], config, tokenizer=tokenizer)[0]


def stream_text(
    model: ZooModel,
    prompt: str,
    config: GenerationConfig | None = None,
    *,
    tokenizer: Tokenizer | None = None,
) -> Iterator[str]:
    """The continuation of ``prompt`` in pieces as the tokens arrive; the pieces join to
    :func:`generate_text`'s result. The prompt is checked and the model prefilled when this
    is called, before the first piece; a piece is held back while it ends inside a
    multi-byte character or could be the start of a stop string."""
    check_text(prompt)
    config = config if config is not None else GenerationConfig()
    tok, config, rows = _encode(model, [prompt], config, tokenizer)
    return _stream(model, tok, config, rows[0])


def stream_continuation(
    model: ZooModel,
    prompt_ids: Sequence[int],
    config: GenerationConfig | None = None,
    *,
    tokenizer: Tokenizer | None = None,
) -> Iterator[str]:
    """:func:`stream_text` for a prompt given as ids: the text that follows them, in pieces
    as the tokens arrive (a chat prompt is ids, its template's control tokens included; see
    :meth:`zoo.tokenizers.Tokenizer.apply_chat_template`). The text ends before the first of
    the end ids and of ``config.stop``."""
    config = config if config is not None else GenerationConfig()
    tok = resolve_tokenizer(model, tokenizer, "text output")
    return _stream(model, tok, with_tokenizer(config, tok, model), list(prompt_ids))


def _stream(
    model: ZooModel, tok: Tokenizer, config: GenerationConfig, row: list[int]
) -> Iterator[str]:
    """The text that follows the prompt ``row`` in pieces; the model is prefilled now."""
    ids, _ = left_pad([row], torch.device("cpu"))
    steps = stream_ids(model, ids, None, config)
    return _pieces((int(step[0]) for step in steps), Reply(tok, _contexts(model, [row])[0], config))


def _pieces(tokens: Iterable[int], reply: Reply) -> Iterator[str]:
    """The text of ``reply`` in pieces as ``tokens`` arrive, until it ends."""
    for token in tokens:
        piece = reply.push(token)
        if piece:
            yield piece
        if reply.reason is not None:
            break
    rest = reply.finish()
    if rest:
        yield rest
