"""Attention masks built from padding masks."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal_self_mask", "positions_from_mask", "sdpa_mask", "self_attention_mask"]


def sdpa_mask(keep: Tensor | None, *, causal: bool, q_len: int) -> Tensor | None:
    """Combine a key padding mask with the causal pattern into one SDPA mask.

    Args:
        keep: ``(B, S)`` boolean, ``True`` for real tokens, or ``None`` (no padding).
        causal: queries may only see keys at or before their own position.
        q_len: number of queries ``T`` (the last ``T`` of the ``S`` keys when causal).

    Returns:
        ``None`` when there is no padding (SDPA then applies ``is_causal`` itself, the fast
        path), else a boolean ``(B, 1, T, S)`` mask. Query rows that would see no key at all
        (padding queries in front of left padding) are let see every key, so they give finite
        values instead of NaN; their outputs are meaningless and must be ignored.
    """
    if keep is None:
        return None
    b, s = keep.shape
    mask = keep[:, None, None, :].expand(b, 1, q_len, s)  # (B, 1, T, S)
    if causal:
        tri = torch.ones(q_len, s, dtype=torch.bool, device=keep.device).tril(s - q_len)
        mask = mask & tri
    empty = ~mask.any(dim=-1, keepdim=True)  # (B, 1, T, 1)
    return mask | empty


def causal_self_mask(keep: Tensor | None, *, q_len: int, start: int) -> tuple[Tensor | None, bool]:
    """``(mask, is_causal)`` for ``q_len`` new queries after ``start`` cached positions.

    ``keep`` is the ``(B, start + q_len)`` padding mask of every key, or ``None``. Without
    padding, SDPA's own causal path is used where it applies (no cache, or one new query, which
    may see every cached key); otherwise an explicit mask offsets the causal pattern by
    ``start``.
    """
    if keep is None:
        if start == 0:
            return None, True
        if q_len == 1:
            return None, False
        raise ValueError("several new queries after cached ones need the padding mask `keep`")
    return sdpa_mask(keep, causal=True, q_len=q_len), False


def self_attention_mask(
    keep: Tensor | None,
    *,
    q_len: int,
    start: int,
    window: int | None = None,
    bias: Tensor | None = None,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[Tensor | None, bool]:
    """:func:`causal_self_mask` plus an optional sliding ``window`` (each query sees its
    ``window`` most recent keys) and an additive score ``bias`` ``(H, T, S)`` (from a position
    scheme). With a bias the mask is float ``(B, H, T, S)``: the bias where attention is
    allowed, ``-inf`` elsewhere."""
    if window is None and bias is None:
        return causal_self_mask(keep, q_len=q_len, start=start)
    s = start + q_len
    if keep is None:
        keep = torch.ones(1, s, dtype=torch.bool, device=device)
    allowed = sdpa_mask(keep, causal=True, q_len=q_len)  # (B, 1, T, S)
    assert allowed is not None
    if window is not None:
        queries = torch.arange(start, s, device=device)[:, None]  # (T, 1)
        keys = torch.arange(s, device=device)[None]  # (1, S)
        allowed = allowed & (queries - keys < window)  # the diagonal stays: no empty row
    if bias is None:
        return allowed, False
    blocked = torch.tensor(float("-inf"), dtype=dtype, device=device)
    return torch.where(allowed, bias.to(dtype), blocked), False  # (B, H, T, S)


def positions_from_mask(ids: Tensor, keep: Tensor | None) -> Tensor:
    """Position ids ``(B, T)``: 0..T-1, or counting real tokens only when there is padding."""
    if keep is None:
        return torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    return (keep.long().cumsum(dim=1) - 1).clamp(min=0)
