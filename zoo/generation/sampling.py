"""Picking the next token from logits: greedy, or a sample from the tempered distribution
filtered to the top-k and the nucleus (top-p)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["filter_logits", "next_tokens"]


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
