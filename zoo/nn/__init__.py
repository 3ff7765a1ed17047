"""Shared building blocks for zoo architectures.

Plugins compose these (most simply by naming components in a :class:`zoo.config.DecoderConfig`
and using :class:`DecoderLM`) or bring their own modules.
"""

from .._moved import moved_name
from .attention import MultiHeadAttention
from .base import (
    ZooModel,
    activation_dtype,
    check_padding_mask,
    check_position_ids,
    check_token_ids,
    embed_tokens,
    init_weights,
    random_ids,
    right_padding,
)
from .blocks import TransformerBlock
from .cache_types import KVCacheLike, LayerCacheLike
from .decoder import DecoderLM
from .feedforward import FeedForward, GatedFeedForward, activation
from .linear import Linear, OneDNNLinear, use_onednn
from .masks import causal_self_mask, positions_from_mask, sdpa_mask, self_attention_mask
from .norms import RMSNorm, UnitOffsetRMSNorm
from .parts import BUILTIN_COMPONENTS, ComponentFactory, Parts, make_positions, parts_for
from .positions import (
    LearnedPositions,
    NoPositions,
    PositionScheme,
    RotaryPositions,
    Rotation,
    SinusoidalPositions,
)

__all__ = [
    "BUILTIN_COMPONENTS",
    "ComponentFactory",
    "DecoderLM",
    "FeedForward",
    "GatedFeedForward",
    "KVCacheLike",
    "LayerCacheLike",
    "LearnedPositions",
    "Linear",
    "MultiHeadAttention",
    "NoPositions",
    "OneDNNLinear",
    "Parts",
    "PositionScheme",
    "RMSNorm",
    "RotaryPositions",
    "Rotation",
    "SinusoidalPositions",
    "TransformerBlock",
    "UnitOffsetRMSNorm",
    "ZooModel",
    "activation",
    "activation_dtype",
    "causal_self_mask",
    "check_padding_mask",
    "check_position_ids",
    "check_token_ids",
    "embed_tokens",
    "init_weights",
    "make_positions",
    "parts_for",
    "positions_from_mask",
    "random_ids",
    "right_padding",
    "sdpa_mask",
    "self_attention_mask",
    "use_onednn",
]


def __getattr__(name: str) -> object:
    """Names zoo.nn exported before the decoding state moved to :mod:`zoo.runtime`, with a
    warning (:data:`zoo._moved.MOVED_NAMES`)."""
    return moved_name(__name__, name)
