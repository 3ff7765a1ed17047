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
from typing import TYPE_CHECKING, Any, Literal, overload

import torch
from torch import Tensor

from ..tokenizers.base import check_fits
from .config import DEFAULTS, GenerationConfig
from .core import generate_ids, left_pad, stream_ids
from .reply import until_eos
from .text import generate_text, generate_texts, stream_text, with_tokenizer

if TYPE_CHECKING:
    from ..nn.base import ZooModel
    from ..tokenizers import Tokenizer

__all__ = ["generate"]


def _own_tokenizer(model: ZooModel, tokenizer: Tokenizer | None) -> Tokenizer | None:
    """For ids in and ids out: the tokenizer given or the model's own (for its end-of-text
    id and vocabulary size), checked against the model's vocabulary; none is needed."""
    tok = tokenizer if tokenizer is not None else model.tokenizer
    if tok is not None:
        check_fits(tok, model.config.vocab_size)  # type: ignore[attr-defined]
    return tok


def _generate_tensor(
    model: ZooModel, prompt: Tensor, config: GenerationConfig, tokenizer: Tokenizer | None
) -> Tensor:
    ids = prompt[None] if prompt.ndim == 1 else prompt  # (T,) -> (1, T)
    config = with_tokenizer(config, _own_tokenizer(model, tokenizer), model)
    return generate_ids(model, ids, None, config)


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
    config = with_tokenizer(config, _own_tokenizer(model, tokenizer), model)
    ids, keep = left_pad(rows, torch.device("cpu"))
    new = torch.stack(list(stream_ids(model, ids, keep, config)), dim=1).tolist()  # (B, N)
    if model.is_encoder_decoder:
        assert config.start_id is not None  # stream_ids refuses an encoder-decoder without
        rows = [[config.start_id] for _ in rows]  # the target starts with the start token
    out = [row + until_eos(tokens, config.end_ids) for row, tokens in zip(rows, new, strict=True)]
    return out[0] if single else out


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
    max_new_tokens: int = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: str | Sequence[str] | None = ...,
    stream: Literal[False] = ...,
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
) -> str: ...
@overload
def generate(
    model: ZooModel,
    prompt_or_ids: str,
    *,
    tokenizer: Tokenizer | None = ...,
    max_new_tokens: int = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: str | Sequence[str] | None = ...,
    stream: Literal[True],
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
) -> Iterator[str]: ...
@overload
def generate(
    model: ZooModel,
    prompt_or_ids: list[str] | tuple[str, ...],
    *,
    tokenizer: Tokenizer | None = ...,
    max_new_tokens: int = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: str | Sequence[str] | None = ...,
    stream: Literal[False] = ...,
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
) -> list[str]: ...
@overload
def generate(
    model: ZooModel,
    prompt_or_ids: Tensor,
    *,
    tokenizer: Tokenizer | None = ...,
    max_new_tokens: int = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: None = ...,
    stream: Literal[False] = ...,
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
) -> Tensor: ...
@overload
def generate(
    model: ZooModel,
    prompt_or_ids: list[int],
    *,
    tokenizer: Tokenizer | None = ...,
    max_new_tokens: int = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: None = ...,
    stream: Literal[False] = ...,
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
) -> list[int]: ...
@overload
def generate(
    model: ZooModel,
    prompt_or_ids: list[list[int]],
    *,
    tokenizer: Tokenizer | None = ...,
    max_new_tokens: int = ...,
    temperature: float = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    seed: int | None = ...,
    stop: None = ...,
    stream: Literal[False] = ...,
    start_id: int | None = ...,
    compile: bool = ...,
    threads: int | Literal["auto"] | None = ...,
) -> list[list[int]]: ...
def generate(
    model: ZooModel,
    prompt_or_ids: Any,
    *,
    tokenizer: Tokenizer | None = None,
    max_new_tokens: int = DEFAULTS.max_new_tokens,
    temperature: float = DEFAULTS.temperature,
    top_k: int | None = DEFAULTS.top_k,
    top_p: float | None = DEFAULTS.top_p,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    stream: bool = False,
    start_id: int | None = None,
    compile: bool = False,
    threads: int | Literal["auto"] | None = None,
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

    A decoder's continuation is decoded together with its prompt and returned as the text
    that follows the prompt's, so word boundaries (the space WordPiece puts between words)
    are kept.

    Raises:
        ValueError: a bad argument, an empty prompt, text that is not Unicode (a lone
            surrogate), or a prompt too long for the context.
    """
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop=_stops(stop),
        start_id=start_id,
        compile=compile,
        threads=threads,
    )
    prompt = prompt_or_ids
    if stream and not isinstance(prompt, str):
        raise ValueError(
            "stream=True takes a single prompt, a string; for ids step by step use "
            "zoo.generation.stream_ids"
        )
    if isinstance(prompt, str):
        return (stream_text if stream else generate_text)(
            model, prompt, config, tokenizer=tokenizer
        )
    if isinstance(prompt, Sequence) and prompt and all(isinstance(p, str) for p in prompt):
        return generate_texts(model, prompt, config, tokenizer=tokenizer)
    if config.stop:
        raise ValueError(
            "stop strings cut text, and ids in give ids out: give text, or end rows with an "
            "end-of-text id (the tokenizer's eos_id, GenerationConfig.eos_id)"
        )
    if isinstance(prompt, Tensor):
        return _generate_tensor(model, prompt, config, tokenizer)
    return _generate_rows(model, prompt, config, tokenizer)
