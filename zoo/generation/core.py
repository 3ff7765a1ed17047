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
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .beam import beam_search
from .config import GenerationConfig
from .constraints import Constraints
from .opening import checked_inputs, open_session, thread_policy
from .opening import session_options as _session_options  # noqa: F401  (zoo.generation's)
from .sampling import pick, seeded_generator

if TYPE_CHECKING:
    from ..kernels.threads import DecodeThreads
    from ..nn.base import ZooModel
    from ..runtime.session import DecodingSession

__all__ = ["generate_ids", "left_pad", "new_tokens", "stream_ids"]


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


def _decode_loop(
    model: ZooModel,
    session: DecodingSession,
    logits: Tensor,
    config: GenerationConfig,
    threads: DecodeThreads,
    rules: Constraints | None,
) -> Iterator[Tensor]:
    """Yield the next token of every row, ``(B,)``, from the prefill's ``logits`` on, until
    every row has ended (picked one of ``config.end_ids``: ``eos_id`` and ``stop_ids``) or
    ``max_new_tokens`` are out. A row that has ended repeats the first end id. Each step
    runs with the thread count ``threads`` chooses, each pick under the constraints
    ``rules`` when there are some."""
    device, ends = logits.device, config.end_ids
    end_ids = torch.tensor(ends, dtype=torch.long, device=device) if ends else None
    generator = seeded_generator(config, device)
    ids = session.prefix  # (B, P + i): what the constraints read (kept only when some apply)
    was_training = model.training
    model.eval()
    try:
        # inference mode is entered per call, never across a yield: the caller's code between
        # two tokens (streaming) runs in its own mode
        done = torch.zeros(logits.shape[0], dtype=torch.bool, device=device)
        for i in range(config.max_new_tokens):
            with torch.inference_mode():
                if rules is not None:
                    logits = rules(ids, logits)
                token = pick(logits, config, generator)
                if end_ids is not None:
                    token = token.masked_fill(done, ends[0])
                    done |= torch.isin(token, end_ids)
                if rules is not None:
                    ids = torch.cat([ids, token[:, None].to(ids.device)], dim=1)
            yield token
            if i + 1 == config.max_new_tokens or (end_ids is not None and bool(done.all())):
                return
            with torch.inference_mode(), threads.step():
                logits = session.step(token)
    finally:
        model.train(was_training)


def _open(
    model: ZooModel,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    config: GenerationConfig | None,
) -> tuple[DecodingSession, Iterator[Tensor]]:
    config = config if config is not None else GenerationConfig()
    if config.num_beams > 1:
        raise ValueError(
            f"beam search (num_beams={config.num_beams}) knows its best hypotheses only when "
            "it ends, so it does not stream: call generate_ids (or zoo.generate without "
            "stream=True), or stream with num_beams=1"
        )
    if model.is_encoder_decoder and config.start_id is None:
        raise ValueError("an encoder-decoder needs start_id (or a tokenizer with a bos id)")
    ids, keep = checked_inputs(model, input_ids, attention_mask)
    threads = thread_policy(ids.device, config)
    session, logits = open_session(model, ids, keep, config, threads)
    prefix, vocab_size = session.prefix.shape[1], logits.shape[-1]
    rules = Constraints.of(config, prefix, config.max_new_tokens, vocab_size, logits.device)
    return session, _decode_loop(model, session, logits, config, threads, rules)


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
        of ``config.end_ids``). With ``config.num_beams > 1`` a beam search
        (:func:`zoo.generation.beam.beam_search`) gives ``(B * num_return_sequences, P + N)``:
        each prompt's best hypotheses in turn, best first.

    Shape:
        ``input_ids``, ``attention_mask``: ``(B, T)``; returned: ``(B, T + N)`` for a decoder,
        ``(B, 1 + N)`` for an encoder-decoder, ``N <= config.max_new_tokens``.
    """
    if config is not None and config.num_beams > 1:
        return beam_search(model, input_ids, attention_mask, config)
    session, tokens = _open(model, input_ids, attention_mask, config)
    new = torch.stack(list(tokens), dim=1)  # (B, N)
    out = torch.cat([session.prefix.to(new.device), new], dim=1)  # (B, P + N)
    return out.to(input_ids.device)


def new_tokens(
    model: ZooModel,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    config: GenerationConfig,
) -> Tensor:
    """Only the new tokens of :func:`generate_ids`: ``(B * num_return_sequences, N)`` on the
    model's device (a beam search's hypotheses in :func:`generate_ids`' order)."""
    if config.num_beams > 1:
        prefix = 1 if model.is_encoder_decoder else input_ids.shape[1]
        return beam_search(model, input_ids, attention_mask, config)[:, prefix:]
    return torch.stack(list(stream_ids(model, input_ids, attention_mask, config)), dim=1)
