"""The Mistral composition; sizes live with the named models (registry.toml)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ..llama.config import LlamaConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class MistralConfig(LlamaConfig):
    """Llama's components with Mistral's rotary base; ``sliding_window`` from the model."""

    architecture: ClassVar[str] = "mistral"

    rope_theta: float = 1000000.0
