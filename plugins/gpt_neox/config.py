"""The GPT-NeoX composition; sizes live with the named models (registry.toml)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import DecoderConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPTNeoXConfig(DecoderConfig):
    """A :class:`~zoo.config.DecoderConfig` whose components default to GPT-NeoX's."""

    architecture: ClassVar[str] = "gpt-neox"

    positions: str = "rotary"
    parallel_residual: bool = True
    tie_embeddings: bool = False
