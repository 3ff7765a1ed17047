"""The Hugging Face OLMo-2 layout (``Olmo2ForCausalLM``): Llama's projections, a norm after
attention (``post_attention_layernorm``) and one after the MLP (``post_feedforward_layernorm``)
where Llama has its two before, and ``q_norm``/``k_norm`` over the full projected width."""

from __future__ import annotations

from zoo.checkpoint.hf_config import LLAMA_FIELDS, HFConfigFormat, HFField
from zoo.checkpoint.hf_layout import KeyRule, hf_layout
from zoo.checkpoint.hf_rules import DOWN, GATE_UP, llama_qkv

from .config import Olmo2Config

_LAYER = "model.layers.{i}"

OLMO2_CONFIG = HFConfigFormat(
    family="OLMo-2",
    model_type="olmo2",
    architecture="Olmo2ForCausalLM",
    config=Olmo2Config,
    # transformers' Olmo2Config: epsilon 1e-5 when the file has none (Llama's: 1e-6)
    fields={**LLAMA_FIELDS, "layer_norm_eps": HFField("rms_norm_eps", 1e-5)},
    fixed={"hidden_act": "silu", "attention_bias": False},
)

HF_OLMO2 = hf_layout(
    OLMO2_CONFIG,
    (
        KeyRule("model.embed_tokens.weight", "tok_emb.weight"),
        KeyRule(f"{_LAYER}.self_attn.o_proj.weight", "blocks.{i}.attn.proj.weight"),
        KeyRule(f"{_LAYER}.self_attn.q_norm.weight", "blocks.{i}.attn.q_norm.weight"),
        KeyRule(f"{_LAYER}.self_attn.k_norm.weight", "blocks.{i}.attn.k_norm.weight"),
        KeyRule(f"{_LAYER}.post_attention_layernorm.weight", "blocks.{i}.attn_post_norm.weight"),
        KeyRule(f"{_LAYER}.post_feedforward_layernorm.weight", "blocks.{i}.ffn_post_norm.weight"),
        DOWN,
        KeyRule("model.norm.weight", "final_norm.weight"),
        KeyRule("lm_head.weight", "head.weight", optional=True),  # absent when tied
    ),
    fused=(*llama_qkv(), *GATE_UP),
)
