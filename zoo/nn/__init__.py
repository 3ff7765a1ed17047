"""Shared building blocks for zoo architectures.

Plugins compose these (most simply by naming components in a :class:`zoo.config.DecoderConfig`
and using :class:`DecoderLM`) or bring their own modules.
"""

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
from .cache import KVCache, LayerCache
from .decoder import DecoderLM
from .decoding import DecoderSession, StaticDecoderSession, start_session
from .feedforward import FeedForward, GatedFeedForward, activation
from .linear import Linear
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
from .session import DecodingSession, RecomputeSession

__all__ = [
    "BUILTIN_COMPONENTS",
    "ComponentFactory",
    "DecoderLM",
    "DecoderSession",
    "DecodingSession",
    "FeedForward",
    "GatedFeedForward",
    "KVCache",
    "LayerCache",
    "LearnedPositions",
    "Linear",
    "MultiHeadAttention",
    "NoPositions",
    "Parts",
    "PositionScheme",
    "RMSNorm",
    "RecomputeSession",
    "RotaryPositions",
    "Rotation",
    "SinusoidalPositions",
    "StaticDecoderSession",
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
    "start_session",
]
