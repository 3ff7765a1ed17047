"""GPT-1 config: the defaults are the published model (116,534,784 parameters)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation, DecoderConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPT1Config(DecoderConfig):
    """GPT-1 (``openai-community/openai-gpt``)."""

    architecture: ClassVar[str] = "gpt1"

    vocab_size: int = 40478
    context_length: int = 512
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    d_ff: int = 3072
    dropout: float = 0.1
    norm_first: bool = False
    final_norm: bool = False
    activation: Activation = "gelu_tanh"  # the original code's tanh approximation
    positions: str = "learned"
    tie_embeddings: bool = True
