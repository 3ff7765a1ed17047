"""What the family tests compare zoo with transformers on: a batch with padding, and the
largest logit difference over its real tokens (transformers given positions that count real
tokens only, as zoo counts them)."""

from __future__ import annotations

from typing import Any

import torch


def padded_batch(vocab: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 24 ids: whole, left-padded by 9, right-padded by 7; and their mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (3, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0  # left padding
    mask[2, 17:] = 0  # right padding
    return ids, mask


def max_logit_diff(ours: Any, theirs: Any, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """``max |zoo - transformers|`` over the real tokens of ``ids`` under ``mask``."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = theirs(ids, attention_mask=mask, position_ids=positions).logits
        got = ours(ids, attention_mask=mask)
    real = mask.bool()
    return float((got[real] - want[real]).abs().max())
