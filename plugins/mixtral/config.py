"""The Mixtral composition; sizes live with the named models (registry.toml)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ..mistral.config import MistralConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixtralConfig(MistralConfig):
    """Mistral's components with eight SwiGLU experts per block, two per token."""

    architecture: ClassVar[str] = "mixtral"

    n_experts: int | None = 8
