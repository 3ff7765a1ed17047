"""Mean cross-entropy for training, lighter on memory traffic than ``F.cross_entropy``.

``F.cross_entropy`` over a language model's logits ``(N, V)`` (``N`` tokens, a vocabulary of
``V``) writes three more ``(N, V)`` tensors: the log-softmax, the zero-filled gradient of the
negative log-likelihood and the log-softmax's gradient. On a CPU each is a fresh allocation
whose pages are faulted in and written: for a 50,257-id vocabulary at 1,024 tokens per step
that is a quarter of a small model's training step. :func:`cross_entropy` keeps only a
log-sum-exp per row (computed a few rows at a time) and turns the logits themselves into their
gradient during the backward pass (softmax minus the target's one-hot), so the step writes no
``(N, V)`` tensor beyond the logits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["cross_entropy"]

_ROWS = 32  # rows per log-sum-exp chunk: its temporaries stay in cache


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, ignore_index: int) -> Tensor:
        lse = torch.cat([torch.logsumexp(rows, dim=-1) for rows in logits.split(_ROWS)])  # (N,)
        valid = targets != ignore_index  # (N,)
        safe = targets.masked_fill(~valid, 0)
        picked = logits.gather(1, safe[:, None]).squeeze(1)  # (N,) the targets' logits
        count = valid.sum()
        ctx.save_for_backward(logits, lse, safe, valid, count)
        return ((lse - picked) * valid).sum() / count  # nan when nothing counts, as F's

    @staticmethod
    @once_differentiable  # the in-place gradient has no graph of its own
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        logits, lse, safe, valid, count = ctx.saved_tensors
        scale = (grad * valid / count)[:, None]  # (N, 1)
        out = logits  # the logits become their own gradient, in place
        out.sub_(lse[:, None]).exp_().mul_(scale)  # softmax, scaled
        out.scatter_add_(1, safe[:, None], -scale)  # minus the target's one-hot, scaled
        return out, None, None


def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
    """Mean cross-entropy of ``logits`` ``(N, V)`` against ``targets`` ``(N,)``, skipping
    ``ignore_index``: ``F.cross_entropy``'s value and gradient (to float rounding).

    The backward pass overwrites ``logits`` with their gradient: pass logits that nothing else
    reads afterwards (a model's output in a training step). Were they saved by another
    operation for its own backward, autograd reports the in-place change as an error.
    """
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"cross_entropy takes logits (N, V) and targets (N,); got {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}"
        )
    if logits.is_leaf:  # a tensor the caller owns: its values must survive
        logits = logits.clone()
    return _CrossEntropy.apply(logits.contiguous(), targets, ignore_index)
