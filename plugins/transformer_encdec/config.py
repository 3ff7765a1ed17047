"""Encoder-decoder config: the defaults are the Vaswani et al. (2017) base model."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import MAX_LAYERS, Activation, TransformerConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class EncoderDecoderConfig(TransformerConfig):
    """Encoder-decoder Transformer.

    Args:
        n_encoder_layers: encoder layers.
        n_decoder_layers: decoder layers.
        The other fields are those of :class:`zoo.config.TransformerConfig`; ``final_norm``
        adds a LayerNorm after each stack as ``torch.nn.Transformer`` does, and
        ``tie_embeddings`` makes the LM head share the (source and target) embedding.
        cross_attention: the decoder's cross-attention component (``mha``, or one a plugin
            supplies).
    """

    architecture: ClassVar[str] = "transformer-encdec"

    vocab_size: int = 37000
    context_length: int = 512
    d_model: int = 512
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    norm_first: bool = False
    final_norm: bool = True
    activation: Activation = "relu"
    positions: str = "sinusoidal"
    tie_embeddings: bool = True
    scale_embeddings: bool = True
    cross_attention: str = "mha"

    def validate(self) -> None:
        super().validate()
        self._require_positive("n_encoder_layers", "n_decoder_layers")
        self._require_at_most(MAX_LAYERS, "n_encoder_layers", "n_decoder_layers")
