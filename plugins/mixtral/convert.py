"""The Hugging Face Mixtral layout (``MixtralForCausalLM``): Llama's attention keys, and per
block a router (``block_sparse_moe.gate``) and experts whose ``w1``/``w3`` (gate/up) zoo fuses
into each expert's ``fc`` and whose ``w2`` is its ``proj``."""

from __future__ import annotations

from zoo.checkpoint.hf_config import HFConfigFormat, HFField
from zoo.checkpoint.hf_layout import KeyRule, fused_linear, hf_layout
from zoo.checkpoint.hf_rules import llama_qkv, llama_rules

from ..mistral.convert import MISTRAL_FIELDS, MISTRAL_TYPES
from .config import MixtralConfig

_MOE = "model.layers.{i}.block_sparse_moe"
_EXPERT, _ZOO_EXPERT = f"{_MOE}.experts.{{e}}", "blocks.{i}.ffn.experts.{e}.fc"

MIXTRAL_CONFIG = HFConfigFormat(
    family="Mixtral", model_type="mixtral", architecture="MixtralForCausalLM",
    config=MixtralConfig, fields={**MISTRAL_FIELDS, "sliding_window": HFField("sliding_window"),
            "n_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok"},
    fixed={"hidden_act": "silu"}, types=MISTRAL_TYPES,
    inert=frozenset({"router_aux_loss_coef", "output_router_logits", "router_jitter_noise"}),
)  # fmt: skip

HF_MIXTRAL = hf_layout(MIXTRAL_CONFIG, (
    *llama_rules(),
    KeyRule(f"{_MOE}.gate.weight", "blocks.{i}.ffn.router.weight"),
    KeyRule(f"{_EXPERT}.w2.weight", "blocks.{i}.ffn.experts.{e}.proj.weight"),
), fused=(
    *llama_qkv(),
    *fused_linear(_ZOO_EXPERT, (f"{_EXPERT}.w1", f"{_EXPERT}.w3"), ("d_ff", "d_ff")),
))  # fmt: skip
