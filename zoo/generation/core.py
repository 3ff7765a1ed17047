"""The core of generation: ids in, ids out, as tensors.

:func:`generate_ids` takes a left-padded ``(B, T)`` batch of prompt ids and its padding mask
and returns ``(B, P + N)``: what the model's decoding session appends to (the prompt of a
decoder, the start token of an encoder-decoder's target) followed by the ``N`` new tokens.
:func:`stream_ids` yields the new tokens ``(B,)`` one step at a time. Everything else
(text, lists of ids, streaming text) is a wrapper over these two.

Every model decodes through a :class:`zoo.runtime.DecodingSession` with ``prefix``,
``prefill()`` and ``step(tokens)`` (both return next-token logits ``(B, vocab)``), which
:func:`zoo.runtime.start_decoding` opens: the model's own where it brings one, a preallocated
KV cache for a :class:`zoo.nn.DecoderLM`, else recomputation of the whole sequence per token.
``GenerationConfig(compile=True)`` asks for a compiled CPU step, which a session that cannot
compile refuses.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..devices import check_computes
from ..kernels.threads import DecodeThreads
from ..nn.base import check_padding_mask, check_token_ids
from ..runtime.decoding import check_cpp_compiler, start_decoding
from ..settings import Settings
from .config import GenerationConfig
from .sampling import pick, seeded_generator

if TYPE_CHECKING:
    from ..nn.base import ZooModel
    from ..runtime.session import DecodingSession

__all__ = ["generate_ids", "left_pad", "stream_ids"]


def left_pad(rows: Sequence[Sequence[int]], device: torch.device) -> tuple[Tensor, Tensor | None]:
    """Left-pad rows of ids of different lengths: ids ``(B, T)`` and the padding mask
    ``(B, T)`` (``True`` = token), or ``None`` when no row is padded."""
    if any(len(r) == 0 for r in rows):
        raise ValueError("a prompt is empty; give at least one token (e.g. the end-of-text id)")
    length = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    keep = torch.zeros(len(rows), length, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, length - len(row) :] = torch.tensor(row, dtype=torch.long)
        keep[i, length - len(row) :] = True
    return ids.to(device), (keep.to(device) if not bool(keep.all()) else None)


def _check_runs(model: ZooModel) -> torch.device:
    """The device of ``model``'s parameters, or a ``ConfigError`` (a ``ValueError``) when
    they hold no numbers (the meta device: shapes only) and so cannot pick a token."""
    device = next(model.parameters()).device
    check_computes(device, model, "generate", "zoo generate --device cpu")
    return device


def _session_options(compile: bool) -> dict[str, Any]:
    """What is passed to :func:`zoo.runtime.start_decoding` beyond the prompt:
    ``cuda_graphs=False`` when ``ZOO_CUDA_GRAPHS=0`` (read here, where the call begins), and
    ``compile`` when asked for (a C++ compiler is checked for now, before any text is
    streamed; the session checks the rest)."""
    options: dict[str, Any] = {"cuda_graphs": Settings.from_env().cuda_graphs}
    if compile:
        check_cpp_compiler()
        options["compile"] = True
    return options


def _checked_inputs(
    model: ZooModel, input_ids: Tensor, attention_mask: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """The prompt ids ``(B, T)`` as ``torch.long`` and its padding mask (``None`` without
    padding), both on the model's device; a ``ValueError`` for ids outside the vocabulary or
    the context, a mask that pads on the right, or a row with no token."""
    config: Any = model.config
    device = _check_runs(model)
    ids = check_token_ids(
        input_ids,
        vocab_size=config.vocab_size,
        context_length=config.context_length,
        name="prompt ids",
    )
    keep = check_padding_mask(attention_mask, tuple(ids.shape))
    if keep is not None:
        if not bool(keep[:, -1].all()):
            raise ValueError(
                "a prompt is empty (its attention_mask row ends in padding); give at least "
                "one token per row, and pad on the left"
            )
        if bool((keep[:, 1:] < keep[:, :-1]).any()):  # (B, T - 1): a token before padding
            raise ValueError(
                "attention_mask has padding after a token; generation appends to the end of "
                "each row, so pad on the left only (0s before 1s: "
                "Tokenizer.encode_padded(..., padding_side='left'))"
            )
        keep = keep.to(device)
    return ids.to(device), keep


def _start(
    model: ZooModel,
    ids: Tensor,
    keep: Tensor | None,
    config: GenerationConfig,
    threads: DecodeThreads,
) -> tuple[DecodingSession, Tensor]:
    """Open the model's decoding session and run its prefill: the session and the first
    next-token logits ``(B, vocab)``. Runs when generation is asked for (before a stream
    yields anything), so a model that cannot decode this prompt fails before any text."""
    options = _session_options(config.compile)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            session = start_decoding(
                model, ids, keep, config.max_new_tokens, start_id=config.start_id, **options
            )
            with threads.step():
                logits = session.prefill()
    finally:
        model.train(was_training)
    return session, logits


def _decode_loop(
    model: ZooModel,
    session: DecodingSession,
    logits: Tensor,
    config: GenerationConfig,
    threads: DecodeThreads,
) -> Iterator[Tensor]:
    """Yield the next token of every row, ``(B,)``, from the prefill's ``logits`` on, until
    every row has ended (picked one of ``config.end_ids``: ``eos_id`` and ``stop_ids``) or
    ``max_new_tokens`` are out. A row that has ended repeats the first end id. Each step
    runs with the thread count ``threads`` chooses."""
    device, ends = logits.device, config.end_ids
    end_ids = torch.tensor(ends, dtype=torch.long, device=device) if ends else None
    generator = seeded_generator(config, device)
    was_training = model.training
    model.eval()
    try:
        # inference mode is entered per call, never across a yield: the caller's code between
        # two tokens (streaming) runs in its own mode
        done = torch.zeros(logits.shape[0], dtype=torch.bool, device=device)
        for i in range(config.max_new_tokens):
            with torch.inference_mode():
                token = pick(logits, config, generator)
                if end_ids is not None:
                    token = token.masked_fill(done, ends[0])
                    done |= torch.isin(token, end_ids)
            yield token
            if i + 1 == config.max_new_tokens or (end_ids is not None and bool(done.all())):
                return
            with torch.inference_mode(), threads.step():
                logits = session.step(token)
    finally:
        model.train(was_training)


def _thread_policy(device: torch.device, config: GenerationConfig) -> DecodeThreads:
    """The steps' thread policy ``config.threads`` asks for: none by default (a library call
    leaves torch's process-wide count alone); ``"auto"`` or a count only when asked."""
    choice = config.threads
    setting = 0 if choice is None else None if choice == "auto" else choice
    return DecodeThreads.for_device(device, setting)


def _open(
    model: ZooModel,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    config: GenerationConfig | None,
) -> tuple[DecodingSession, Iterator[Tensor]]:
    config = config if config is not None else GenerationConfig()
    if model.is_encoder_decoder and config.start_id is None:
        raise ValueError("an encoder-decoder needs start_id (or a tokenizer with a bos id)")
    ids, keep = _checked_inputs(model, input_ids, attention_mask)
    threads = _thread_policy(ids.device, config)
    session, logits = _start(model, ids, keep, config, threads)
    return session, _decode_loop(model, session, logits, config, threads)


def stream_ids(
    model: ZooModel,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    config: GenerationConfig | None = None,
) -> Iterator[Tensor]:
    """The new tokens of every row, one step at a time.

    The prompt is checked and the session prefilled when this is called (a model that
    cannot decode it fails before the first token); the iterator then yields ``(B,)`` token
    ids on the model's device until every row has picked one of ``config.end_ids``
    (``eos_id``, ``stop_ids``) or ``config.max_new_tokens`` are out. A row that has ended
    repeats the first end id.

    Args:
        model: a zoo model (decoder-only or encoder-decoder: then ``config.start_id`` is
            needed).
        input_ids: ``(B, T)`` integer prompt ids, left-padded when rows differ in length.
        attention_mask: ``(B, T)`` padding mask, 1/``True`` for tokens, 0 for padding on
            the left; ``None`` without padding.
        config: the settings (default: :class:`GenerationConfig`'s defaults).
    """
    return _open(model, input_ids, attention_mask, config)[1]


def generate_ids(
    model: ZooModel,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    config: GenerationConfig | None = None,
) -> Tensor:
    """Generate from a batch of prompt ids: the core every other form wraps.

    Args: as :func:`stream_ids`.

    Returns:
        ``(B, P + N)`` ids on ``input_ids``' device: the session's prefix (a decoder's
        prompt as given, padding included; an encoder-decoder's start token) followed by the
        ``N`` new tokens. A row that ended early is filled with ``config.eos_id`` (the first
        of ``config.end_ids``).

    Shape:
        ``input_ids``, ``attention_mask``: ``(B, T)``; returned: ``(B, T + N)`` for a decoder,
        ``(B, 1 + N)`` for an encoder-decoder, ``N <= config.max_new_tokens``.
    """
    session, tokens = _open(model, input_ids, attention_mask, config)
    new = torch.stack(list(tokens), dim=1)  # (B, N)
    out = torch.cat([session.prefix.to(new.device), new], dim=1)  # (B, P + N)
    return out.to(input_ids.device)
