"""The Hugging Face Qwen3 layout (``Qwen3ForCausalLM``): Llama's keys plus the per-head
``q_norm``/``k_norm`` weights."""

from __future__ import annotations

from zoo.checkpoint.hf_config import LLAMA_FIELDS, POSITIVE_INT, HFConfigFormat, full_attention_only
from zoo.checkpoint.hf_layout import hf_layout
from zoo.checkpoint.hf_rules import DOWN, GATE_UP, llama_qkv, llama_rules

from .config import Qwen3Config

QWEN3_CONFIG = HFConfigFormat(
    family="Qwen3",
    model_type="qwen3",
    architecture="Qwen3ForCausalLM",
    config=Qwen3Config,
    fields=LLAMA_FIELDS,
    fixed={"hidden_act": "silu", "attention_bias": False},
    types={"head_dim": POSITIVE_INT},  # transformers' Qwen3Config: not null
    read_extra=full_attention_only,
)

HF_QWEN3 = hf_layout(
    QWEN3_CONFIG, (*llama_rules(qk_norm=True), DOWN), fused=(*llama_qkv(), *GATE_UP)
)
