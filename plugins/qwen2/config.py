"""The Qwen2 composition; sizes live with the named models (registry.toml)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ..llama.config import LlamaConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen2Config(LlamaConfig):
    """Llama's components, biased q/k/v projections, Qwen's rotary base and epsilon."""

    architecture: ClassVar[str] = "qwen2"

    qkv_bias: bool | None = True
    rope_theta: float = 1000000.0
    layer_norm_eps: float = 1e-6
    tie_embeddings: bool = True
