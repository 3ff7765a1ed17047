"""The Hugging Face Mistral layout (``MistralForCausalLM``): Llama's keys; ``sliding_window``
in config.json (transformers' default 4096 when absent, none when null)."""

from __future__ import annotations

from zoo.checkpoint.hf_config import LLAMA_FIELDS, POSITIVE_INT, HFConfigFormat, HFField
from zoo.checkpoint.hf_layout import hf_layout
from zoo.checkpoint.hf_rules import DOWN, GATE_UP, llama_qkv, llama_rules

from .config import MistralConfig

MISTRAL_FIELDS = {**LLAMA_FIELDS, "sliding_window": HFField("sliding_window", 4096)}
#: transformers' MistralConfig and MixtralConfig: num_key_value_heads is not null.
MISTRAL_TYPES = {"num_key_value_heads": POSITIVE_INT}

MISTRAL_CONFIG = HFConfigFormat(
    family="Mistral",
    model_type="mistral",
    architecture="MistralForCausalLM",
    config=MistralConfig,
    fields=MISTRAL_FIELDS,
    fixed={"hidden_act": "silu"},
    types=MISTRAL_TYPES,
)

HF_MISTRAL = hf_layout(MISTRAL_CONFIG, (*llama_rules(), DOWN), fused=(*llama_qkv(), *GATE_UP))
