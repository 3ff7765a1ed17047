"""T5's relative position bias (Raffel et al., 2020), supplied as the ``positions`` component
``t5_relative``: a learned bias per head and bucket of the distance from query to key, added
to the attention scores (which T5 does not scale). Distances under half the buckets are
exact, longer ones share logarithmically wider buckets up to ``max_distance``. The encoder's
buckets tell keys before the query from keys after it (``bidirectional_score_bias``), the
decoder's only look back (``score_bias``): each stack has its own table
(``separate_source_positions``), as each T5 stack's first layer holds one and shares it with
the others."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from zoo.nn.positions import PositionScheme

__all__ = ["RelativePositionBias", "relative_buckets", "t5_relative"]


def relative_buckets(
    relative: Tensor, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """The bucket of each ``key - query`` distance in ``relative``, as transformers'
    ``T5Attention._relative_position_bucket`` computes it (the same operations in the same
    order: the logarithm in float32, truncated)."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).to(torch.long) * num_buckets
        relative = torch.abs(relative)
    else:
        relative = -torch.min(relative, torch.zeros_like(relative))
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    large = max_exact + (
        torch.log(relative.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative, large)


class RelativePositionBias(PositionScheme):
    """A learned score bias per head and relative-distance bucket: ``weight`` is
    ``(num_buckets, n_heads)`` (transformers' ``relative_attention_bias``).

    Shape:
        both methods -> ``(n_heads, q_len, k_len)``, the queries the last ``q_len`` of the
        ``k_len`` positions.
    """

    adds_score_bias = True

    def __init__(self, n_heads: int, num_buckets: int, max_distance: int) -> None:
        super().__init__()
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.weight = nn.Parameter(torch.empty(num_buckets, n_heads))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, 0.02) biases."""
        nn.init.normal_(self.weight, std=0.02)

    def _bias(self, q_len: int, k_len: int, device: torch.device, bidirectional: bool) -> Tensor:
        queries = torch.arange(k_len - q_len, k_len, dtype=torch.long, device=device)[:, None]
        keys = torch.arange(k_len, dtype=torch.long, device=device)[None]
        buckets = relative_buckets(
            keys - queries,
            bidirectional=bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )  # (T, S)
        return nn.functional.embedding(buckets, self.weight).permute(2, 0, 1)  # (H, T, S)

    def score_bias(self, q_len: int, k_len: int, device: torch.device) -> Tensor:
        """The decoder's bias: buckets of the distance back from each query."""
        return self._bias(q_len, k_len, device, bidirectional=False)

    def bidirectional_score_bias(self, q_len: int, k_len: int, device: torch.device) -> Tensor:
        """The encoder's bias: buckets of keys before and after each query apart."""
        return self._bias(q_len, k_len, device, bidirectional=True)

    def extra_repr(self) -> str:
        heads = self.weight.shape[1]
        return f"heads={heads}, buckets={self.num_buckets}, max_distance={self.max_distance}"


def t5_relative(config: Any) -> RelativePositionBias:
    """``positions = "t5_relative"``: T5's relative bias, ``relative_attention_num_buckets``
    buckets up to ``relative_attention_max_distance`` (32 and 128 where the config has no
    such fields)."""
    return RelativePositionBias(
        config.n_heads,
        getattr(config, "relative_attention_num_buckets", 32),
        getattr(config, "relative_attention_max_distance", 128),
    )
