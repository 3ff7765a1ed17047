"""The encoder-decoder Transformer, composed from ``zoo.nn`` blocks: Vaswani et al.'s, and
with the options of its config the encoder-decoders of Hugging Face (Marian, BART, T5)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from zoo.errors import ConfigError
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
    self_attention_mask,
)
from zoo.nn.positions import PositionScheme
from zoo.runtime import KVCache

from .config import EncoderDecoderConfig

__all__ = ["EncoderDecoder", "EncoderDecoderSession"]


class EncoderDecoder(ZooModel):
    """Encoder over the source, decoder over the target with cross-attention to the encoder.

    Source and target share one token embedding (one subword vocabulary) and one position
    scheme, unless ``separate_source_embedding`` / ``separate_source_positions`` give the
    source its own (``src_emb``, ``src_pos_emb``); the LM head is tied to the target's
    embedding when ``tie_embeddings``. A position scheme that adds score biases (T5's relative
    bias) biases the decoder's self-attention through ``score_bias`` and the encoder's through
    ``bidirectional_score_bias`` (keys on both sides of each query).

    Shape:
        - src_ids: ``(B, S)``; tgt_ids: ``(B, T)``; ``S`` and ``T`` are independent,
          each at most ``context_length``.
        - src_mask / tgt_mask: ``(B, S)`` / ``(B, T)``, 1 for tokens, 0 for padding.
        - output: logits ``(B, T, vocab_size)``.
    """

    config: EncoderDecoderConfig
    final_logits_bias: Tensor | None
    is_encoder_decoder = True
    replayable_init = True  # zoo.build makes its meta build real (zoo.nn.materialize)
    train_task: ClassVar[str] = "seq2seq"  # zoo.train's task spec (zoo.train.task)

    def __init__(self, config: EncoderDecoderConfig, parts: Parts | None = None) -> None:
        super().__init__(config)
        c = config
        parts = parts_for(c, parts)
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        if c.separate_source_embedding:
            self.src_emb = nn.Embedding(c.source_vocab, c.d_model)
        self.pos_emb = self._positions(c, parts)
        if c.separate_source_positions:
            self.src_pos_emb = self._positions(c, parts)
        self.drop = nn.Dropout(c.dropout)
        if c.embedding_norm:
            self.src_embed_norm = parts.build("norm", c)
            self.tgt_embed_norm = parts.build("norm", c)

        self.encoder = TransformerBlock.stack(c, c.n_encoder_layers, parts)
        self.decoder = TransformerBlock.stack(c, c.n_decoder_layers, parts, cross_attention=True)
        self.encoder_norm = parts.build("norm", c) if c.final_norm else None
        self.decoder_norm = parts.build("norm", c) if c.final_norm else None
        self.head = Linear(c.d_model, c.vocab_size, bias=c.head_bias)
        if c.logits_bias:  # Marian's and BART's: loaded with the weights, never trained
            self.register_buffer("final_logits_bias", torch.zeros(c.vocab_size))
        else:
            self.final_logits_bias = None
        self.reset_parameters()
        if c.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    @staticmethod
    def _positions(c: EncoderDecoderConfig, parts: Parts) -> PositionScheme:
        """The position scheme, for ``context_length + position_offset`` positions; one that
        adds score biases must also bias the encoder's attention, which sees both sides."""
        if c.position_offset:
            c = dataclasses.replace(c, context_length=c.context_length + c.position_offset)
        scheme = make_positions(c, parts)
        if scheme.adds_score_bias and not callable(
            getattr(scheme, "bidirectional_score_bias", None)
        ):
            raise ConfigError(
                f"{type(c).__name__}.positions = {c.positions!r}: its scheme "
                f"({type(scheme).__name__}) adds causal score biases only; an encoder's "
                "attention sees keys on both sides of each query, so the scheme must define "
                "bidirectional_score_bias(q_len, k_len, device) to serve an encoder-decoder"
            )
        return scheme

    def reset_parameters(self) -> None:
        """GPT-style initialisation (:func:`zoo.nn.init_weights`) of every module."""
        self.apply(init_weights)

    def reset_buffers(self) -> None:
        """The logits bias (``logits_bias``) starts at zero, as transformers' does."""
        bias = self.final_logits_bias
        if bias is not None and bias.is_meta:  # (a load that lacked it: on the target device)
            self.final_logits_bias = torch.zeros(bias.shape, dtype=bias.dtype)
        elif bias is not None:
            bias.zero_()

    def example_inputs(
        self, batch_size: int = 2, seq_len: int = 8, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """Source and target of different lengths; the source has padding."""
        device = activation_dtype(self)[1]
        src_len = min(seq_len + 3, self.config.context_length)
        tgt_len = min(seq_len, self.config.context_length)
        v = self.config.vocab_size
        return {
            "src_ids": random_ids(
                (batch_size, src_len), self.config.source_vocab, device, generator
            ),
            "tgt_ids": random_ids((batch_size, tgt_len), v, device, generator),
            "src_mask": right_padding(batch_size, src_len, device),
        }

    def embed(self, ids: Tensor, positions: Tensor, *, source: bool = False) -> Tensor:
        """Token plus position vectors (of the source's own tables where it has them, with
        ``source``), normed when ``embedding_norm``, ``(B, L) -> (B, L, d_model)``."""
        c = self.config
        table = self.src_emb if source and c.separate_source_embedding else self.tok_emb
        scheme = self.src_pos_emb if source and c.separate_source_positions else self.pos_emb
        norm = None
        if c.embedding_norm:
            norm = self.src_embed_norm if source else self.tgt_embed_norm
        x = embed_tokens(
            table,
            scheme,
            self.drop if norm is None else nn.Identity(),
            ids,
            positions + c.position_offset if c.position_offset else positions,
            scale_by_width=c.scale_embeddings,
        )
        return x if norm is None else self.drop(norm(x))

    def _check(self, ids: Tensor, mask: Tensor | None, name: str) -> tuple[Tensor, Tensor | None]:
        c = self.config
        vocab = c.source_vocab if name == "src_ids" else c.vocab_size
        ids = check_token_ids(ids, vocab_size=vocab, context_length=c.context_length, name=name)
        return ids, check_padding_mask(mask, ids.shape, name=name.replace("_ids", "_mask"))

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Encoder output ``(B, S, d_model)``."""
        src_ids, src_keep = self._check(src_ids, src_mask, "src_ids")
        return self._encode(src_ids, src_keep)

    def _encode(self, src_ids: Tensor, src_keep: Tensor | None) -> Tensor:
        x = self.embed(src_ids, positions_from_mask(src_ids, src_keep), source=True)
        mask = self._encoder_mask(src_keep, src_ids.shape[1], x.dtype, x.device)
        for layer in self.encoder:
            x = layer(x, mask=mask)
        return self.encoder_norm(x) if self.encoder_norm is not None else x

    def _encoder_mask(
        self, keep: Tensor | None, length: int, dtype: torch.dtype, device: torch.device
    ) -> Tensor | None:
        """The encoder's self-attention mask: the source's padding, plus the position
        scheme's bidirectional score bias (float ``(B | 1, H, S, S)``, ``-inf`` at padding)."""
        mask = sdpa_mask(keep, causal=False, q_len=length)  # (B, 1, S, S) or None
        scheme = self.src_pos_emb if self.config.separate_source_positions else self.pos_emb
        if not scheme.adds_score_bias:
            return mask
        both_sides = getattr(scheme, "bidirectional_score_bias")  # noqa: B009 (checked at build)
        bias = both_sides(length, length, device).to(dtype)  # (H, S, S)
        if mask is None:
            return bias[None]
        return torch.where(mask, bias, torch.tensor(float("-inf"), dtype=dtype, device=device))

    def _self_mask(
        self, keep: Tensor | None, q_len: int, start: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[Tensor | None, bool]:
        """The decoder's self-attention ``(mask, causal)``: causal over the target's padding,
        plus the position scheme's score bias where it adds one."""
        if not self.pos_emb.adds_score_bias:
            return causal_self_mask(keep, q_len=q_len, start=start)
        bias = self.pos_emb.score_bias(q_len, start + q_len, device)  # (H, T, S)
        return self_attention_mask(
            keep, q_len=q_len, start=start, bias=bias, device=device, dtype=dtype
        )

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
        cross_mask = sdpa_mask(src_keep, causal=False, q_len=t)
        if cache is None:
            positions = positions_from_mask(tgt_ids, tgt_keep)
        else:  # every row of a generated target starts at position 0: no padding
            positions = torch.arange(start, start + t, device=tgt_ids.device).expand_as(tgt_ids)
        x = self.embed(tgt_ids, positions)
        self_mask, causal = self._self_mask(tgt_keep, t, start, x.dtype, x.device)
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
        return self.decoder_head(x)

    def decoder_head(self, x: Tensor) -> Tensor:
        """The decoder's last layer output ``(B, T, d_model)`` to logits ``(B, T, vocab_size)``:
        the final norm, T5's ``d_model ** -0.5`` scale, the LM head and the fixed logits bias."""
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if self.config.scale_decoder_output:
            x = x * self.config.d_model**-0.5
        logits = self.head(x)  # (B, T, vocab_size)
        if self.final_logits_bias is not None:
            bias = self.final_logits_bias.to(logits.dtype)
            if logits.requires_grad:
                return logits + bias
            return logits.add_(bias)  # in place: the same sums, one (B, T, vocab) tensor fewer
        return logits

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
    layer, decoder self-attention keys/values in a preallocated cache.

    Rows that repeat the row before them (the same source ids and mask: a beam search's
    beams of one source) share that row's encoding: each distinct source is encoded once
    and its cross-attention keys and values copied to its rows. :meth:`reorder` (beam
    search's reordering of its rows) then moves the self-attention cache, and moves the
    cross-attention keys, values and source mask only when a row takes the row of another
    source (never within one source's beams, whose copies are the same)."""

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
        firsts, self._sources = _distinct_sources(src_ids, src_keep)
        if firsts is None:  # every row its own source
            self.memory_kv = model.memory_kv(model._encode(src_ids, src_keep))
        else:
            keep = None if src_keep is None else src_keep.index_select(0, firsts)
            memory = model._encode(src_ids.index_select(0, firsts), keep)
            self.memory_kv = [
                (k.index_select(0, self._sources), v.index_select(0, self._sources))
                for k, v in model.memory_kv(memory)
            ]
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

    def reorder(self, index: Tensor) -> None:
        """Make row ``i`` what row ``index[i]`` was (beam search's reordering, see
        :func:`zoo.runtime.reorder_rows`): the self-attention cache in place; the
        cross-attention keys and values and the source mask only where a row takes another
        source's row.

        Args:
            index: ``(B,)`` ``torch.long`` row indices on the session's device.
        """
        self.cache.reorder(index)
        self.prefix = self.prefix.index_select(0, index)
        sources = self._sources.index_select(0, index)
        if torch.equal(sources, self._sources):  # each row keeps its source: the same values
            return
        self.memory_kv = [
            (k.index_select(0, index), v.index_select(0, index)) for k, v in self.memory_kv
        ]
        if self.src_keep is not None:
            self.src_keep = self.src_keep.index_select(0, index)
        self._sources = sources


def _distinct_sources(src_ids: Tensor, src_keep: Tensor | None) -> tuple[Tensor | None, Tensor]:
    """The first row of each run of equal consecutive rows (ids and mask alike) ``(D,)``,
    ``None`` when no row repeats the one before it, and each row's run ``(B,)``."""
    repeats = (src_ids[1:] == src_ids[:-1]).all(dim=1)  # (B - 1,): row i + 1 repeats row i
    if src_keep is not None:
        repeats &= (src_keep[1:] == src_keep[:-1]).all(dim=1)
    starts = torch.cat((torch.ones(1, dtype=torch.bool, device=src_ids.device), ~repeats))
    sources = starts.long().cumsum(0) - 1  # (B,)
    if bool(starts.all()):
        return None, sources
    return starts.nonzero().flatten(), sources
