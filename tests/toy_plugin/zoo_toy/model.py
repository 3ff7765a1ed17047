"""The toy architecture: zoo.nn blocks composed into a new model."""

import dataclasses
from typing import ClassVar

import torch
from torch import nn

from zoo.config import ModelConfig
from zoo.nn import TransformerBlock, ZooModel, check_padding_mask, check_token_ids, sdpa_mask


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyConfig(ModelConfig):
    architecture: ClassVar[str] = "toy-gpt"

    vocab_size: int = 256
    context_length: int = 128
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256

    def validate(self) -> None:
        self._require_positive("vocab_size", "context_length", "d_model", "n_layers", "d_ff")
        self._require(self.d_model % self.n_heads == 0, "d_model", "must divide by n_heads")


class ToyGPT(ZooModel):
    def __init__(self, config: ToyConfig) -> None:
        super().__init__(config)
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, c.d_ff, activation="gelu", norm_first=True)
            for _ in range(c.n_layers)
        )
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)

    def example_inputs(self, batch_size=2, seq_len=8, *, generator=None):
        ids = torch.randint(0, self.config.vocab_size, (batch_size, seq_len), generator=generator)
        return {"input_ids": ids.to(self.tok_emb.weight.device)}

    def forward(self, input_ids, attention_mask=None):
        c = self.config
        ids = check_token_ids(input_ids, vocab_size=c.vocab_size, context_length=c.context_length)
        keep = check_padding_mask(attention_mask, ids.shape)
        mask = sdpa_mask(keep, causal=True, q_len=ids.shape[1])
        x = self.tok_emb(ids)  # (B, T, d_model)
        for block in self.blocks:
            x = block(x, mask=mask, causal=True)
        return self.head(self.norm(x))  # (B, T, vocab_size)
