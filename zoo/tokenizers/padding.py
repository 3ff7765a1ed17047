"""Padded tensor batches: lists of ids as ``input_ids`` and ``attention_mask`` tensors, cut to
a length where asked (:meth:`Tokenizer.encode_padded <zoo.tokenizers.Tokenizer.encode_padded>`).
torch is imported when a batch is made, not before."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from .errors import TokenizerError

if TYPE_CHECKING:
    import torch

__all__ = ["Padding", "PaddingSide", "check_padding", "fit", "padded"]

Padding = Literal["longest", "max_length"]
PaddingSide = Literal["right", "left"]


def check_padding(
    max_length: int | None, padding: Padding, truncation: bool, padding_side: PaddingSide
) -> None:
    """Refuse options :func:`fit` and :func:`padded` cannot follow."""
    if padding not in ("longest", "max_length"):
        raise TokenizerError(f"padding must be 'longest' or 'max_length', got {padding!r}")
    if padding_side not in ("right", "left"):
        raise TokenizerError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
        raise TokenizerError(f"max_length must be a positive int, got {max_length!r}")
    if (padding == "max_length" or truncation) and max_length is None:
        raise TokenizerError(
            f"{'padding=max_length' if padding == 'max_length' else 'truncation'} needs max_length"
        )


def fit(
    ids: list[int], row: int, max_length: int, truncation: bool, suffix: Sequence[int]
) -> list[int]:
    """``ids`` (text ``row`` of the batch) within ``max_length``: cut when ``truncation``
    allows (keeping the closing ``suffix`` tokens), an error otherwise."""
    if len(ids) <= max_length:
        return ids
    if not truncation:
        raise TokenizerError(
            f"text {row} has {len(ids)} tokens, more than max_length={max_length}; "
            "pass truncation=True to cut it, or a larger max_length"
        )
    if suffix and ids[-len(suffix) :] == list(suffix) and max_length > 1:
        return [*ids[: max_length - len(suffix)], *suffix]
    return ids[:max_length]


def padded(
    batch: Sequence[Sequence[int]],
    length: int,
    pad: int,
    padding_side: PaddingSide,
    device: str | torch.device | None,
) -> dict[str, torch.Tensor]:
    """``{"input_ids": LongTensor[batch, length], "attention_mask": LongTensor[batch,
    length]}``: each row's ids first (``"right"`` padding) or last (``"left"``), ``pad``
    around them; the mask is 1 on tokens and 0 on padding."""
    import torch

    input_ids = torch.full((len(batch), length), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), length), dtype=torch.long)
    for row, ids in enumerate(batch):
        n = len(ids)
        span = slice(0, n) if padding_side == "right" else slice(length - n, length)
        input_ids[row, span] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, span] = 1
    if device is not None:
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    return {"input_ids": input_ids, "attention_mask": attention_mask}
