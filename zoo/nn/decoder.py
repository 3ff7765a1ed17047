"""The decoder-only language model shared by gpt1, gpt2 and wiki-gpt-wordpiece.

Everything that differs between them is a :class:`~zoo.config.DecoderConfig` field: norm
placement, final LayerNorm, activation, position scheme, head tying and bias.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..config import DecoderConfig
from .base import (
    ZooModel,
    check_padding_mask,
    check_token_ids,
    init_weights,
    random_ids,
    right_padding,
)
from .blocks import TransformerBlock
from .masks import sdpa_mask
from .positions import make_positions

__all__ = ["DecoderLM"]


class DecoderLM(ZooModel):
    """Token embedding + positions -> ``n_layers`` causal blocks -> [LayerNorm] -> LM head.

    Args:
        config: a :class:`~zoo.config.DecoderConfig` (or subclass).

    Shape:
        - input_ids: ``(B, T)`` integer ids in ``[0, vocab_size)``, ``T <= context_length``.
        - attention_mask: ``(B, T)``, 1 for tokens and 0 for padding (left or right).
        - output: logits ``(B, T, vocab_size)``.
    """

    config: DecoderConfig

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__(config)
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = make_positions(c.positions, c.context_length, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                c.d_model,
                c.n_heads,
                c.d_ff,
                activation=c.activation,
                norm_first=c.norm_first,
                dropout=c.dropout,
                layer_norm_eps=c.layer_norm_eps,
            )
            for _ in range(c.n_layers)
        )
        self.final_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.final_norm else None
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=c.head_bias)
        self.reset_parameters()
        if c.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layers)."""
        self.apply(init_weights)
        for block in self.blocks:
            for proj in (block.attn.proj, block.ffn.proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * self.config.n_layers))

    def example_inputs(
        self, batch_size: int = 2, seq_len: int = 8, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        device = self.tok_emb.weight.device
        seq_len = min(seq_len, self.config.context_length)
        return {
            "input_ids": random_ids(
                (batch_size, seq_len), self.config.vocab_size, device, generator
            ),
            "attention_mask": right_padding(batch_size, seq_len, device),
        }

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        """Token plus position vectors, ``(B, T) -> (B, T, d_model)``."""
        x = self.tok_emb(input_ids)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        return self.drop(x + self.pos_emb(position_ids).to(x.dtype))

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
            position_ids = _positions(ids, keep)
        mask = sdpa_mask(keep, causal=True, q_len=ids.shape[1])
        x = self.embed(ids, position_ids)  # (B, T, d_model)
        for block in self.blocks:
            x = block(x, mask=mask, causal=True)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.head(x)  # (B, T, vocab_size)


def _positions(ids: Tensor, keep: Tensor | None) -> Tensor:
    """Position ids ``(B, T)``: 0..T-1, or counting real tokens only when there is padding."""
    if keep is None:
        return torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    return (keep.long().cumsum(dim=1) - 1).clamp(min=0)
