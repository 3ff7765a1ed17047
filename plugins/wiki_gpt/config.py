"""wiki-gpt config: post-LN encoder layers under a causal mask, ReLU, sinusoidal positions,
an untied head with a bias. Sizes are the named models' (``registry.toml``)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation, DecoderConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class WikiGPTConfig(DecoderConfig):
    """wiki-gpt (the GPT of the wiki-gpt notebooks)."""

    architecture: ClassVar[str] = "wiki-gpt"

    dropout: float = 0.1
    norm_first: bool = False
    final_norm: bool = False
    activation: Activation = "relu"
    positions: str = "sinusoidal"
    tie_embeddings: bool = False
    head_bias: bool = True
