"""The Hugging Face GPT-2 checkpoint layout (``openai-community/gpt2``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.checkpoint.hf_config import HFConfigReader
from zoo.checkpoint.hf_layout import (
    KeyMap,
    KeyRule,
    linear_rules,
    openai_block_rules,
    openai_represents,
)

from .config import GPT2Config

_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """``transformers.GPT2Config`` dict -> zoo ``gpt2`` config values (refusing what zoo's
    gpt2 does not compute)."""
    r = HFConfigReader(hf, family="GPT-2")
    for option in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
                   "add_cross_attention", "is_encoder_decoder"):  # fmt: skip
        r.expect(option, False)
    r.expect("scale_attn_weights", True)
    act = r.get("activation_function", "gelu_new")
    r.expect("activation_function", *_ACTIVATIONS)
    d_model = r.integer("n_embd", 768, field="d_model")
    return r.finish(
        {
            "vocab_size": r.integer("vocab_size", 50257, field="vocab_size"),
            "context_length": r.integer("n_positions", 1024, field="context_length"),
            "d_model": d_model,
            "n_heads": r.integer("n_head", 12, field="n_heads"),
            "n_layers": r.integer("n_layer", 12, field="n_layers"),
            "d_ff": r.integer("n_inner", 4 * d_model, field="d_ff"),
            "dropout": r.number("resid_pdrop", 0.1, field="dropout"),
            "activation": _ACTIVATIONS[act],
            "layer_norm_eps": r.number("layer_norm_epsilon", 1e-5, field="layer_norm_eps"),
            "tie_embeddings": r.flag("tie_word_embeddings", True, field="tie_embeddings"),
        },
        GPT2Config,
    )


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
