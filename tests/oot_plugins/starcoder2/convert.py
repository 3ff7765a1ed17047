"""The Hugging Face StarCoder2 layout (``Starcoder2ForCausalLM``): Llama's attention keys,
GPT-2's MLP names (``c_fc``, ``c_proj``, plain ``nn.Linear``), LayerNorms with biases. The
linear layers' biases exist only with ``use_bias: true``: their rules are optional."""

from __future__ import annotations

from zoo.checkpoint.hf_config import HFConfigFormat, HFField
from zoo.checkpoint.hf_layout import FusedRule, KeyRule, hf_layout

from . import Starcoder2Config

_L = "model.layers.{i}"


def _linear(foreign: str, zoo: str) -> tuple[KeyRule, ...]:
    """A linear layer's weight, and its bias when ``use_bias``."""
    return (KeyRule(f"{foreign}.weight", f"{zoo}.weight"),
            KeyRule(f"{foreign}.bias", f"{zoo}.bias", optional=True))  # fmt: skip


def _norm(foreign: str, zoo: str) -> tuple[KeyRule, ...]:
    return tuple(KeyRule(f"{foreign}.{p}", f"{zoo}.{p}") for p in ("weight", "bias"))


STARCODER2_CONFIG = HFConfigFormat(
    family="StarCoder2", model_type="starcoder2", architecture="Starcoder2ForCausalLM",
    config=Starcoder2Config,
    fields={
        "vocab_size": "vocab_size", "context_length": "max_position_embeddings",
        "d_model": "hidden_size", "n_heads": "num_attention_heads",
        "n_kv_heads": HFField("num_key_value_heads", 2, write=lambda c: c.n_kv_heads or c.n_heads),
        "n_layers": "num_hidden_layers", "d_ff": "intermediate_size",
        "layer_norm_eps": HFField("norm_epsilon", 1e-5),
        "rope_theta": HFField("rope_theta", 10000.0),
        "sliding_window": HFField("sliding_window", None),
        "bias": HFField("use_bias", True),
        "tie_embeddings": HFField("tie_word_embeddings", True),
    },
    fixed={"hidden_act": "gelu_pytorch_tanh"},
    inert=frozenset({"residual_dropout", "embedding_dropout"}),
)  # fmt: skip

_QKV = tuple(f"{_L}.self_attn.{p}_proj" for p in "qkv")

HF_STARCODER2 = hf_layout(STARCODER2_CONFIG, (
    KeyRule("model.embed_tokens.weight", "tok_emb.weight"),
    *_norm(f"{_L}.input_layernorm", "blocks.{i}.attn_norm"),
    *_linear(f"{_L}.self_attn.o_proj", "blocks.{i}.attn.proj"),
    *_norm(f"{_L}.post_attention_layernorm", "blocks.{i}.ffn_norm"),
    *_linear(f"{_L}.mlp.c_fc", "blocks.{i}.ffn.fc"),
    *_linear(f"{_L}.mlp.c_proj", "blocks.{i}.ffn.proj"),
    *_norm("model.norm", "final_norm"),
    KeyRule("lm_head.weight", "head.weight", optional=True),  # absent when tied
), fused=(
    FusedRule("blocks.{i}.attn.qkv.weight", tuple(f"{p}.weight" for p in _QKV), ("q", "kv", "kv")),
    FusedRule("blocks.{i}.attn.qkv.bias", tuple(f"{p}.bias" for p in _QKV), ("q", "kv", "kv"),
              optional=True),
))  # fmt: skip
