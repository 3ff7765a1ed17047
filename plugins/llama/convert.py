"""The Hugging Face Llama checkpoint layout (``LlamaForCausalLM``): separate q/k/v and
gate/up projections there, fused ``qkv`` and ``fc`` in zoo."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from zoo.convert import KeyMap, KeyRule
from zoo.hf_config import HFConfigReader

_ATTN, _MLP = "model.layers.{i}.self_attn", "model.layers.{i}.mlp"
_FUSED = {"self_attn.qkv": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up": ("gate_proj", "up_proj")}


def _sizes(config: Any, fused: str) -> list[int]:
    """Rows of each projection fused into ``fused``."""
    if fused == "mlp.gate_up":
        return [config.d_ff, config.d_ff]
    kv = (config.n_kv_heads or config.n_heads) * (config.d_model // config.n_heads)
    return [config.d_model, kv, kv]


def merge(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """Concatenate q/k/v into ``self_attn.qkv`` and gate/up into ``mlp.gate_up``."""
    out = dict(state)
    for i in range(config.n_layers):
        for fused, parts in _FUSED.items():
            owner = f"model.layers.{i}.{fused.split('.')[0]}"
            names = [f"{owner}.{part}.weight" for part in parts]
            if all(name in out for name in names):
                out[f"model.layers.{i}.{fused}.weight"] = torch.cat([out.pop(n) for n in names])
    return out


def split(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """The inverse of :func:`merge`."""
    out = dict(state)
    for i in range(config.n_layers):
        for fused, parts in _FUSED.items():
            owner = f"model.layers.{i}.{fused.split('.')[0]}"
            pieces = out.pop(f"model.layers.{i}.{fused}.weight").split(_sizes(config, fused))
            for part, piece in zip(parts, pieces, strict=True):
                out[f"{owner}.{part}.weight"] = piece
    return out


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """A ``LlamaConfig`` of transformers 4 or 5 as zoo config values (refusing what zoo lacks)."""
    r = HFConfigReader(hf, family="Llama")
    r.expect("hidden_act", "silu")
    r.expect("attention_bias", False)
    r.expect("mlp_bias", False)
    r.expect("is_encoder_decoder", False)
    d_model, n_heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    if n_heads > 0 and d_model % n_heads == 0:
        r.expect("head_dim", d_model // n_heads)  # zoo's heads are d_model / n_heads wide
    return r.finish(
        {
            "vocab_size": r.integer("vocab_size"),
            "context_length": r.integer("max_position_embeddings"),
            "d_model": d_model,
            "n_heads": n_heads,
            "n_kv_heads": r.integer("num_key_value_heads", n_heads),
            "n_layers": r.integer("num_hidden_layers"),
            "d_ff": r.integer("intermediate_size"),
            "layer_norm_eps": r.number("rms_norm_eps", 1e-6),
            "rope_theta": r.rope_theta(),
            "tie_embeddings": r.flag("tie_word_embeddings", False),
        }
    )


def config_to_hf(config: Any) -> dict[str, Any]:
    """The transformers ``config.json`` of a zoo Llama config."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.context_length,
        "hidden_size": config.d_model,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads or config.n_heads,
        "num_hidden_layers": config.n_layers,
        "intermediate_size": config.d_ff,
        "rms_norm_eps": config.layer_norm_eps,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_embeddings,
        "attention_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def _rule(foreign: str, zoo: str, **kwargs: Any) -> KeyRule:
    return KeyRule(f"{foreign}.weight", f"{zoo}.weight", **kwargs)


HF_LLAMA = KeyMap(
    model_type="llama",
    rules=(
        _rule("model.embed_tokens", "tok_emb"),
        _rule("model.layers.{i}.input_layernorm", "blocks.{i}.attn_norm"),
        _rule(f"{_ATTN}.qkv", "blocks.{i}.attn.qkv"),
        _rule(f"{_ATTN}.o_proj", "blocks.{i}.attn.proj"),
        _rule("model.layers.{i}.post_attention_layernorm", "blocks.{i}.ffn_norm"),
        _rule(f"{_MLP}.gate_up", "blocks.{i}.ffn.fc"),
        _rule(f"{_MLP}.down_proj", "blocks.{i}.ffn.proj"),
        _rule("model.norm", "final_norm"),
        _rule("lm_head", "head", optional=True),  # absent when tied to the embedding
    ),
    ignore_foreign=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    merge_foreign=merge,
    split_foreign=split,
    config_from_foreign=config_from_hf,
    config_to_foreign=config_to_hf,
    represents={
        "positions": "rotary", "norm": "rmsnorm", "ffn": "swiglu", "attention": "mha",
        "norm_first": True, "parallel_residual": False, "final_norm": True, "bias": False,
        "qkv_bias": None,
        "rotary_fraction": 1.0,
        "sliding_window": None, "scale_embeddings": False, "head_bias": False,
    },
)  # fmt: skip
