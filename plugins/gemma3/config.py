"""The Gemma 3 composition; sizes live with the named models (registry.toml)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import LayerType

from ..gemma2.config import Gemma2Config


def every_sixth_global(n_layers: int, pattern: int = 6) -> tuple[LayerType, ...]:
    """``layer_types`` of ``n_layers`` layers where every ``pattern``-th is global and the
    others slide (transformers' reading of Gemma 3's ``sliding_window_pattern``)."""
    return tuple(
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gemma3Config(Gemma2Config):
    """Gemma 2's components (four ``(1 + w)`` RMSNorms per block, tanh-GELU GeGLU, rotary
    positions, scaled and tied embeddings, no biases) without its caps, with per-head q/k
    norms, a rotary base per kind of layer (1e6 global, 1e4 sliding) and scores scaled by
    ``query_pre_attn_scalar ** -0.5`` (transformers' default 256: ``attn_scale = 1/16``)."""

    architecture: ClassVar[str] = "gemma3"

    qk_norm: bool = True
    attn_softcap: float | None = None
    final_softcap: float | None = None
    rope_theta: float = 1_000_000.0
    rope_local_theta: float | None = 10_000.0
    attn_scale: float | None = 256**-0.5
