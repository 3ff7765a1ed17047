"""The T5 composition; the defaults are ``google-t5/t5-small``'s sizes (v1.0: ReLU, a tied
head whose input is scaled)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation

from ..transformer_encdec.config import EncoderDecoderConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class T5Config(EncoderDecoderConfig):
    """Pre-norm encoder-decoder with RMS norms (no mean, no bias), no biases anywhere, scores
    not scaled, each stack's own relative position bias, no embedding scale, final norms; the
    tied head's input scaled by ``d_model ** -0.5`` (``scale_decoder_output``).

    Args:
        relative_attention_num_buckets: buckets of the relative position bias.
        relative_attention_max_distance: distances at or past it share the last bucket.
    """

    architecture: ClassVar[str] = "t5"

    vocab_size: int = 32128
    context_length: int = 512
    d_model: int = 512
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    norm_first: bool = True
    final_norm: bool = True
    activation: Activation = "relu"
    positions: str = "t5_relative"
    separate_source_positions: bool = True
    norm: str = "rmsnorm"
    layer_norm_eps: float = 1e-6
    bias: bool = False
    attn_scale: float | None = 1.0
    scale_embeddings: bool = False
    scale_decoder_output: bool = True
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    decoder_start_id: int | None = 0  # T5's target starts with its pad token

    def validate(self) -> None:
        super().validate()
        buckets = self.relative_attention_num_buckets
        self._require(
            4 <= buckets <= 1 << 16,
            "relative_attention_num_buckets",
            "must be in [4, 65,536]: half of them (a quarter, in the encoder) are exact",
        )
        self._require(
            buckets // 2 < self.relative_attention_max_distance <= 1 << 24,
            "relative_attention_max_distance",
            f"must exceed relative_attention_num_buckets // 2 = {buckets // 2} (the exact "
            "distances) and be at most 16,777,216",
        )
