"""The Phi-3 composition; sizes live with the named models (registry.toml)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ..llama.config import LlamaConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class Phi3Config(LlamaConfig):
    """Llama's components (RMSNorm, SwiGLU, rotary); ``sliding_window`` and ``rotary_dim``
    from the model."""

    architecture: ClassVar[str] = "phi3"
