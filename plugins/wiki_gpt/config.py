"""wiki-gpt config: d=512, 8 heads, 4 layers, FFN 1024 (the sizes registry.toml gives)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation, DecoderConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class WikiGPTConfig(DecoderConfig):
    """wiki-gpt; defaults are ``wiki-gpt-wordpiece`` (BERT uncased WordPiece, 30522 ids)."""

    architecture: ClassVar[str] = "wiki-gpt"

    vocab_size: int = 30522
    context_length: int = 512
    d_model: int = 512
    n_heads: int = 8
    n_layers: int = 4
    d_ff: int = 1024
    dropout: float = 0.1
    norm_first: bool = False
    final_norm: bool = False
    activation: Activation = "relu"
    positions: str = "sinusoidal"
    tie_embeddings: bool = False
    head_bias: bool = True
