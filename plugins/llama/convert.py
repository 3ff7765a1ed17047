"""The Hugging Face Llama checkpoint layout (``LlamaForCausalLM``): separate q/k/v and
gate/up projections there, fused ``qkv`` and ``fc`` in zoo. Its key rules, which most
families copy, are zoo's (:mod:`zoo.checkpoint.hf_rules`)."""

from __future__ import annotations

from zoo.checkpoint.hf_config import LLAMA_FIELDS, HFConfigFormat
from zoo.checkpoint.hf_layout import hf_layout
from zoo.checkpoint.hf_rules import DOWN, GATE_UP, llama_qkv, llama_rules

from .config import LlamaConfig

LLAMA_CONFIG = HFConfigFormat(
    family="Llama",
    model_type="llama",
    architecture="LlamaForCausalLM",
    config=LlamaConfig,
    fields=LLAMA_FIELDS,
    fixed={"hidden_act": "silu", "attention_bias": False, "mlp_bias": False},
    checked={"rope_interleaved": False},  # SmolLM2's: rotate-half, zoo's layout
    inert=frozenset({"is_encoder_decoder", "is_llama_config", "transformers.js_config"}),
)

HF_LLAMA = hf_layout(
    LLAMA_CONFIG,
    (*llama_rules(), DOWN),
    fused=(*llama_qkv(), *GATE_UP),
    ignore_foreign=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
)
