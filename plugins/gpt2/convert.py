"""The Hugging Face GPT-2 checkpoint layout (``openai-community/gpt2``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.convert import KeyMap, KeyRule, linear_rules, openai_block_rules, openai_represents

_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}


# transformers GPT-2 options that change the computation; zoo refuses rather than ignores them.
_UNSUPPORTED = ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention")


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """``transformers.GPT2Config`` dict -> zoo ``gpt2`` config values."""
    unsupported = [k for k in _UNSUPPORTED if hf.get(k)]
    if unsupported:
        raise ValueError(
            f"GPT-2 checkpoint uses {', '.join(unsupported)}, which zoo's gpt2 does not implement"
        )
    d_model = hf.get("n_embd", 768)
    act = hf.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise ValueError(f"GPT-2 checkpoint uses activation {act!r}, which zoo does not support")
    return {
        "vocab_size": hf.get("vocab_size", 50257),
        "context_length": hf.get("n_positions", 1024),
        "d_model": d_model,
        "n_heads": hf.get("n_head", 12),
        "n_layers": hf.get("n_layer", 12),
        "d_ff": hf.get("n_inner") or 4 * d_model,
        "dropout": hf.get("resid_pdrop", 0.1),
        "activation": _ACTIVATIONS[act],
        "layer_norm_eps": hf.get("layer_norm_epsilon", 1e-5),
        "tie_embeddings": hf.get("tie_word_embeddings", True),
    }


def config_to_hf(config: Any) -> dict[str, Any]:
    """zoo ``gpt2`` config -> ``transformers.GPT2Config`` dict."""
    act = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}[config.activation]
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": config.vocab_size,
        "n_positions": config.context_length,
        "n_embd": config.d_model,
        "n_head": config.n_heads,
        "n_layer": config.n_layers,
        "n_inner": config.d_ff,
        "activation_function": act,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": config.layer_norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": min(50256, config.vocab_size - 1),
        "eos_token_id": min(50256, config.vocab_size - 1),
    }


HF_GPT2 = KeyMap(
    rules=(
        KeyRule("wte.weight", "tok_emb.weight"),
        KeyRule("wpe.weight", "pos_emb.weight"),
        *openai_block_rules(),
        *linear_rules("ln_f", "final_norm"),
        KeyRule("lm_head.weight", "head.weight", optional=True),  # absent when tied
    ),
    ignore_foreign=(r"h\.\d+\.attn\.(bias|masked_bias)",),
    strip_prefixes=("transformer.",),
    config_from_foreign=config_from_hf,
    config_to_foreign=config_to_hf,
    model_type="gpt2",
    represents=openai_represents(norm_first=True, final_norm=True),
)
