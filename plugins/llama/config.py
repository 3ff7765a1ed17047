"""The Llama composition; sizes live with the named models (registry.toml)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import DecoderConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig(DecoderConfig):
    """A :class:`~zoo.config.DecoderConfig` whose components default to Llama's."""

    architecture: ClassVar[str] = "llama"

    positions: str = "rotary"
    norm: str = "rmsnorm"
    ffn: str = "swiglu"
    bias: bool = False
    tie_embeddings: bool = False
