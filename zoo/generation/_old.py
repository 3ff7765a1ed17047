"""Text generation for every zoo model, through its decoding session.

Every :class:`zoo.nn.ZooModel` has ``start_decoding(ids, keep, max_new_tokens, *, start_id)``
returning a :class:`zoo.nn.DecodingSession` with ``prefix`` (what new ids are appended to),
``prefill()`` and ``step(tokens)`` (both return next-token logits ``(B, vocab)``). By default
it recomputes the whole sequence for each token; the built-in models return sessions with a
preallocated KV cache (:class:`zoo.nn.decoder.DecoderSession`, the encoder-decoder's).
``generate(..., compile=True)`` passes ``compile=True`` on to a ``start_decoding`` that takes
it (the built-in decoders: a compiled CPU step) and refuses a model whose does not.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .nn.base import check_padding_mask, check_token_ids
from .options import GENERATION_DEFAULTS, SEED_RANGE, GenerationDefaults
from .tokenizers.base import check_fits

if TYPE_CHECKING:
    from .nn.base import ZooModel
    from .tokenizers import Tokenizer

__all__ = [
    "DEFAULTS",
    "SEED_RANGE",
    "GenerationDefaults",
    "check_seed",
    "check_text",
    "filter_logits",
    "generate",
    "next_tokens",
]


#: The defaults :func:`generate` and ``zoo generate`` use (:mod:`zoo.options`).
DEFAULTS = GENERATION_DEFAULTS


# -- sampling ------------------------------------------------------------------------------
def filter_logits(
    logits: Tensor, *, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Set to ``-inf`` every logit outside the top-``k`` and outside the nucleus: the smallest
    set of most likely tokens whose probability reaches ``top_p``. ``(B, V) -> (B, V)``."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability mass ranked above each token
        drop_sorted = before >= top_p  # the most likely token always stays (before = 0)
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_tokens(
    logits: Tensor,
    *,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
) -> Tensor:
    """Pick the next token of each row, ``(B, V) -> (B,)``: argmax when ``temperature`` is 0,
    otherwise a sample from the filtered, tempered distribution. The logits are shifted so
    their maximum is 0 and the temperature is kept above float32's smallest normal number, so
    a tiny temperature sharpens towards greedy instead of producing ``nan``."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    shifted = logits - logits.max(dim=-1, keepdim=True).values  # (B, V), max 0
    tempered = shifted / max(temperature, torch.finfo(torch.float32).tiny)
    filtered = filter_logits(tempered, top_k=top_k, top_p=top_p)
    probs = filtered.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


# -- argument checks -------------------------------------------------------------------------
def check_text(text: str, what: str = "the prompt") -> None:
    """Raise ``ValueError`` when ``text`` is not Unicode: it holds a lone surrogate, which is
    how Python keeps bytes it could not decode (``errors="surrogateescape"``: a command-line
    argument or file name that is not UTF-8). Checked here, before any tokenizer sees it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} holds a lone surrogate {text[exc.start]!r} at index {exc.start}, which is "
            "not a Unicode character (undecodable bytes kept by errors='surrogateescape'); "
            "decode the source bytes as UTF-8, or with errors='replace'"
        ) from None


def check_seed(seed: Any) -> None:
    """Raise ``ValueError`` unless ``seed`` is ``None`` or an integer a ``torch.Generator``
    takes (:data:`SEED_RANGE`)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(
            f"seed must be an integer from 0 to 2**64 - 1 ({SEED_RANGE[1]}) (negative ones "
            f"down to -2**63 wrap around modulo 2**64), got {_short(seed)}"
        )


def _short(number: int) -> str:
    """``number`` in decimal, or its size when the decimal would be long (or beyond the
    digits Python's ``str`` converts)."""
    return (
        str(number) if number.bit_length() <= 256 else f"an integer of {number.bit_length()} bits"
    )


def _check_arguments(
    max_new_tokens: Any,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    seed: Any,
    stop: Any,
    start_id: Any,
) -> list[str]:
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 1
    ):
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise ValueError(
            f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}"
        )
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1
    ):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
    check_seed(seed)
    if start_id is not None and (isinstance(start_id, bool) or not isinstance(start_id, int)):
        raise ValueError(f"start_id must be an integer token id or None, got {start_id!r}")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"stop must be a non-empty string or a list of them, got {stop!r}")
    for i, s in enumerate(stops):
        check_text(s, f"stop string {i}")
    return stops


def _tokenizer_for(model: ZooModel, tokenizer: Tokenizer | None, why: str) -> Tokenizer:
    """The tokenizer to use: the one given, the model's own, or its named model's; it must fit
    the model's vocabulary."""
    if tokenizer is None:
        tokenizer = model.tokenizer
    if tokenizer is None and model.tokenizer_error is not None:
        raise ValueError(
            f"{why} needs a tokenizer, and this model was loaded without its tokenizer: "
            f"{model.tokenizer_error}. Pass tokenizer=..., or give ids instead of text"
        )
    if tokenizer is None and model.name:
        from .api import tokenizer as named_tokenizer

        tokenizer = named_tokenizer(model.name)
    if tokenizer is None:
        raise ValueError(f"{why} needs a tokenizer: pass tokenizer=... (the model has none)")
    check_fits(tokenizer, model.config.vocab_size)  # type: ignore[attr-defined]
    return tokenizer


def _ids_and_mask(rows: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor | None]:
    """Left-pad rows of different lengths: ids ``(B, T)`` and padding mask (or ``None``)."""
    if any(len(r) == 0 for r in rows):
        raise ValueError("a prompt is empty; give at least one token (e.g. the end-of-text id)")
    length = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    keep = torch.zeros(len(rows), length, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, length - len(row) :] = torch.tensor(row, dtype=torch.long)
        keep[i, length - len(row) :] = True
    return ids.to(device), (keep.to(device) if not bool(keep.all()) else None)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompt_rows(
    prompt: Any, tokenizer: Tokenizer | None, model: ZooModel
) -> tuple[list[list[int]], str]:
    """Token rows of the prompt(s) and the input kind: "text", "texts", "tensor" or "lists"."""
    if isinstance(prompt, str):
        check_text(prompt)
        tok = _tokenizer_for(model, tokenizer, "a text prompt")
        return [tok.encode(prompt)], "text"
    if isinstance(prompt, Tensor):
        ids = prompt[None] if prompt.ndim == 1 else prompt
        if ids.ndim != 2:
            raise ValueError(
                f"prompt ids must have shape (seq,) or (batch, seq), got {tuple(prompt.shape)}"
            )
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise ValueError(
                f"prompt ids must be an integer tensor (torch.long), got dtype {ids.dtype}"
            )
        return ids.tolist(), "tensor"
    if isinstance(prompt, Sequence) and prompt and all(isinstance(p, str) for p in prompt):
        for i, p in enumerate(prompt):
            check_text(p, f"prompt {i}")
        tok = _tokenizer_for(model, tokenizer, "a text prompt")
        return [tok.encode(p) for p in prompt], "texts"
    if isinstance(prompt, Sequence) and prompt and all(_is_id(p) for p in prompt):
        return [list(prompt)], "lists"
    if (
        isinstance(prompt, Sequence)
        and prompt
        and all(isinstance(p, Sequence) and all(_is_id(i) for i in p) for p in prompt)
    ):
        return [list(p) for p in prompt], "lists"
    raise ValueError(
        "prompt must be a string, a list of strings, a list of int ids, a list of id lists or "
        f"an integer tensor of ids; got {type(prompt).__name__} {str(prompt)[:60]!r}"
    )


# -- generation ------------------------------------------------------------------------------
def _check_runs(model: ZooModel) -> torch.device:
    """The device of ``model``'s parameters, or a ``ValueError`` when they hold no numbers
    (the meta device: shapes only) and so cannot pick a token."""
    device = next(model.parameters()).device
    if device.type == "meta" or any(p.is_meta for p in model.parameters()):
        raise ValueError(
            "the model is on the meta device (its parameters have shapes but no values), so "
            "it cannot generate; build or load it on 'cpu' or 'cuda' (zoo generate --device "
            "cpu)"
        )
    return device


def _start(
    model: ZooModel,
    rows: list[list[int]],
    *,
    max_new_tokens: int,
    start_id: int | None,
    options: dict[str, Any],
) -> tuple[Any, Tensor]:
    """Validate the prompt ids, open the model's decoding session and run its prefill: the
    session and the first next-token logits ``(B, vocab)``. Runs when :func:`generate` is
    called (before a stream yields anything), so a model that cannot decode this prompt
    fails before any text is shown."""
    config: Any = model.config
    device = _check_runs(model)
    ids, keep = _ids_and_mask(rows, device)
    ids = check_token_ids(
        ids, vocab_size=config.vocab_size, context_length=config.context_length, name="prompt ids"
    )
    check_padding_mask(keep, ids.shape)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            session = model.start_decoding(ids, keep, max_new_tokens, start_id=start_id, **options)
            logits = session.prefill()
    finally:
        model.train(was_training)
    return session, logits


def _decode_loop(
    model: ZooModel,
    session: Any,
    logits: Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    eos_id: int | None,
    sample_below: int | None,
) -> Iterator[Tensor]:
    """Yield the next token of every row, ``(B,)``, from the prefill's ``logits`` on, until
    every row has ended or ``max_new_tokens`` are out. A row that has ended repeats
    ``eos_id``. Ids at or above ``sample_below`` (model vocabulary slots the tokenizer has no
    token for) are never picked."""
    device = logits.device
    generator = None
    if seed is not None and temperature > 0:
        generator = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        # inference mode is entered per call, never across a yield: the caller's code between
        # two tokens (streaming) runs in its own mode
        done = torch.zeros(logits.shape[0], dtype=torch.bool, device=device)
        for i in range(max_new_tokens):
            with torch.inference_mode():
                if sample_below is not None and sample_below < logits.shape[-1]:
                    logits = logits.clone()
                    logits[:, sample_below:] = float("-inf")
                token = next_tokens(
                    logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
                )
                if eos_id is not None:
                    token = token.masked_fill(done, eos_id)
                    done |= token == eos_id
            yield token
            if i + 1 == max_new_tokens or (eos_id is not None and bool(done.all())):
                return
            with torch.inference_mode():
                logits = session.step(token)
    finally:
        model.train(was_training)


def _session_options(model: ZooModel, compile: bool) -> dict[str, Any]:
    """What :func:`generate` passes to ``model.start_decoding`` beyond the prompt: ``compile``
    only when asked for, and only to a model whose sessions take it; ``cuda_graphs=False``
    when ``ZOO_CUDA_GRAPHS=0`` to a model whose sessions take it."""
    from .settings import Settings

    takes = inspect.signature(model.start_decoding).parameters
    options: dict[str, Any] = {}
    if "cuda_graphs" in takes and not Settings.from_env().cuda_graphs:
        options["cuda_graphs"] = False
    if not compile:
        return options
    if "compile" not in takes:
        raise ValueError(
            f"{type(model).__name__} cannot compile its decoding step (its start_decoding "
            "takes no `compile`; the built-in decoders can); generate without compile=True"
        )
    from .nn.decoding import check_cpp_compiler

    check_cpp_compiler()  # now, before any text is streamed (the session checks the rest)
    return {**options, "compile": True}


def _cut(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string, and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


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
) -> Any:
    """Generate from a prompt, through the model's decoding session (a KV cache for the
    built-in models).

    Args:
        model: a zoo model (decoder-only or encoder-decoder).
        prompt_or_ids: a string or list of strings (returns the generated continuation as
            text), or ids: a list of ints, a list of id lists, or a ``(B, T)`` tensor (returns
            ids: each prompt followed by its new tokens). Prompts of different lengths are
            left-padded; each gives what it would alone. For an encoder-decoder the prompt is
            the source and the returned ids are the target (``start_id`` followed by the new
            tokens).
        tokenizer: defaults to ``model.tokenizer`` or the named model's tokenizer; needed for
            text, ``stop`` and ``stream``, and supplies the end-of-text id. Its ids must fit
            the model's vocabulary; ids of a larger (padded) model vocabulary are never
            sampled.
        max_new_tokens: tokens to generate at most; prompt + new tokens must fit the
            context. The defaults of this and the sampling arguments are
            :data:`zoo.options.GENERATION_DEFAULTS`, which ``zoo generate`` uses too.
        temperature: 0 for greedy; otherwise logits are divided by it before sampling (a
            finite number; a tiny one approaches greedy).
        top_k, top_p: sample only from the ``top_k`` most likely tokens / the nucleus of
            probability ``top_p`` (default: no filter).
        seed: makes sampling reproducible (an integer from 0 to 2**64 - 1).
        stop: stop strings; the text ends before the first one.
        stream: return an iterator of text pieces instead (a single text prompt).
        start_id: first target token of an encoder-decoder (default: the tokenizer's bos).
        compile: run each decoding step through ``torch.compile`` (CPU, decoders only). The
            first call compiles for a while (tens of seconds for gpt2-124m; torch caches the
            result on disk for later processes); later steps cost less Python and dispatch,
            which matters most for small models. Needs a C++ compiler; eager is the default.

    A decoder's continuation is decoded together with its prompt and returned as the text
    that follows the prompt's, so word boundaries (the space WordPiece puts between words)
    are kept.

    Raises:
        ValueError: a bad argument, an empty prompt, text that is not Unicode (a lone
            surrogate), or a prompt too long for the context.
    """
    stops = _check_arguments(max_new_tokens, temperature, top_k, top_p, seed, stop, start_id)
    rows, kind = _prompt_rows(prompt_or_ids, tokenizer, model)
    needs_text = kind in ("text", "texts") or stops or stream
    tok = (
        _tokenizer_for(model, tokenizer, "text output, stop or stream")
        if needs_text
        else (tokenizer or model.tokenizer)
    )
    if tok is not None and not needs_text:
        check_fits(tok, model.config.vocab_size)  # type: ignore[attr-defined]
    eos_id = tok.eos_id if tok is not None else None
    encoder_decoder = model.is_encoder_decoder
    if start_id is None and encoder_decoder:
        start_id = tok.bos_id if tok is not None else None
        if start_id is None:
            raise ValueError("an encoder-decoder needs start_id (or a tokenizer with a bos id)")
    if stream and len(rows) != 1:
        raise ValueError("stream=True takes a single prompt")
    session, logits = _start(
        model,
        rows,
        max_new_tokens=max_new_tokens,
        start_id=start_id,
        options=_session_options(model, compile),
    )
    loop = _decode_loop(
        model,
        session,
        logits,
        max_new_tokens=max_new_tokens,
        temperature=float(temperature),
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        eos_id=eos_id,
        sample_below=tok.vocab_size if tok is not None else None,
    )
    # a decoder's text is decoded after its prompt (an encoder-decoder's target stands alone)
    contexts = [[] if encoder_decoder else r for r in rows]
    if stream:
        assert tok is not None  # needs_text
        return _stream(loop, tok, stops, eos_id, contexts[0])
    new = torch.stack(list(loop), dim=1).tolist()  # (B, N)
    if kind in ("text", "texts"):
        assert tok is not None  # needs_text
        texts = [_text(tok, c, r, eos_id, stops) for c, r in zip(contexts, new, strict=True)]
        return texts[0] if kind == "text" else texts
    prefix: list[list[int]] = [[start_id] for _ in rows] if encoder_decoder else rows  # type: ignore[list-item]
    out = [p + _until_eos(r, eos_id) for p, r in zip(prefix, new, strict=True)]
    if kind == "tensor":
        width = max(len(r) for r in out)
        pad = eos_id if eos_id is not None else 0
        return torch.tensor(
            [r + [pad] * (width - len(r)) for r in out], device=prompt_or_ids.device
        )
    return out[0] if isinstance(prompt_or_ids[0], int) else out


def _until_eos(tokens: list[int], eos_id: int | None) -> list[int]:
    """New tokens up to and including the first end-of-text."""
    if eos_id is not None and eos_id in tokens:
        return tokens[: tokens.index(eos_id) + 1]
    return tokens


class _Continuation:
    """Decodes new tokens as the text that follows a prompt's: ``decode(prompt + new)`` minus
    the prompt's own text, so the tokenizer's rules for joining tokens apply across the
    boundary."""

    def __init__(self, tok: Tokenizer, context: list[int]) -> None:
        self.tok = tok
        self.context = context
        self.head = tok.decode(context) if context else ""

    def __call__(self, tokens: list[int]) -> str:
        if not self.context:
            return self.tok.decode(tokens)
        text = self.tok.decode(self.context + tokens)
        if text.startswith(self.head):
            return text[len(self.head) :]
        return self.tok.decode(tokens)  # the prompt's text changed (no common prefix)


def _text(
    tok: Tokenizer, context: list[int], tokens: list[int], eos_id: int | None, stops: list[str]
) -> str:
    tokens = _until_eos(tokens, eos_id)
    if eos_id is not None and tokens and tokens[-1] == eos_id:
        tokens = tokens[:-1]
    return _cut(_Continuation(tok, context)(tokens), stops)[0]


def _stream(
    loop: Iterator[Tensor], tok: Tokenizer, stops: list[str], eos_id: int | None, context: list[int]
) -> Iterator[str]:
    """Text pieces as tokens arrive. A piece is held back while it ends inside a multi-byte
    character or could be the start of a stop string."""
    continuation = _Continuation(tok, context)
    tokens: list[int] = []
    sent = 0
    hold = max((len(s) for s in stops), default=1) - 1
    for token in loop:
        t = int(token[0])
        if t == eos_id:
            break
        tokens.append(t)
        text, stopped = _cut(continuation(tokens), stops)
        if stopped:
            yield text[sent:]
            return
        if text.endswith("\ufffd"):  # a character split across tokens: wait for the rest
            continue
        ready = len(text) - hold
        if ready > sent:
            yield text[sent:ready]
            sent = ready
    text = _cut(continuation(tokens), stops)[0]
    if len(text) > sent:
        yield text[sent:]
