"""The Gemma 2 composition; sizes live with the named models (registry.toml)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation, DecoderConfig

#: Gemma 2's layers: sliding first, then full, alternating (transformers' default).
ALTERNATING = ("sliding_attention", "full_attention")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gemma2Config(DecoderConfig):
    """The shared decoder with Gemma 2's components: four norms per block (``sandwich``),
    ``(1 + w)`` RMSNorm, tanh-GELU GeGLU, rotary positions, scaled and tied embeddings, no
    biases, scores capped at 50 and logits at 30 (transformers' defaults); sizes, window,
    ``layer_types`` and ``attn_scale`` from the model."""

    architecture: ClassVar[str] = "gemma2"

    positions: str = "rotary"
    norm: str = "rmsnorm1p"
    ffn: str = "geglu"
    activation: Activation = "gelu_tanh"
    block: str = "sandwich"
    bias: bool = False
    scale_embeddings: bool = True
    layer_norm_eps: float = 1e-6
    attn_softcap: float | None = 50.0
    final_softcap: float | None = 30.0
