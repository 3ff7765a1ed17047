"""Position schemes: how a decoder knows where each token is.

A scheme may act in any of three places, and the shared decoder calls each once per forward
pass:

- :meth:`PositionScheme.embed`: vectors added to the token embeddings (learned, sinusoidal);
- :meth:`PositionScheme.rotation`: a rotation applied to the queries and keys of every layer
  (rotary);
- :meth:`PositionScheme.score_bias`: an additive bias on the attention scores (ALiBi, say).

Schemes are components, registered by name (``positions = "rotary"`` in a config) through the
``zoo_components`` hook; the built-in ones are ``learned``, ``sinusoidal``, ``rotary`` and
``none``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

__all__ = [
    "LearnedPositions",
    "NoPositions",
    "PositionScheme",
    "RotaryPositions",
    "Rotation",
    "SinusoidalPositions",
]


class Rotation:
    """A rotary rotation of query/key heads, ``cos``/``sin`` of shape ``(B, 1, T, rot)``:
    the first ``rot`` features of each head turn (the rotate-half layout of transformers'
    Llama), the rest pass through (partial rotary)."""

    def __init__(self, cos: Tensor, sin: Tensor) -> None:
        self.cos = cos
        self.sin = sin

    def __call__(self, x: Tensor) -> Tensor:
        """``(B, H, T, head_dim) -> (B, H, T, head_dim)``."""
        rot = self.cos.shape[-1]
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        turned, kept = x[..., :rot], x[..., rot:]
        first, second = turned.chunk(2, dim=-1)  # 2 x (B, H, T, rot / 2)
        half_turned = torch.cat((-second, first), dim=-1)  # (B, H, T, rot)
        out = turned * cos + half_turned * sin
        return torch.cat((out, kept), dim=-1) if kept.shape[-1] else out


class PositionScheme(nn.Module):
    """Base class of position schemes; each method returns ``None`` where the scheme does
    not act. A scheme is built as ``factory(config)`` from the model's config.

    ``adds_score_bias`` declares whether :meth:`score_bias` may return a bias (decoding
    with a fixed-shape step, compiled or recorded as a CUDA graph, cannot follow one). A
    subclass that overrides :meth:`score_bias` declares ``True`` unless it says otherwise.
    """

    adds_score_bias: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "adds_score_bias" not in cls.__dict__ and "score_bias" in cls.__dict__:
            cls.adds_score_bias = True

    def embed(self, position_ids: Tensor) -> Tensor | None:
        """Vectors ``(B, T, d_model)`` added to the token embeddings of ``(B, T)`` positions."""
        return None

    def rotation(self, position_ids: Tensor) -> Rotation | None:
        """The rotation of the queries and keys of tokens at ``(B, T)`` positions."""
        return None

    def score_bias(self, q_len: int, k_len: int, device: torch.device) -> Tensor | None:
        """An additive bias ``(H, T, S)`` on attention scores of ``T = q_len`` queries, the
        last of ``S = k_len`` keys. Indices count padding; real tokens are contiguous (left
        padding in generation, right padding in a forward pass), so index differences between
        real tokens are position differences."""
        return None

    def forward(self, position_ids: Tensor) -> Tensor:
        vectors = self.embed(position_ids)
        if vectors is None:
            raise TypeError(f"{type(self).__name__} adds no vectors to token embeddings")
        return vectors


class LearnedPositions(PositionScheme):
    """Learned absolute positions: one trained vector per position (GPT-1, GPT-2).

    Shape:
        ``(B, T)`` int64 position ids -> ``(B, T, d_model)``.
    """

    def __init__(self, context_length: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(context_length, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, 0.02) vectors."""
        nn.init.normal_(self.weight, std=0.02)

    def embed(self, position_ids: Tensor) -> Tensor:
        return nn.functional.embedding(position_ids, self.weight)


class SinusoidalPositions(PositionScheme):
    """Fixed sinusoidal positions of Vaswani et al. (2017), section 3.5.

    ``PE[pos, 2i] = sin(pos / 10000^(2i / d))`` and ``PE[pos, 2i + 1] = cos(pos / 10000^(2i / d))``.
    Computed in float32 from the ids on the ids' own device: no parameters, no buffers, so it
    is correct on any device, including after a ``meta`` build.

    Shape:
        ``(B, T)`` int64 position ids -> ``(B, T, d_model)`` float32.
    """

    def __init__(self, context_length: int, d_model: int) -> None:
        super().__init__()
        self.context_length = context_length
        self.d_model = d_model

    def embed(self, position_ids: Tensor) -> Tensor:
        half = (self.d_model + 1) // 2
        exponent = torch.arange(half, device=position_ids.device, dtype=torch.float32) * 2
        inv_freq = torch.exp(exponent * (-math.log(10000.0) / self.d_model))  # (half,)
        angles = position_ids.to(torch.float32)[..., None] * inv_freq  # (B, T, half)
        pe = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (B, T, half, 2)
        return pe.flatten(-2)[..., : self.d_model]  # (B, T, d_model), sin/cos interleaved


class RotaryPositions(PositionScheme):
    """Rotary positions (RoPE, Su et al. 2021) in the rotate-half layout of transformers'
    Llama: the first ``rotary_dim`` features of each query and key head turn by angles
    ``position / rope_theta^(2i / rotary_dim)``. Computed in float32 from the ids on their own
    device (no buffers: correct after a ``meta`` build).

    Args:
        head_dim: features per head.
        rotary_dim: features that turn (even, at most ``head_dim``; less is partial rotary).
        theta: the base ``rope_theta``.
    """

    def __init__(self, head_dim: int, rotary_dim: int, theta: float) -> None:
        super().__init__()
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ValueError(
                f"rotary_dim={rotary_dim} must be even and in (0, head_dim={head_dim}]"
            )
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.theta = theta

    def rotation(self, position_ids: Tensor) -> Rotation:
        steps = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64, device=position_ids.device)
        inv_freq = 1.0 / (self.theta ** (steps.float() / self.rotary_dim))  # (rot / 2,)
        angles = position_ids.float()[..., None] * inv_freq  # (B, T, rot / 2)
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # (B, 1, T, rot)
        return Rotation(angles.cos(), angles.sin())

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, theta={self.theta}"


class NoPositions(PositionScheme):
    """No position information at all (causal attention alone orders the tokens)."""


# -- component factories: factory(config) -> scheme ------------------------------------------
def learned(config: Any) -> LearnedPositions:
    """``positions = "learned"``: one trained vector per position."""
    return LearnedPositions(config.context_length, config.d_model)


def sinusoidal(config: Any) -> SinusoidalPositions:
    """``positions = "sinusoidal"``: Vaswani et al.'s fixed vectors."""
    return SinusoidalPositions(config.context_length, config.d_model)


def rotary(config: Any) -> RotaryPositions:
    """``positions = "rotary"``: RoPE with ``rope_theta``, turning the first ``rotary_dim``
    features of each head (all of them when ``None``)."""
    head_dim = config.head_size
    rotary_dim = getattr(config, "rotary_dim", None)
    turned = head_dim if rotary_dim is None else rotary_dim
    return RotaryPositions(head_dim, turned, config.rope_theta)


def none(config: Any) -> NoPositions:
    """``positions = "none"``."""
    return NoPositions()
