"""The Hugging Face GPT-J layout (``GPTJForCausalLM``).

Keys map one to one (q/k/v fused into zoo's ``qkv``), but GPT-J turns rotary pairs of
adjacent features ``(2i, 2i + 1)`` where zoo turns ``(i, i + r/2)`` (rotate-half). The same
rotation of the same pairs, in another order: the layout reorders each head's first
``rotary_dim`` query and key rows (evens, then odds) on import and back on export, so scores
``q . k`` are unchanged and the checkpoint loads exactly.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from zoo.checkpoint.hf_config import POSITIVE_INT, HFConfigFormat, HFConfigReader, HFField
from zoo.checkpoint.hf_layout import ANY, KeyRule, fused_linear, hf_layout, linear_rules

from . import GPTJConfig

_H = "transformer.h.{i}"
_BUFFERS = r"transformer\.h\.\d+\.attn\.(bias|masked_bias)"  # old files' mask buffers

#: ``(foreign state, config) -> foreign state``
Transform = Callable[[dict[str, Tensor], Any], dict[str, Tensor]]


def interleaved_rotary(pattern: str) -> tuple[Transform, Transform]:
    """``(merge_foreign, split_foreign)`` for a layout whose rotary pairs are adjacent
    features (GPT-J's ``rotate_every_two``, Cohere's ``repeat_interleave``): the rows of
    each head of the tensors whose key fully matches ``pattern`` (queries and keys) are put
    in rotate-half order on import, and back on export."""

    def order(config: Any, *, inverse: bool) -> Tensor:
        head = config.head_size
        turned = config.rotary_dim or head
        evens_then_odds = torch.cat(
            [torch.arange(0, turned, 2), torch.arange(1, turned, 2), torch.arange(turned, head)]
        )
        return torch.argsort(evens_then_odds) if inverse else evens_then_odds

    def reorder(state: dict[str, Tensor], config: Any, *, inverse: bool) -> dict[str, Tensor]:
        rows = order(config, inverse=inverse)
        out = dict(state)
        for key, tensor in state.items():
            if re.fullmatch(pattern, key):
                heads = tensor.reshape(-1, config.head_size, *tensor.shape[1:])  # (H, head, ...)
                out[key] = heads[:, rows].reshape(tensor.shape)
        return out

    return (
        lambda state, config: reorder(state, config, inverse=False),
        lambda state, config: reorder(state, config, inverse=True),
    )


def _d_ff(r: HFConfigReader) -> dict[str, Any]:
    """``n_inner``: the MLP's width, null for transformers' ``4 * n_embd``."""
    inner = r.get("n_inner", None, field="d_ff")
    return {"d_ff": 4 * r.integer("n_embd") if inner is None else inner}


GPTJ_CONFIG = HFConfigFormat(
    family="GPT-J", model_type="gptj", architecture="GPTJForCausalLM", config=GPTJConfig,
    fields={
        "vocab_size": "vocab_size", "context_length": "n_positions", "d_model": "n_embd",
        "n_heads": "n_head", "n_layers": "n_layer",
        "rotary_dim": HFField("rotary_dim", 64),
        "layer_norm_eps": HFField("layer_norm_epsilon", 1e-5),
        "tie_embeddings": HFField("tie_word_embeddings", False),
    },
    fixed={"activation_function": "gelu_new"},
    types={"rotary_dim": POSITIVE_INT},  # null would turn the whole width, not one head
    read_extra=_d_ff,
    write_extra=lambda c: {"n_inner": c.d_ff},
)  # fmt: skip

MERGE, SPLIT = interleaved_rotary(r"transformer\.h\.\d+\.attn\.[qk]_proj\.weight")

HF_GPTJ = hf_layout(GPTJ_CONFIG, (
    KeyRule("transformer.wte.weight", "tok_emb.weight"),
    *linear_rules(f"{_H}.ln_1", "blocks.{i}.norm"),
    KeyRule(f"{_H}.attn.out_proj.weight", "blocks.{i}.attn.proj.weight"),
    *linear_rules(f"{_H}.mlp.fc_in", "blocks.{i}.ffn.fc"),
    *linear_rules(f"{_H}.mlp.fc_out", "blocks.{i}.ffn.proj"),
    *linear_rules("transformer.ln_f", "final_norm"),
    *linear_rules("lm_head", "head"),
), fused=fused_linear("blocks.{i}.attn.qkv", tuple(f"{_H}.attn.{p}_proj" for p in "qkv"),
                      ("q", "kv", "kv")),
   ignore_foreign=(_BUFFERS,), merge_foreign=MERGE, split_foreign=SPLIT,
   d_ff=ANY)  # fmt: skip
