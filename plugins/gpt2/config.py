"""GPT-2 config: what makes a model GPT-2 (pre-LN, final norm, GELU-tanh, learned positions,
tied head). Sizes are the named models' (``registry.toml``), not defaults here."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation, DecoderConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPT2Config(DecoderConfig):
    """GPT-2 (``openai-community/gpt2``)."""

    architecture: ClassVar[str] = "gpt2"

    dropout: float = 0.1
    norm_first: bool = True
    final_norm: bool = True
    activation: Activation = "gelu_tanh"
    positions: str = "learned"
    tie_embeddings: bool = True
