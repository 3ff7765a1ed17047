"""The decoder-only language model shared by gpt1, gpt2, wiki-gpt-wordpiece, llama and any
plugin's decoder.

Everything that differs between them is a :class:`~zoo.config.DecoderConfig` field: the
components (position scheme, norm, feed-forward, attention) and their options, norm
placement, final norm, head tying and biases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import cast

import torch
from torch import Tensor, nn

from ..config import DecoderConfig
from .base import (
    ZooModel,
    activation_dtype,
    check_padding_mask,
    check_position_ids,
    check_token_ids,
    embed_tokens,
    init_weights,
    random_ids,
    right_padding,
)
from .blocks import BUILTIN_BLOCKS, TransformerBlock
from .cache_types import KVCacheLike
from .linear import Linear
from .masks import positions_from_mask, self_attention_mask
from .moe import MixtureOfExperts
from .parts import Parts, make_positions, parts_for
from .positions import PositionScheme

__all__ = ["DecoderLM"]


class DecoderLM(ZooModel):
    """Token embedding [+ positions] -> ``n_layers`` causal blocks -> [norm] -> LM head.

    Args:
        config: a :class:`~zoo.config.DecoderConfig` (or subclass).
        parts: what the config's component names stand for (``zoo.build`` passes the ones
            the registry resolved; default: the built-in ones, :meth:`zoo.nn.Parts.builtin`).

    Shape:
        - input_ids: ``(B, T)`` integer ids in ``[0, vocab_size)``, ``T <= context_length``.
        - attention_mask: ``(B, T)``, 1 for tokens and 0 for padding (left or right).
        - output: logits ``(B, T, vocab_size)``.
    """

    config: DecoderConfig
    replayable_init = True

    def __init__(self, config: DecoderConfig, parts: Parts | None = None) -> None:
        super().__init__(config)
        c = config
        parts = parts_for(c, parts).with_builtin("block", BUILTIN_BLOCKS, c)
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = make_positions(c, parts)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = parts.stack(c, c.n_layers)
        # rotary bases other than rope_theta (sliding layers' rope_local_theta): one more
        # scheme each, by base (rotary schemes hold no tensors, so they need no registering)
        self._other_positions: dict[float, PositionScheme] = {
            theta: make_positions(c.replace(rope_theta=theta), parts)
            for theta in {c.layer_rope_theta(i) for i in range(c.n_layers)} - {c.rope_theta}
        }
        #: Each layer's sliding window (``None``: every key) and rotary base.
        self.layer_windows = tuple(c.layer_window(i) for i in range(c.n_layers))
        self._layer_thetas = tuple(c.layer_rope_theta(i) for i in range(c.n_layers))
        self.final_norm = parts.build("norm", c) if c.final_norm else None
        self.head = Linear(c.d_model, c.vocab_size, bias=c.head_bias)
        # the seams between the embedding and the first block, and after the head
        self.emb_norm = parts.build("norm", c) if c.embedding_norm else None
        self.post_embedding = parts.build("embedding", c) if c.embedding else None
        self.post_head = parts.build("head", c) if c.head else None
        self.reset_parameters()
        if c.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layers)."""
        self.apply(init_weights)
        for block in cast("list[TransformerBlock]", self.blocks):  # any block: attn, ffn
            ffns = block.ffn.experts if isinstance(block.ffn, MixtureOfExperts) else [block.ffn]
            for owner in (block.attn, *ffns):  # components name their output projection proj
                proj = cast("nn.Linear", owner.proj)
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * self.config.n_layers))

    def example_inputs(
        self, batch_size: int = 2, seq_len: int = 8, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        device = activation_dtype(self)[1]
        seq_len = min(seq_len, self.config.context_length)
        return {
            "input_ids": random_ids(
                (batch_size, seq_len), self.config.vocab_size, device, generator
            ),
            "attention_mask": right_padding(batch_size, seq_len, device),
        }

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        """Token plus position vectors, ``(B, T) -> (B, T, d_model)``: the token vectors
        scaled (``scale_embeddings``, ``embedding_multiplier``), the positions added, then the
        embedding norm and the ``embedding`` component where the config has them."""
        x = embed_tokens(
            self.tok_emb,
            self.pos_emb,
            self.drop,
            input_ids,
            position_ids,
            scale_by_width=self.config.scale_embeddings,
            multiplier=self.config.embedding_multiplier,
        )
        if self.emb_norm is not None:
            x = self.emb_norm(x)
        return x if self.post_embedding is None else self.post_embedding(x)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """Logits for every position. With padding, positions count real tokens only, so a
        left-padded row gives the same logits as the same row unpadded."""
        c = self.config
        ids = check_token_ids(input_ids, vocab_size=c.vocab_size, context_length=c.context_length)
        keep = check_padding_mask(attention_mask, ids.shape)
        if position_ids is None:
            position_ids = positions_from_mask(ids, keep)
        else:
            position_ids = check_position_ids(position_ids, ids.shape, c.context_length)
        return self.logits(ids, keep, position_ids)

    def logits(
        self,
        ids: Tensor,
        keep: Tensor | None,
        position_ids: Tensor,
        *,
        cache: KVCacheLike | None = None,
        last_only: bool = False,
        mask: Tensor | Mapping[int | None, Tensor] | None = None,
    ) -> Tensor:
        """The forward pass on validated inputs.

        Args:
            ids: ``(B, T)`` new token ids.
            keep: ``(B, S)`` padding mask of every key (``S = cache.length + T``), or ``None``.
            position_ids: ``(B, T)`` positions of the new tokens.
            cache: keys/values of earlier positions; the new ones are appended to it.
            last_only: compute logits for the last position only, ``(B, 1, vocab)``.
            mask: a ready boolean self-attention mask ``(B, 1, T, S)`` over every key the
                cache returns, used instead of one built from ``keep`` (for a cache read whole,
                :meth:`zoo.runtime.cache.KVCache.read_whole`; the position scheme must add no
                score bias);
                for a model whose layers see different windows, one per window of
                :attr:`layer_windows` (:meth:`window_masks` makes them).
        """
        x = self.states(ids, keep, position_ids, cache=cache, last_only=last_only, mask=mask)
        return self.finish_logits(self.head(x))

    def finish_logits(self, logits: Tensor) -> Tensor:
        """The head's output scaled by ``logit_scale`` (Cohere), soft-capped by
        ``final_softcap`` (Gemma 2) and passed through the ``head`` component, in that order;
        unchanged when none is set."""
        c = self.config
        if c.logit_scale != 1.0:
            logits = logits * c.logit_scale
        if c.final_softcap is not None:
            logits = torch.tanh(logits / c.final_softcap) * c.final_softcap
        return logits if self.post_head is None else self.post_head(logits)

    def hidden(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """The final hidden states ``(B, T, d_model)`` (what the LM head reads), for heads of
        other tasks (sequence classification)."""
        c = self.config
        ids = check_token_ids(input_ids, vocab_size=c.vocab_size, context_length=c.context_length)
        keep = check_padding_mask(attention_mask, ids.shape)
        return self.states(ids, keep, positions_from_mask(ids, keep))

    def states(
        self,
        ids: Tensor,
        keep: Tensor | None,
        position_ids: Tensor,
        *,
        cache: KVCacheLike | None = None,
        last_only: bool = False,
        mask: Tensor | Mapping[int | None, Tensor] | None = None,
    ) -> Tensor:
        """:meth:`logits` without the head: final hidden states ``(B, T, d_model)``."""
        start = cache.length if cache is not None else 0
        t = ids.shape[1]
        x = self.embed(ids, position_ids)  # (B, T, d_model)
        rotations = {self.config.rope_theta: self.pos_emb.rotation(position_ids)}  # once each
        for theta, scheme in self._other_positions.items():
            rotations[theta] = scheme.rotation(position_ids)
        masks: Mapping[int | None, tuple[Tensor | None, bool]]  # window -> (mask, causal)
        if mask is None:
            bias = self.pos_emb.score_bias(t, start + t, ids.device)  # (H, T, S) or None
            masks = {
                window: self_attention_mask(
                    keep,
                    q_len=t,
                    start=start,
                    window=window,
                    bias=bias,
                    device=ids.device,
                    dtype=x.dtype,
                )
                for window in set(self.layer_windows)
            }
        elif isinstance(mask, Tensor):
            masks = dict.fromkeys(self.layer_windows, (mask, False))
        else:
            masks = {window: (m, False) for window, m in mask.items()}
        for i, block in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            layer_mask, causal = masks[self.layer_windows[i]]
            x = block(
                x,
                mask=layer_mask,
                causal=causal,
                cache=layer_cache,
                start=start,
                rotation=rotations[self._layer_thetas[i]],
            )
        if cache is not None:
            cache.advance(t)
        if last_only:
            x = x[:, -1:]  # (B, 1, d_model)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x  # (B, T, d_model)

    def window_masks(
        self, allowed: Tensor, query: Tensor, keys: Tensor
    ) -> dict[int | None, Tensor]:
        """One boolean mask per window of :attr:`layer_windows`, from the mask ``allowed``
        ``(B, 1, T, S)`` of every key a query may see, the cache index of each query
        ``query`` (broadcastable to ``(B, 1, T, 1)``) and of each key ``keys`` ``(S,)``: a
        windowed layer sees its ``window`` most recent keys of those."""
        return {
            window: allowed if window is None else allowed & (keys > query - window)
            for window in set(self.layer_windows)
        }
