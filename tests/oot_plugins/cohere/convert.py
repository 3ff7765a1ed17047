"""The Hugging Face Cohere layout (``CohereForCausalLM``): Llama's key names with one
``input_layernorm`` per layer (no ``post_attention_layernorm``), and rotary pairs of adjacent
features, reordered as GPT-J's are (:func:`oot_plugins.gptj.convert.interleaved_rotary`)."""

from __future__ import annotations

from zoo.checkpoint.hf_config import HFConfigFormat, HFField
from zoo.checkpoint.hf_layout import KeyRule, fused_linear, hf_layout

from ..gptj.convert import interleaved_rotary
from . import CohereConfig

_L = "model.layers.{i}"

COHERE_CONFIG = HFConfigFormat(
    family="Cohere", model_type="cohere", architecture="CohereForCausalLM", config=CohereConfig,
    fields={
        "vocab_size": "vocab_size", "context_length": "max_position_embeddings",
        "d_model": "hidden_size", "n_heads": "num_attention_heads",
        "n_kv_heads": HFField("num_key_value_heads", write=lambda c: c.n_kv_heads or c.n_heads),
        "n_layers": "num_hidden_layers", "d_ff": "intermediate_size",
        "layer_norm_eps": HFField("layer_norm_eps", 1e-5),
        "rope_theta": HFField("rope_theta", 500000.0),
        "logit_scale": HFField("logit_scale", 0.0625),
        "tie_embeddings": HFField("tie_word_embeddings", True),
    },
    fixed={"hidden_act": "silu", "attention_bias": False, "use_qk_norm": False},
)  # fmt: skip

MERGE, SPLIT = interleaved_rotary(r"model\.layers\.\d+\.self_attn\.[qk]_proj\.weight")


def _w(foreign: str, zoo: str, *, optional: bool = False) -> KeyRule:
    return KeyRule(f"{foreign}.weight", f"{zoo}.weight", optional=optional)


HF_COHERE = hf_layout(COHERE_CONFIG, (
    _w("model.embed_tokens", "tok_emb"),
    _w(f"{_L}.input_layernorm", "blocks.{i}.norm"),
    _w(f"{_L}.self_attn.o_proj", "blocks.{i}.attn.proj"),
    _w(f"{_L}.mlp.down_proj", "blocks.{i}.ffn.proj"),
    _w("model.norm", "final_norm"),
    _w("lm_head", "head", optional=True),  # absent when tied to the embedding
), fused=(
    *fused_linear("blocks.{i}.attn.qkv", tuple(f"{_L}.self_attn.{p}_proj" for p in "qkv"),
                  ("q", "kv", "kv")),
    *fused_linear("blocks.{i}.ffn.fc", (f"{_L}.mlp.gate_proj", f"{_L}.mlp.up_proj"),
                  ("d_ff", "d_ff")),
), merge_foreign=MERGE, split_foreign=SPLIT)  # fmt: skip
