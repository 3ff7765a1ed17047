"""The BART composition; the defaults are ``facebook/bart-large``'s sizes."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation

from ..transformer_encdec.config import EncoderDecoderConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class BartConfig(EncoderDecoderConfig):
    """Post-LN encoder-decoder without final norms; a LayerNorm over each stack's embeddings,
    each stack's own learned positions read from row 2 on, GELU, a fixed logits bias."""

    architecture: ClassVar[str] = "bart"

    vocab_size: int = 50265
    decoder_start_id: int | None = 2  # BART's target starts with its end-of-text token
    context_length: int = 1024
    d_model: int = 1024
    n_heads: int = 16
    n_encoder_layers: int = 12
    n_decoder_layers: int = 12
    d_ff: int = 4096
    dropout: float = 0.1
    norm_first: bool = False
    final_norm: bool = False
    activation: Activation = "gelu"
    positions: str = "learned"
    separate_source_positions: bool = True
    position_offset: int = 2
    embedding_norm: bool = True
    scale_embeddings: bool = False
    logits_bias: bool = True
