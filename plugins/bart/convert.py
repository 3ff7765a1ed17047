"""The Hugging Face BART layout (``BartForConditionalGeneration``, ``facebook/bart-*``):
BART's layer keys, one ``model.shared`` embedding tied to the head, each stack's learned
positions (``max_position_embeddings + 2`` rows) and ``layernorm_embedding``, and
``final_logits_bias`` (zeros where a checkpoint lacks it, as transformers loads it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from zoo.checkpoint.hf_layout import KeyMap, KeyRule, linear_rules, represented
from zoo.checkpoint.hf_reader import HFConfigReader
from zoo.checkpoint.hf_seq2seq import (
    BART_INERT,
    bart_layer_rules,
    fold_tied,
    logits_bias_in,
    logits_bias_out,
    read_bart_sizes,
    write_bart_sizes,
)

from .config import BartConfig

#: What transformers' ``BartForConditionalGeneration`` computes that older config.json files
#: still spell: post-LN layers, no final norms, an embedding norm, learned positions from row 2.
_CHECKED = {
    "normalize_before": False,
    "add_final_layer_norm": False,
    "normalize_embedding": True,
    "static_position_embeddings": False,
    "add_bias_logits": False,
    "extra_pos_embeddings": 2,
}


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """``transformers.BartConfig`` dict (4.x or 5.x) -> zoo ``bart`` config values, refusing
    what zoo's BART does not compute (each key by name)."""
    r = HFConfigReader(hf, family="BART", inert=BART_INERT)
    for key, value in _CHECKED.items():
        r.expect(key, value)
    values = read_bart_sizes(r)
    values["vocab_size"] = r.integer("vocab_size", 50265, field="vocab_size")
    return r.finish(values, BartConfig)


def config_to_hf(config: Any) -> dict[str, Any]:
    """zoo ``bart`` config -> ``transformers.BartConfig`` dict."""
    return {
        "model_type": "bart",
        "architectures": ["BartForConditionalGeneration"],
        **write_bart_sizes(config),
        "vocab_size": config.vocab_size,
    }


_SHARED = "model.shared.weight"
_COPIES = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")


def _merge(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """On import: tied copies of the embedding folded into one, the logits bias a vector."""
    state = fold_tied(state, _SHARED, _COPIES, family="BART")
    return logits_bias_in(state, config.vocab_size)


def _split(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """On export: the logits bias as transformers stores it; with a head of its own, the
    embedding under the encoder's and decoder's names too (transformers 5 ties them to
    ``model.shared`` only with the head)."""
    state = logits_bias_out(state)
    if not config.tie_embeddings and _SHARED in state:
        for copy in _COPIES:
            state[copy] = state[_SHARED].clone()
    return state


_RULES, _FUSED = bart_layer_rules()

#: The fields config.json carries (any value); every other field is BartConfig's default.
_MAPPED = (
    "vocab_size", "context_length", "d_model", "n_heads", "n_encoder_layers",
    "n_decoder_layers", "d_ff", "activation", "scale_embeddings", "tie_embeddings",
)  # fmt: skip

HF_BART = KeyMap(
    rules=(
        *_RULES,
        KeyRule(_SHARED, "tok_emb.weight"),
        KeyRule("model.encoder.embed_positions.weight", "src_pos_emb.weight"),
        KeyRule("model.decoder.embed_positions.weight", "pos_emb.weight"),
        *linear_rules("model.encoder.layernorm_embedding", "src_embed_norm"),
        *linear_rules("model.decoder.layernorm_embedding", "tgt_embed_norm"),
        KeyRule("final_logits_bias", "final_logits_bias"),
        KeyRule("lm_head.weight", "head.weight", optional=True),  # absent when tied
    ),
    fused=_FUSED,
    config_from_foreign=config_from_hf,
    config_to_foreign=config_to_hf,
    model_type="bart",
    merge_foreign=_merge,
    split_foreign=_split,
    represents=represented(BartConfig, mapped=_MAPPED),
)
