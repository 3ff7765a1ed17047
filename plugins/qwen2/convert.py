"""The Hugging Face Qwen2 layout (``Qwen2ForCausalLM``): Llama's keys plus q/k/v biases."""

from __future__ import annotations

from zoo.checkpoint.hf_config import LLAMA_FIELDS, HFConfigFormat, full_attention_only
from zoo.checkpoint.hf_layout import hf_layout
from zoo.checkpoint.hf_rules import DOWN, GATE_UP, llama_qkv, llama_rules

from .config import Qwen2Config

QWEN2_CONFIG = HFConfigFormat(
    family="Qwen2",
    model_type="qwen2",
    architecture="Qwen2ForCausalLM",
    config=Qwen2Config,
    fields=LLAMA_FIELDS,
    fixed={"hidden_act": "silu"},
    read_extra=full_attention_only,
)

HF_QWEN2 = hf_layout(QWEN2_CONFIG, (*llama_rules(), DOWN), fused=(*llama_qkv(bias=True), *GATE_UP))
