"""GPT-1 config: what makes a model GPT-1 (post-LN, no final norm, GELU-tanh, learned
positions, tied head). Sizes are the named models' (``registry.toml``), not defaults here."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation, DecoderConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPT1Config(DecoderConfig):
    """GPT-1 (``openai-community/openai-gpt``)."""

    architecture: ClassVar[str] = "gpt1"

    dropout: float = 0.1
    norm_first: bool = False
    final_norm: bool = False
    activation: Activation = "gelu_tanh"  # the original code's tanh approximation
    positions: str = "learned"
    tie_embeddings: bool = True
