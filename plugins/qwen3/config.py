"""The Qwen3 composition; sizes live with the named models (registry.toml)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ..qwen2.config import Qwen2Config


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen3Config(Qwen2Config):
    """Qwen2's components without q/k/v biases, with per-head q/k RMSNorm."""

    architecture: ClassVar[str] = "qwen3"

    qkv_bias: bool | None = None
    qk_norm: bool = True
