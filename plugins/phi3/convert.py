"""The Hugging Face Phi-3 layout (``Phi3ForCausalLM``): Llama's keys, with the queries, keys
and values in one ``qkv_proj`` (in zoo's order: zoo's ``attn.qkv`` as it is) and the gate and
up projections in one ``gate_up_proj`` (gate first, as zoo's ``ffn.fc``)."""

from __future__ import annotations

from zoo.checkpoint.hf_config import LLAMA_FIELDS, HFConfigFormat, HFField
from zoo.checkpoint.hf_layout import KeyRule, hf_layout

from .config import Phi3Config

_L = "model.layers.{i}"


def phi3_rules(
    attn_norm: str = "input_layernorm", ffn_norm: str = "post_attention_layernorm"
) -> tuple[KeyRule, ...]:
    """The keys of ``Phi3ForCausalLM``, each norm named by its foreign module (a test swaps
    them to plant a bug the round trip cannot see)."""
    return tuple(KeyRule(f"{foreign}.weight", f"{zoo}.weight", optional=foreign == "lm_head")
                 for foreign, zoo in (
        ("model.embed_tokens", "tok_emb"),
        (f"{_L}.{attn_norm}", "blocks.{i}.attn_norm"),
        (f"{_L}.self_attn.qkv_proj", "blocks.{i}.attn.qkv"),
        (f"{_L}.self_attn.o_proj", "blocks.{i}.attn.proj"),
        (f"{_L}.{ffn_norm}", "blocks.{i}.ffn_norm"),
        (f"{_L}.mlp.gate_up_proj", "blocks.{i}.ffn.fc"),
        (f"{_L}.mlp.down_proj", "blocks.{i}.ffn.proj"),
        ("model.norm", "final_norm"),
        ("lm_head", "head"),  # absent when tied to the embedding
    ))  # fmt: skip


PHI3_CONFIG = HFConfigFormat(
    family="Phi-3",
    model_type="phi3",
    architecture="Phi3ForCausalLM",
    config=Phi3Config,
    fields={
        **LLAMA_FIELDS,
        "layer_norm_eps": HFField("rms_norm_eps", 1e-5),
        "rotary_dim": HFField("partial_rotary_factor", 1.0),
        "sliding_window": HFField("sliding_window", None),  # every layer, as transformers'
    },
    fixed={"hidden_act": "silu"},
    checked={"attention_bias": False},  # the official files say so; Phi3Config lacks it
    # original_max_position_embeddings sizes only the longrope scaling, refused with it
    inert=frozenset({"auto_map", "original_max_position_embeddings"}),
)

HF_PHI3 = hf_layout(PHI3_CONFIG, phi3_rules())
