"""``zoo.generate``: one entry point that takes every prompt form the README shows and hands
it to the wrapper for that form, with a return type exact for each (``typing.overload``):

==========================  =======================  =====================================
prompt                      returns                  through
==========================  =======================  =====================================
``str``                     ``str``                  :func:`~zoo.generation.generate_text`
``str``, ``stream=True``    ``Iterator[str]``        :func:`~zoo.generation.stream_text`
``list[str]``               ``list[str]``            :func:`~zoo.generation.generate_texts`
``Tensor`` ``(B, T)``       ``Tensor`` ``(B, T+N)``  :func:`~zoo.generation.generate_ids`
``list[int]``               ``list[int]``            :func:`~zoo.generation.stream_ids`
``list[list[int]]``         ``list[list[int]]``      :func:`~zoo.generation.stream_ids`
==========================  =======================  =====================================
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict, overload

import torch
from torch import Tensor

from ..tokenizers.base import check_fits
from .checkpoint_defaults import checkpoint_defaults
from .config import DEFAULTS, GenerationConfig
from .core import generate_ids, left_pad, new_tokens
from .reply import until_eos
from .text import generate_text, generate_texts, stream_text, with_tokenizer

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..nn.base import ZooModel
    from ..tokenizers import Tokenizer

__all__ = ["SearchOptions", "generate"]


class SearchOptions(TypedDict, total=False):
    """The beam-search and constraint settings of :func:`generate` (each a
    :class:`GenerationConfig` field; ``None`` or left out: the checkpoint's
    ``generation_config.json``, else zoo's default)."""

    num_beams: int | None
    num_return_sequences: int | None
    length_penalty: float | None
    early_stopping: bool | Literal["never"] | None
    no_repeat_ngram_size: int | None
    min_new_tokens: int | None
    min_length: int | None
    bad_words_ids: Sequence[Sequence[int]] | None
    forced_bos_id: int | None
    forced_eos_id: int | Sequence[int] | None


def _own_tokenizer(model: ZooModel, tokenizer: Tokenizer | None) -> Tokenizer | None:
    """For ids in and ids out: the tokenizer given or the model's own (for its end-of-text
    id and vocabulary size), checked against the model's vocabulary; none is needed."""
    tok = tokenizer if tokenizer is not None else model.tokenizer
    if tok is not None:
        check_fits(tok, model.config.vocab_size)  # type: ignore[attr-defined]
    return tok


def _left_aligned(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """A batch padded on the right (or on both sides) with its tokens moved to the right end
    of each row, so that it is padded on the left only: ``(B, T)`` ids and mask."""
    keep = mask.bool()
    order = torch.sort(keep.long(), dim=1, stable=True).indices  # padding first, tokens in order
    return ids.gather(1, order), keep.gather(1, order)


def _generate_tensor(
    model: ZooModel,
    prompt: Tensor,
    attention_mask: Tensor | None,
    config: GenerationConfig,
    tokenizer: Tokenizer | None,
) -> Tensor:
    ids = prompt[None] if prompt.ndim == 1 else prompt  # (T,) -> (1, T)
    mask = None
    if attention_mask is not None:
        mask = attention_mask[None] if attention_mask.ndim == 1 else attention_mask
        if not model.is_encoder_decoder and tuple(mask.shape) == tuple(ids.shape):
            ids, mask = _left_aligned(ids, mask)  # a decoder appends to the end of each row
    config = with_tokenizer(config, _own_tokenizer(model, tokenizer), model)
    return generate_ids(model, ids, mask, config)


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _id_rows(prompt: object) -> tuple[list[list[int]], bool] | None:
    """The rows of an id prompt and whether it was a single row, or ``None`` when ``prompt``
    is neither a list of ids nor a list of id lists."""
    if not isinstance(prompt, Sequence) or isinstance(prompt, str) or not prompt:
        return None
    if all(_is_id(p) for p in prompt):
        return [list(prompt)], True
    if all(isinstance(p, Sequence) and all(_is_id(i) for i in p) for p in prompt):
        return [list(p) for p in prompt], False
    return None


def _generate_rows(
    model: ZooModel, prompt: object, config: GenerationConfig, tokenizer: Tokenizer | None
) -> list[int] | list[list[int]]:
    found = _id_rows(prompt)
    if found is None:
        raise ValueError(
            "prompt must be a string, a list of strings, a list of int ids, a list of id lists "
            f"or an integer tensor of ids; got {type(prompt).__name__} {str(prompt)[:60]!r}"
        )
    rows, single = found
    _check_one_result(config, single, "a list of ids", "[ids]")
    config = with_tokenizer(config, _own_tokenizer(model, tokenizer), model)
    ids, keep = left_pad(rows, torch.device("cpu"))
    new = new_tokens(model, ids, keep, config).tolist()  # (B * returned, N)
    if model.is_encoder_decoder:
        assert config.start_id is not None  # generation refuses an encoder-decoder without
        rows = [[config.start_id] for _ in rows]  # the target starts with the start token
    rows = [row for row in rows for _ in range(config.num_return_sequences)]
    out = [row + until_eos(tokens, config.end_ids) for row, tokens in zip(rows, new, strict=True)]
    return out[0] if single else out


def _check_one_result(config: GenerationConfig, single: bool, form: str, wrapped: str) -> None:
    """A single prompt's form returns one result: ``num_return_sequences > 1`` needs the
    batch form (a list of one prompt), which returns them all."""
    if single and config.num_return_sequences > 1:
        raise ValueError(
            f"num_return_sequences={config.num_return_sequences} returns several results, and "
            f"{form} gives one: pass the prompt as a batch of one ({wrapped}) to get a list "
            "of them, each prompt's best first"
        )


def _stops(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


@overload
def generate(
    model: ZooModel,
    prompt_or_ids: str,
    *,
    tokenizer: Tokenizer | None = ...,
    max_new_tokens: int | None = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: str | Sequence[str] | None = ...,
    stream: Literal[False] = ...,
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
    **options: Unpack[SearchOptions],
) -> str: ...
@overload
def generate(
    model: ZooModel,
    prompt_or_ids: str,
    *,
    tokenizer: Tokenizer | None = ...,
    max_new_tokens: int | None = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: str | Sequence[str] | None = ...,
    stream: Literal[True],
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
    **options: Unpack[SearchOptions],
) -> Iterator[str]: ...
@overload
def generate(
    model: ZooModel,
    prompt_or_ids: list[str] | tuple[str, ...],
    *,
    tokenizer: Tokenizer | None = ...,
    max_new_tokens: int | None = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: str | Sequence[str] | None = ...,
    stream: Literal[False] = ...,
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
    **options: Unpack[SearchOptions],
) -> list[str]: ...
@overload
def generate(
    model: ZooModel,
    prompt_or_ids: Tensor,
    *,
    attention_mask: Tensor | None = ...,
    tokenizer: Tokenizer | None = ...,
    max_new_tokens: int | None = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: None = ...,
    stream: Literal[False] = ...,
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
    **options: Unpack[SearchOptions],
) -> Tensor: ...
@overload
def generate(
    model: ZooModel,
    prompt_or_ids: list[int],
    *,
    tokenizer: Tokenizer | None = ...,
    max_new_tokens: int | None = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: None = ...,
    stream: Literal[False] = ...,
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
    **options: Unpack[SearchOptions],
) -> list[int]: ...
@overload
def generate(
    model: ZooModel,
    prompt_or_ids: list[list[int]],
    *,
    tokenizer: Tokenizer | None = ...,
    max_new_tokens: int | None = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: None = ...,
    stream: Literal[False] = ...,
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
    **options: Unpack[SearchOptions],
) -> list[list[int]]: ...
def generate(
    model: ZooModel,
    prompt_or_ids: Any,
    *,
    attention_mask: Tensor | None = None,
    tokenizer: Tokenizer | None = None,
    max_new_tokens: int | None = None,
    temperature: float = DEFAULTS.temperature,
    top_k: int | None = DEFAULTS.top_k,
    top_p: float | None = DEFAULTS.top_p,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    stream: bool = False,
    start_id: int | None = None,
    compile: bool = False,
    threads: int | Literal["auto"] | None = None,
    num_beams: int | None = None,
    num_return_sequences: int | None = None,
    length_penalty: float | None = None,
    early_stopping: bool | Literal["never"] | None = None,
    no_repeat_ngram_size: int | None = None,
    min_new_tokens: int | None = None,
    min_length: int | None = None,
    bad_words_ids: Sequence[Sequence[int]] | None = None,
    forced_bos_id: int | None = None,
    forced_eos_id: int | Sequence[int] | None = None,
) -> str | Iterator[str] | list[str] | Tensor | list[int] | list[list[int]]:
    """Generate from a prompt, through the model's decoding session (a KV cache for the
    built-in models). The settings become one :class:`GenerationConfig`; the prompt's form
    picks the wrapper, and the return type follows it.

    Args:
        model: a zoo model (decoder-only or encoder-decoder).
        prompt_or_ids: a string (returns the continuation as a string), a list of strings
            (a list of continuations), or ids: a ``(B, T)`` tensor (returns a tensor: each
            prompt followed by its new tokens, rows that ended early filled with the
            end-of-text id), a list of ints (a list) or a list of id lists (a list of
            lists, each as long as its prompt plus its new tokens up to its end-of-text).
            Prompts of different lengths are left-padded; each gives what it would alone.
            For an encoder-decoder the prompt is the source and the returned ids are the
            target (``start_id`` followed by the new tokens).
        attention_mask: with a tensor of ids, its padding mask ``(B, T)`` (1 for tokens,
            0 for padding), on the left or on the right: a decoder's rows padded on the
            right are moved to the left padding first (a decoder appends to the end of each
            row; the returned prompts are the moved ones), an encoder-decoder's source is
            read as it is.
        tokenizer: defaults to ``model.tokenizer`` or (for text) the named model's
            tokenizer; supplies the end-of-text id, the vocabulary (ids of a larger, padded
            model vocabulary are never picked) and an encoder-decoder's start token.
        max_new_tokens, temperature, top_k, top_p, seed, start_id, compile: the fields of
            :class:`GenerationConfig` (defaults :data:`zoo.options.GENERATION_DEFAULTS`,
            which ``zoo generate`` uses too). ``compile=True`` runs each decoding step
            through ``torch.compile`` (CPU, decoders only; the first call compiles for a
            while; needs a C++ compiler).
        stop: stop strings (text only); the text ends before the first one.
        threads: the CPU threads of each decoding step. ``None`` (default) leaves torch's
            thread counts as the caller set them: a library call changes no process-wide
            state. ``"auto"`` runs each step with the cores other processes leave free, at
            most torch's count, and puts the count back after each step (what
            ``zoo generate``, ``zoo chat`` and ``zoo serve`` do, by ``ZOO_DECODE_THREADS``);
            ``N`` runs steps with ``N`` threads.
        stream: with a string prompt, return an iterator of text pieces instead.
        num_beams, num_return_sequences, length_penalty, early_stopping: beam search
            (:mod:`zoo.generation.beam`, transformers' to the token) when ``num_beams > 1``;
            ``num_return_sequences`` best hypotheses per prompt, best first (a batch form
            then returns ``B * num_return_sequences`` results, each prompt's in turn).
        no_repeat_ngram_size, min_new_tokens, min_length, bad_words_ids, forced_bos_id,
            forced_eos_id: constraints on every pick (:mod:`zoo.generation.constraints`),
            in greedy, sampled and beam decoding alike.

    What is left ``None`` (``max_new_tokens``, ``start_id`` and the beam and constraint
    settings) comes from the model's ``generation_config.json`` where :func:`zoo.load` found
    one (:mod:`zoo.generation.checkpoint_defaults`), else from zoo's defaults (50 new tokens,
    one beam, no constraint).

    A decoder's continuation is decoded together with its prompt and returned as the text
    that follows the prompt's, so word boundaries (the space WordPiece puts between words)
    are kept.

    Raises:
        ValueError: a bad argument, an empty prompt, text that is not Unicode (a lone
            surrogate), or a prompt too long for the context.
    """
    config = _config(
        model,
        {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed},
        {"stop": _stops(stop), "compile": compile, "threads": threads},
        {
            "max_new_tokens": max_new_tokens,
            "start_id": start_id,
            "num_beams": num_beams,
            "num_return_sequences": num_return_sequences,
            "length_penalty": length_penalty,
            "early_stopping": early_stopping,
            "no_repeat_ngram_size": no_repeat_ngram_size,
            "min_new_tokens": min_new_tokens,
            "min_length": min_length,
            "bad_words_ids": bad_words_ids,
            "forced_bos_id": forced_bos_id,
            "forced_eos_id": forced_eos_id,
        },
    )
    return _route(model, prompt_or_ids, attention_mask, config, tokenizer, stream)


def _config(
    model: ZooModel, sampling: dict[str, Any], running: dict[str, Any], open_: dict[str, Any]
) -> GenerationConfig:
    """One :class:`GenerationConfig`: the ``sampling`` and ``running`` settings as given, the
    ``open_`` ones as given where not ``None``, else the checkpoint's, else zoo's defaults."""
    given = {name: value for name, value in open_.items() if value is not None}
    chosen = {
        "max_new_tokens": DEFAULTS.max_new_tokens,
        **checkpoint_defaults(model, given),
        **given,
    }
    return GenerationConfig(**sampling, **running, **chosen)


def _route(
    model: ZooModel,
    prompt: Any,
    attention_mask: Tensor | None,
    config: GenerationConfig,
    tokenizer: Tokenizer | None,
    stream: bool,
) -> str | Iterator[str] | list[str] | Tensor | list[int] | list[list[int]]:
    """:func:`generate` of ``prompt`` with ``config``: the wrapper its form asks for."""
    if stream and not isinstance(prompt, str):
        raise ValueError(
            "stream=True takes a single prompt, a string; for ids step by step use "
            "zoo.generation.stream_ids"
        )
    if attention_mask is not None and not isinstance(prompt, Tensor):
        raise ValueError(
            "attention_mask goes with a tensor of ids; lists of ids and texts are padded by "
            "zoo (pass the ids as a tensor with its mask, or the rows as a list of lists)"
        )
    if isinstance(prompt, str):
        if stream:
            return stream_text(model, prompt, config, tokenizer=tokenizer)
        _check_one_result(config, True, "a string", "[text]")
        return generate_text(model, prompt, config, tokenizer=tokenizer)
    if isinstance(prompt, Sequence) and prompt and all(isinstance(p, str) for p in prompt):
        return generate_texts(model, prompt, config, tokenizer=tokenizer)
    if config.stop:
        raise ValueError(
            "stop strings cut text, and ids in give ids out: give text, or end rows with an "
            "end-of-text id (the tokenizer's eos_id, GenerationConfig.eos_id)"
        )
    if isinstance(prompt, Tensor):
        return _generate_tensor(model, prompt, attention_mask, config, tokenizer)
    return _generate_rows(model, prompt, config, tokenizer)
