"""Opening a generation: the prompt checked, the thread policy chosen, the model's decoding
session opened and its prompt run (the first next-token logits). What the token-by-token
loop (:mod:`zoo.generation.core`) and beam search (:mod:`zoo.generation.beam`) both start
with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..devices import check_computes
from ..kernels.threads import DecodeThreads
from ..nn.base import check_padding_mask, check_token_ids
from ..runtime.decoding import check_cpp_compiler, start_decoding
from ..settings import Settings
from .config import GenerationConfig

if TYPE_CHECKING:
    from ..nn.base import ZooModel
    from ..runtime.session import DecodingSession

__all__ = ["check_runs", "checked_inputs", "open_session", "session_options", "thread_policy"]


def check_runs(model: ZooModel) -> torch.device:
    """The device of ``model``'s parameters, or a ``ConfigError`` (a ``ValueError``) when
    they hold no numbers (the meta device: shapes only) and so cannot pick a token."""
    device = next(model.parameters()).device
    check_computes(device, model, "generate", "zoo generate --device cpu")
    return device


def session_options(compile: bool) -> dict[str, Any]:
    """What is passed to :func:`zoo.runtime.start_decoding` beyond the prompt:
    ``cuda_graphs=False`` when ``ZOO_CUDA_GRAPHS=0`` (read here, where the call begins), and
    ``compile`` when asked for (a C++ compiler is checked for now, before any text is
    streamed; the session checks the rest)."""
    options: dict[str, Any] = {"cuda_graphs": Settings.from_env().cuda_graphs}
    if compile:
        check_cpp_compiler()
        options["compile"] = True
    return options


def checked_inputs(
    model: ZooModel, input_ids: Tensor, attention_mask: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """The prompt ids ``(B, T)`` as ``torch.long`` and its padding mask (``None`` without
    padding), both on the model's device; a ``ValueError`` for ids outside the vocabulary or
    the context, a row with no token, or a decoder's mask that pads on the right (a
    decoder appends to the end of each row; an encoder-decoder's source may be padded on
    either side)."""
    config: Any = model.config
    device = check_runs(model)
    ids = check_token_ids(
        input_ids,
        # an encoder-decoder's prompt is its source, whose vocabulary may be its own
        vocab_size=getattr(config, "source_vocab", config.vocab_size),
        context_length=config.context_length,
        name="prompt ids",
    )
    keep = check_padding_mask(attention_mask, tuple(ids.shape))
    if keep is not None and model.is_encoder_decoder:  # a source: padded on either side
        if not bool(keep.any(dim=1).all()):
            raise ValueError(
                "a source is empty (its attention_mask row is all padding); give at least "
                "one token per row"
            )
        keep = keep.to(device)
    elif keep is not None:
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


def open_session(
    model: ZooModel,
    ids: Tensor,
    keep: Tensor | None,
    config: GenerationConfig,
    threads: DecodeThreads,
) -> tuple[DecodingSession, Tensor]:
    """Open the model's decoding session and run its prefill: the session and the first
    next-token logits ``(B, vocab)``. Runs when generation is asked for (before a stream
    yields anything), so a model that cannot decode this prompt fails before any text."""
    options = session_options(config.compile)
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


def thread_policy(device: torch.device, config: GenerationConfig) -> DecodeThreads:
    """The steps' thread policy ``config.threads`` asks for: none by default (a library call
    leaves torch's process-wide count alone); ``"auto"`` or a count only when asked."""
    choice = config.threads
    setting = 0 if choice is None else None if choice == "auto" else choice
    return DecodeThreads.for_device(device, setting)
