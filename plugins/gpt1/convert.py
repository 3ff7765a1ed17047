"""The Hugging Face GPT-1 checkpoint layout (``openai-community/openai-gpt``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.checkpoint.hf_config import HFConfigReader
from zoo.checkpoint.hf_layout import KeyMap, KeyRule, openai_block_rules, openai_represents

from .config import GPT1Config

# transformers' OpenAI GPT maps afn "gelu" to the tanh approximation (as the original GPT-1
# code did), so zoo's gpt1 uses gelu_tanh.
_ACTIVATIONS = {"gelu": "gelu_tanh", "relu": "relu"}


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """``transformers.OpenAIGPTConfig`` dict -> zoo ``gpt1`` config values (refusing what
    zoo's gpt1 does not compute)."""
    r = HFConfigReader(hf, family="GPT-1", inert=frozenset({"predict_special_tokens"}))
    act = r.get("afn", "gelu")
    r.expect("afn", *_ACTIVATIONS)
    r.expect("n_special", 0)  # old files: extra embedding rows the vocabulary leaves out
    r.expect("is_encoder_decoder", False)
    d_model = r.integer("n_embd", 768, field="d_model")
    return r.finish(
        {
            "vocab_size": r.integer("vocab_size", 40478, field="vocab_size"),
            "context_length": r.integer("n_positions", 512, field="context_length"),
            "d_model": d_model,
            "n_heads": r.integer("n_head", 12, field="n_heads"),
            "n_layers": r.integer("n_layer", 12, field="n_layers"),
            "d_ff": 4 * d_model,
            "dropout": r.number("resid_pdrop", 0.1, field="dropout"),
            "activation": _ACTIVATIONS[act],
            "layer_norm_eps": r.number("layer_norm_epsilon", 1e-5, field="layer_norm_eps"),
            "tie_embeddings": r.flag("tie_word_embeddings", True, field="tie_embeddings"),
        },
        GPT1Config,
    )


def config_to_hf(config: Any) -> dict[str, Any]:
    """zoo ``gpt1`` config -> ``transformers.OpenAIGPTConfig`` dict."""
    inverse = {zoo: hf for hf, zoo in _ACTIVATIONS.items()}
    if config.d_ff != 4 * config.d_model or config.activation not in inverse:
        raise ValueError(
            "the Hugging Face GPT-1 layout needs d_ff = 4 * d_model and a gelu_tanh or relu "
            f"activation; this model has d_ff={config.d_ff}, activation={config.activation!r}"
        )
    return {
        "model_type": "openai-gpt",
        "architectures": ["OpenAIGPTLMHeadModel"],
        "vocab_size": config.vocab_size,
        "n_positions": config.context_length,
        "n_embd": config.d_model,
        "n_head": config.n_heads,
        "n_layer": config.n_layers,
        "afn": inverse[config.activation],
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": config.layer_norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
    }


HF_OPENAI_GPT = KeyMap(
    rules=(
        KeyRule("tokens_embed.weight", "tok_emb.weight"),
        KeyRule("positions_embed.weight", "pos_emb.weight"),
        *openai_block_rules(),
        KeyRule("lm_head.weight", "head.weight", optional=True),  # absent when tied
    ),
    ignore_foreign=(r"h\.\d+\.attn\.bias",),
    strip_prefixes=("transformer.",),
    config_from_foreign=config_from_hf,
    config_to_foreign=config_to_hf,
    model_type="openai-gpt",
    represents=openai_represents(norm_first=False, final_norm=False),
)
