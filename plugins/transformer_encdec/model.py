"""The encoder-decoder Transformer, composed from ``zoo.nn`` blocks."""

from __future__ import annotations

from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from zoo.nn import (
    Linear,
    MultiHeadAttention,
    Parts,
    TransformerBlock,
    ZooModel,
    activation_dtype,
    causal_self_mask,
    check_padding_mask,
    check_token_ids,
    embed_tokens,
    init_weights,
    make_positions,
    parts_for,
    positions_from_mask,
    random_ids,
    right_padding,
    sdpa_mask,
)
from zoo.runtime import KVCache

from .config import EncoderDecoderConfig

__all__ = ["EncoderDecoder", "EncoderDecoderSession"]


class EncoderDecoder(ZooModel):
    """Encoder over the source, decoder over the target with cross-attention to the encoder.

    Source and target share one token embedding (one subword vocabulary) and one position
    scheme; the LM head is tied to that embedding when ``tie_embeddings``.

    Shape:
        - src_ids: ``(B, S)``; tgt_ids: ``(B, T)``; ``S`` and ``T`` are independent,
          each at most ``context_length``.
        - src_mask / tgt_mask: ``(B, S)`` / ``(B, T)``, 1 for tokens, 0 for padding.
        - output: logits ``(B, T, vocab_size)``.
    """

    config: EncoderDecoderConfig
    is_encoder_decoder = True
    replayable_init = True  # zoo.build makes its meta build real (zoo.nn.materialize)
    train_task: ClassVar[str] = "seq2seq"  # zoo.train's task spec (zoo.train.task)

    def __init__(self, config: EncoderDecoderConfig, parts: Parts | None = None) -> None:
        super().__init__(config)
        c = config
        parts = parts_for(c, parts)
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = make_positions(c, parts)
        self.drop = nn.Dropout(c.dropout)

        self.encoder = TransformerBlock.stack(c, c.n_encoder_layers, parts)
        self.decoder = TransformerBlock.stack(c, c.n_decoder_layers, parts, cross_attention=True)
        self.encoder_norm = parts.build("norm", c) if c.final_norm else None
        self.decoder_norm = parts.build("norm", c) if c.final_norm else None
        self.head = Linear(c.d_model, c.vocab_size, bias=c.head_bias)
        self.reset_parameters()
        if c.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """GPT-style initialisation (:func:`zoo.nn.init_weights`) of every module."""
        self.apply(init_weights)

    def example_inputs(
        self, batch_size: int = 2, seq_len: int = 8, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """Source and target of different lengths; the source has padding."""
        device = activation_dtype(self)[1]
        src_len = min(seq_len + 3, self.config.context_length)
        tgt_len = min(seq_len, self.config.context_length)
        v = self.config.vocab_size
        return {
            "src_ids": random_ids((batch_size, src_len), v, device, generator),
            "tgt_ids": random_ids((batch_size, tgt_len), v, device, generator),
            "src_mask": right_padding(batch_size, src_len, device),
        }

    def embed(self, ids: Tensor, positions: Tensor) -> Tensor:
        """Token plus position vectors (source and target share them), ``(B, L) ->
        (B, L, d_model)``."""
        return embed_tokens(
            self.tok_emb,
            self.pos_emb,
            self.drop,
            ids,
            positions,
            scale_by_width=self.config.scale_embeddings,
        )

    def _check(self, ids: Tensor, mask: Tensor | None, name: str) -> tuple[Tensor, Tensor | None]:
        c = self.config
        ids = check_token_ids(
            ids, vocab_size=c.vocab_size, context_length=c.context_length, name=name
        )
        return ids, check_padding_mask(mask, ids.shape, name=name.replace("_ids", "_mask"))

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Encoder output ``(B, S, d_model)``."""
        src_ids, src_keep = self._check(src_ids, src_mask, "src_ids")
        return self._encode(src_ids, src_keep)

    def _encode(self, src_ids: Tensor, src_keep: Tensor | None) -> Tensor:
        mask = sdpa_mask(src_keep, causal=False, q_len=src_ids.shape[1])
        x = self.embed(src_ids, positions_from_mask(src_ids, src_keep))
        for layer in self.encoder:
            x = layer(x, mask=mask)
        return self.encoder_norm(x) if self.encoder_norm is not None else x

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """Logits ``(B, T, vocab_size)`` for ``tgt_ids`` given the encoder output ``memory``."""
        tgt_ids, tgt_keep = self._check(tgt_ids, tgt_mask, "tgt_ids")
        src_keep = check_padding_mask(src_mask, memory.shape[:2], name="src_mask")
        memory_kv = self.memory_kv(memory)
        return self.decoder_logits(tgt_ids, tgt_keep, memory_kv, src_keep)

    def decoder_logits(
        self,
        tgt_ids: Tensor,
        tgt_keep: Tensor | None,
        memory_kv: list[tuple[Tensor, Tensor]] | None,
        src_keep: Tensor | None,
        *,
        cache: KVCache | None = None,
        last_only: bool = False,
        memory: Tensor | None = None,
    ) -> Tensor:
        """The decoder on validated inputs: ``memory_kv`` holds each layer's cross-attention
        keys and values (``None``: each layer computes them from the encoder output
        ``memory``); with a ``cache`` the new target positions are appended to it."""
        t = tgt_ids.shape[1]
        start = cache.length if cache is not None else 0
        self_mask, causal = causal_self_mask(tgt_keep, q_len=t, start=start)
        cross_mask = sdpa_mask(src_keep, causal=False, q_len=t)
        if cache is None:
            positions = positions_from_mask(tgt_ids, tgt_keep)
        else:  # every row of a generated target starts at position 0: no padding
            positions = torch.arange(start, start + t, device=tgt_ids.device).expand_as(tgt_ids)
        x = self.embed(tgt_ids, positions)
        for i, layer in enumerate(self.decoder):
            x = layer(
                x,
                mask=self_mask,
                causal=causal,
                memory=memory,
                memory_mask=cross_mask,
                memory_kv=memory_kv[i] if memory_kv is not None else None,
                cache=cache.layers[i] if cache is not None else None,
                start=start,
            )
        if cache is not None:
            cache.advance(t)
        if last_only:
            x = x[:, -1:]  # (B, 1, d_model)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.head(x)  # (B, T, vocab_size)

    def forward(
        self,
        src_ids: Tensor,
        tgt_ids: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """Logits ``(B, T, vocab_size)`` for every target position."""
        src_ids, src_keep = self._check(src_ids, src_mask, "src_ids")
        tgt_ids, tgt_keep = self._check(tgt_ids, tgt_mask, "tgt_ids")
        if src_ids.shape[0] != tgt_ids.shape[0]:
            raise ValueError(
                f"src_ids has batch size {src_ids.shape[0]} but tgt_ids has {tgt_ids.shape[0]}"
            )
        memory = self._encode(src_ids, src_keep)
        # each decoder layer projects the memory to its cross-attention keys and values in
        # its own forward (where FSDP2 gathers that layer's weights)
        return self.decoder_logits(tgt_ids, tgt_keep, None, src_keep, memory=memory)

    def memory_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each decoder layer's cross-attention keys and values over the encoder output
        ``memory`` ``(B, S, d_model)``, computed once per source."""
        layers = cast("list[TransformerBlock]", self.decoder)
        return [cast("MultiHeadAttention", layer.cross_attn).memory_kv(memory) for layer in layers]

    def start_decoding(
        self,
        src_ids: Tensor,
        src_keep: Tensor | None,
        max_new_tokens: int,
        *,
        start_id: int | None = None,
    ) -> EncoderDecoderSession:
        """A decoding session: the source is encoded once, the target starts with
        ``start_id`` (required: the decoder's first input)."""
        if start_id is None:
            raise ValueError("an encoder-decoder starts decoding from start_id; pass one")
        return EncoderDecoderSession(self, src_ids, src_keep, max_new_tokens, start_id)


class EncoderDecoderSession:
    """Incremental decoding: encoder run once, cross-attention keys/values computed once per
    layer, decoder self-attention keys/values in a preallocated cache."""

    def __init__(
        self,
        model: EncoderDecoder,
        src_ids: Tensor,
        src_keep: Tensor | None,
        max_new_tokens: int,
        start_id: int,
    ) -> None:
        c = model.config
        max_len = 1 + max_new_tokens
        if max_len > c.context_length:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} plus the start token exceeds the context "
                f"length {c.context_length}; lower max_new_tokens"
            )
        if not 0 <= start_id < c.vocab_size:
            raise ValueError(f"start_id {start_id} is outside the vocabulary [0, {c.vocab_size})")
        self.model = model
        self.src_keep = src_keep
        memory = model._encode(src_ids, src_keep)
        self.memory_kv = model.memory_kv(memory)
        dtype, device = activation_dtype(model)
        b = src_ids.shape[0]
        self.cache = KVCache(
            c.n_decoder_layers,
            b,
            c.n_kv_heads or c.n_heads,
            max_len,
            c.head_size,
            dtype=dtype,
            device=device,
        )
        #: What generated ids are appended to: the start token of each row, ``(B, 1)``.
        self.prefix = torch.full((b, 1), start_id, dtype=torch.long, device=src_ids.device)

    def _logits(self, ids: Tensor) -> Tensor:
        logits = self.model.decoder_logits(
            ids, None, self.memory_kv, self.src_keep, cache=self.cache, last_only=True
        )
        return logits[:, -1]  # (B, vocab)

    def prefill(self) -> Tensor:
        """Logits after the start token, ``(B, vocab)``."""
        return self._logits(self.prefix)

    def step(self, tokens: Tensor) -> Tensor:
        """Append ``tokens`` ``(B,)``; return the next logits ``(B, vocab)``."""
        return self._logits(tokens[:, None])
