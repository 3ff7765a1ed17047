"""GPT-2 config: GPT-2 small (124M) defaults."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation, DecoderConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPT2Config(DecoderConfig):
    """GPT-2; the defaults are GPT-2 small (``gpt2-124m``)."""

    architecture: ClassVar[str] = "gpt2"

    vocab_size: int = 50257
    context_length: int = 1024
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    d_ff: int = 3072
    dropout: float = 0.1
    norm_first: bool = True
    final_norm: bool = True
    activation: Activation = "gelu_tanh"
    positions: str = "learned"
    tie_embeddings: bool = True
