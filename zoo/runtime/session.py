"""The decoding contract :func:`zoo.generate` relies on, and the default way to meet it.

A model generates through a session returned by ``model.start_decoding(ids, keep,
max_new_tokens, start_id=...)``. Every :class:`~zoo.nn.ZooModel` has one: by default a
:class:`RecomputeSession`, which runs the model's own ``forward`` over the whole sequence for
each new token (correct for any decoder, no cache needed). A model makes decoding fast by
returning a cached session instead (:class:`zoo.nn.decoder.DecoderSession`, the
encoder-decoder's session); the conformance kit checks that the two give the same tokens.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["DecodingSession", "RecomputeSession", "context_overflow"]


def context_overflow(prompt_tokens: int, max_new_tokens: int, context_length: int) -> ValueError:
    """The error for a prompt of ``prompt_tokens`` whose ``max_new_tokens`` do not fit in
    ``context_length`` positions (every decoding path raises the same)."""
    return ValueError(
        f"the prompt ({prompt_tokens} tokens) plus max_new_tokens ({max_new_tokens}) "
        f"exceeds the context length {context_length}; shorten the prompt or lower "
        "max_new_tokens (zoo does not slide the window)"
    )


@runtime_checkable
class DecodingSession(Protocol):
    """Incremental decoding of a batch of prompts.

    Attributes:
        prefix: ``(B, P)`` ids that generated tokens are appended to: the prompt of a decoder,
            the start token of an encoder-decoder's target.
    """

    prefix: Tensor

    def prefill(self) -> Tensor:
        """Run the prompt; return the next-token logits ``(B, vocab)``."""
        ...

    def step(self, tokens: Tensor) -> Tensor:
        """Append ``tokens`` ``(B,)``; return the next-token logits ``(B, vocab)``."""
        ...


class RecomputeSession:
    """Decoding by recomputation: each step runs ``model(ids, attention_mask=keep)`` over the
    prompt plus everything generated so far and keeps the last position's logits.

    Args:
        model: a decoder whose ``forward(input_ids, attention_mask=None)`` returns logits
            ``(B, T, vocab)`` and whose config has ``context_length``.
        ids: ``(B, T)`` validated prompt ids, left-padded.
        keep: ``(B, T)`` padding mask (``True`` = token), or ``None`` without padding.
        max_new_tokens: tokens the session will be asked for at most.
    """

    def __init__(self, model: Any, ids: Tensor, keep: Tensor | None, max_new_tokens: int) -> None:
        context = model.config.context_length
        if ids.shape[1] + max_new_tokens > context:
            raise context_overflow(ids.shape[1], max_new_tokens, context)
        self.model = model
        self.prefix = ids
        self._ids = ids
        self._keep = keep

    def _last_logits(self) -> Tensor:
        return self.model(self._ids, attention_mask=self._keep)[:, -1]  # (B, vocab)

    def prefill(self) -> Tensor:
        """Run the prompt; return the next-token logits ``(B, vocab)``."""
        return self._last_logits()

    def step(self, tokens: Tensor) -> Tensor:
        """Append ``tokens`` ``(B,)``; return the next-token logits ``(B, vocab)``."""
        self._ids = torch.cat([self._ids, tokens[:, None]], dim=1)  # (B, T + 1)
        if self._keep is not None:
            new = torch.ones_like(self._keep[:, :1])  # (B, 1): generated tokens are real
            self._keep = torch.cat([self._keep, new], dim=1)
        return self._last_logits()

    def reorder(self, index: Tensor) -> None:
        """Make row ``i`` what row ``index[i]`` was (``(B,)`` row indices): beam search's
        reordering of its hypotheses. With no cache, the ids and their padding move."""
        self._ids = self._ids.index_select(0, index)
        if self._keep is not None:
            self._keep = self._keep.index_select(0, index)
        self.prefix = self.prefix.index_select(0, index)
