"""The toy architecture: zoo.nn blocks composed into a new model."""

import dataclasses
from typing import ClassVar

import torch
from torch import nn

from zoo.config import TransformerConfig
from zoo.nn import TransformerBlock, ZooModel, check_padding_mask, check_token_ids, sdpa_mask


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyConfig(TransformerConfig):
    architecture: ClassVar[str] = "toy-gpt"

    vocab_size: int = 256
    context_length: int = 128
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256
    tie_embeddings: bool = False  # its head is a weight of its own

    def validate(self) -> None:
        super().validate()
        self._require_positive("n_layers")


class ToyGPT(ZooModel):
    def __init__(self, config: ToyConfig) -> None:
        super().__init__(config)
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.blocks = TransformerBlock.stack(c, c.n_layers)  # the components c names
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
