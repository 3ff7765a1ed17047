"""Shared building blocks for zoo architectures.

Plugins compose these or bring their own modules.
"""

from .attention import MultiHeadAttention
from .base import (
    ZooModel,
    check_padding_mask,
    check_token_ids,
    embed_tokens,
    init_weights,
    random_ids,
    right_padding,
)
from .blocks import TransformerBlock
from .cache import KVCache, LayerCache
from .decoder import DecoderLM
from .feedforward import FeedForward, activation
from .linear import Linear, linear
from .masks import sdpa_mask
from .positions import LearnedPositions, SinusoidalPositions, make_positions
from .session import DecodingSession, RecomputeSession

__all__ = [
    "DecoderLM",
    "DecodingSession",
    "FeedForward",
    "KVCache",
    "LayerCache",
    "LearnedPositions",
    "Linear",
    "MultiHeadAttention",
    "RecomputeSession",
    "SinusoidalPositions",
    "TransformerBlock",
    "ZooModel",
    "activation",
    "check_padding_mask",
    "check_token_ids",
    "embed_tokens",
    "init_weights",
    "linear",
    "make_positions",
    "random_ids",
    "right_padding",
    "sdpa_mask",
]
