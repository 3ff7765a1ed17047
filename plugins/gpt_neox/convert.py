"""The Hugging Face GPT-NeoX layout (``GPTNeoXForCausalLM``): one ``query_key_value``
projection whose rows hold each head's query, key and value together (zoo's ``qkv`` holds
all queries, then keys, then values: ``interleave=3`` regroups them)."""

from __future__ import annotations

from zoo.checkpoint.hf_config import HFConfigFormat, HFField
from zoo.checkpoint.hf_layout import KeyRule, hf_layout, linear_rules

from .config import GPTNeoXConfig

_L = "gpt_neox.layers.{i}"
_BUFFERS = r"gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)"  # old files

NEOX_CONFIG = HFConfigFormat(
    family="GPT-NeoX", model_type="gpt_neox", architecture="GPTNeoXForCausalLM",
    config=GPTNeoXConfig, fields={
        "vocab_size": "vocab_size", "context_length": "max_position_embeddings",
        "d_model": "hidden_size", "n_heads": "num_attention_heads",
        "n_layers": "num_hidden_layers", "d_ff": "intermediate_size",
        "layer_norm_eps": HFField("layer_norm_eps", 1e-5),
        "rope_theta": HFField("rotary_emb_base", 10000.0),
        "rotary_dim": HFField("rotary_pct", 0.25),
        "parallel_residual": HFField("use_parallel_residual", True),
        "tie_embeddings": HFField("tie_word_embeddings", False),
    },
    fixed={"hidden_act": "gelu", "attention_bias": True},
    inert=frozenset({"classifier_dropout", "is_decoder"}),
)  # fmt: skip

HF_GPT_NEOX = hf_layout(NEOX_CONFIG, (
    KeyRule("gpt_neox.embed_in.weight", "tok_emb.weight"),
    *linear_rules(f"{_L}.input_layernorm", "blocks.{i}.attn_norm"),
    *linear_rules(f"{_L}.attention.query_key_value", "blocks.{i}.attn.qkv", interleave=3),
    *linear_rules(f"{_L}.attention.dense", "blocks.{i}.attn.proj"),
    *linear_rules(f"{_L}.post_attention_layernorm", "blocks.{i}.ffn_norm"),
    *linear_rules(f"{_L}.mlp.dense_h_to_4h", "blocks.{i}.ffn.fc"),
    *linear_rules(f"{_L}.mlp.dense_4h_to_h", "blocks.{i}.ffn.proj"),
    *linear_rules("gpt_neox.final_layer_norm", "final_norm"),
    KeyRule("embed_out.weight", "head.weight", optional=True),  # absent when tied
), ignore_foreign=(_BUFFERS,))  # fmt: skip
