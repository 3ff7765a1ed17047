"""The Marian (OPUS-MT) composition; the defaults are ``Helsinki-NLP/opus-mt-en-de``'s sizes."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation

from ..transformer_encdec.config import EncoderDecoderConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class MarianConfig(EncoderDecoderConfig):
    """Vaswani et al.'s post-LN encoder-decoder as Marian trains it: no final norms, token
    embeddings scaled by ``sqrt(d_model)``, static sinusoidal positions laid out sines then
    cosines (``sinusoidal_halves``), SiLU ("swish"), a fixed logits bias."""

    architecture: ClassVar[str] = "marian"

    vocab_size: int = 58101
    context_length: int = 512
    d_model: int = 512
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    norm_first: bool = False
    final_norm: bool = False
    activation: Activation = "silu"
    positions: str = "sinusoidal_halves"
    scale_embeddings: bool = True
    logits_bias: bool = True
