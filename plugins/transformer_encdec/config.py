"""Encoder-decoder config: the defaults are the Vaswani et al. (2017) base model; the other
fields say how the encoder-decoders of Hugging Face (Marian, BART, T5) differ from it, each a
typed option of the one model (never a family's name)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import MAX_LAYERS, MAX_TOKENS, Activation, TransformerConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class EncoderDecoderConfig(TransformerConfig):
    """Encoder-decoder Transformer.

    Args:
        n_encoder_layers: encoder layers.
        n_decoder_layers: decoder layers.
        The other fields are those of :class:`zoo.config.TransformerConfig`; ``final_norm``
        adds a norm after each stack as ``torch.nn.Transformer`` does, and
        ``tie_embeddings`` makes the LM head share the (target) embedding.
        cross_attention: the decoder's cross-attention component (``mha``, or one a plugin
            supplies).
        separate_source_embedding: the source has a token embedding of its own (``src_emb``,
            ``source_vocab_size`` ids); otherwise source and target share ``tok_emb``
            (Marian's ``share_encoder_decoder_embeddings = false``).
        source_vocab_size: the source's vocabulary with a separate source embedding
            (``None``: ``vocab_size``); ``vocab_size`` is the target's, the LM head's.
        separate_source_positions: the encoder has a position scheme of its own
            (``src_pos_emb``, beside the decoder's ``pos_emb``): BART's two learned tables,
            T5's two relative-bias tables.
        position_offset: position ``p`` reads row ``p + position_offset`` of the position
            scheme, which is built for ``context_length + position_offset`` positions (BART's
            learned table starts at row 2).
        embedding_norm: the ``norm`` component over the embeddings (tokens plus positions) of
            each stack, before dropout (BART's ``layernorm_embedding``).
        logits_bias: a fixed bias added to the logits (``final_logits_bias`` of Marian and
            BART: a buffer, loaded with the weights, not trained).
        scale_decoder_output: the decoder's output is multiplied by ``d_model ** -0.5``
            before the LM head (T5 with its head tied to the embedding).
        decoder_start_id: the token a target starts with (transformers'
            ``decoder_start_token_id``: Marian's and T5's pad, BART's end of text);
            :func:`zoo.generate` starts with it where neither the caller nor the checkpoint's
            ``generation_config.json`` names one (``None``: the tokenizer's start token).
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
    separate_source_embedding: bool = False
    source_vocab_size: int | None = None
    separate_source_positions: bool = False
    position_offset: int = 0
    embedding_norm: bool = False
    logits_bias: bool = False
    scale_decoder_output: bool = False
    decoder_start_id: int | None = None

    @property
    def source_vocab(self) -> int:
        """The source's vocabulary size: ``source_vocab_size``, else ``vocab_size``."""
        return self.source_vocab_size if self.source_vocab_size is not None else self.vocab_size

    def validate(self) -> None:
        super().validate()
        self._require_positive("n_encoder_layers", "n_decoder_layers")
        self._require_at_most(MAX_LAYERS, "n_encoder_layers", "n_decoder_layers")
        if self.source_vocab_size is not None:
            self._require(
                self.separate_source_embedding,
                "source_vocab_size",
                "a source vocabulary of its own needs separate_source_embedding=True",
            )
            self._require(
                0 < self.source_vocab_size <= MAX_TOKENS,
                "source_vocab_size",
                f"must be a positive integer at most {MAX_TOKENS:,} (or None)",
            )
        self._require(
            self.decoder_start_id is None or 0 <= self.decoder_start_id < self.vocab_size,
            "decoder_start_id",
            "must be a target token id in [0, vocab_size) (or None)",
        )
        self._require(
            0 <= self.position_offset <= MAX_TOKENS - self.context_length,
            "position_offset",
            f"must be in [0, {MAX_TOKENS:,} - context_length]",
        )
