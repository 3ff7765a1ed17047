"""The Hugging Face Marian layout (``MarianMTModel``, ``Helsinki-NLP/opus-mt-*``): BART's
layer keys, one ``model.shared`` embedding (or, with ``share_encoder_decoder_embeddings =
false``, the encoder's and the decoder's own), the head tied to the decoder's embedding, and
``final_logits_bias``. The static position table is not stored (transformers recomputes it;
an older checkpoint's copy is ignored)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from zoo.checkpoint.hf_keys import INT
from zoo.checkpoint.hf_layout import KeyMap, KeyRule, represented
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

from .config import MarianConfig

#: What transformers' ``MarianMTModel`` computes that older config.json files still spell:
#: post-LN layers, no final norms, no embedding norm, static positions, no logits bias term
#: of BART's old code.
_CHECKED = {
    "normalize_before": False,
    "add_final_layer_norm": False,
    "normalize_embedding": False,
    "static_position_embeddings": True,
    "add_bias_logits": False,
}


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """``transformers.MarianConfig`` dict (4.x or 5.x) -> zoo ``marian`` config values,
    refusing what zoo's Marian does not compute (each key by name)."""
    r = HFConfigReader(
        hf,
        family="Marian",
        inert=BART_INERT | {"extra_pos_embeddings"},
        types={"decoder_start_token_id": INT},  # transformers' MarianConfig: an int, never null
    )
    for key, value in _CHECKED.items():
        r.expect(key, value)
    values = read_bart_sizes(r)
    vocab = r.integer("vocab_size", 58101, field="vocab_size")
    target = r.get("decoder_vocab_size", None)
    if r.flag("share_encoder_decoder_embeddings", True):
        r.expect("decoder_vocab_size", vocab)  # one vocabulary: the same size, or absent
    else:
        target = r.integer("decoder_vocab_size", vocab, field="vocab_size")
        values["separate_source_embedding"] = True
        values["source_vocab_size"] = None if target == vocab else vocab
        vocab = target
    values["vocab_size"] = vocab
    return r.finish(values, MarianConfig)


def config_to_hf(config: Any) -> dict[str, Any]:
    """zoo ``marian`` config -> ``transformers.MarianConfig`` dict."""
    separate = config.separate_source_embedding
    return {
        "model_type": "marian",
        "architectures": ["MarianMTModel"],
        **write_bart_sizes(config),
        "vocab_size": config.source_vocab if separate else config.vocab_size,
        "decoder_vocab_size": config.vocab_size,
        "share_encoder_decoder_embeddings": not separate,
    }


_SHARED, _DECODER = "model.shared.weight", "model.decoder.embed_tokens.weight"


def _merge(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """On import: the target's embedding under one name (``model.shared``: the decoder's own
    when the source has its own), tied copies folded into it, the logits bias a vector."""
    if config.separate_source_embedding:
        state = dict(state)
        if _DECODER in state:
            state[_SHARED] = state.pop(_DECODER)
    else:
        copies = ("model.encoder.embed_tokens.weight", _DECODER)
        state = fold_tied(state, _SHARED, copies, family="Marian")
    return logits_bias_in(state, config.vocab_size)


def _split(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """On export: the decoder's own embedding where the source has its own, the logits bias
    as transformers stores it. A shared vocabulary with a head of its own is written under
    the encoder's and decoder's names too: transformers 5 ties them to ``model.shared`` only
    with the head, and reads them otherwise."""
    state = logits_bias_out(state)
    if config.separate_source_embedding and _SHARED in state:
        state[_DECODER] = state.pop(_SHARED)
    elif not config.tie_embeddings and _SHARED in state:
        state[_DECODER] = state[_SHARED].clone()
        state["model.encoder.embed_tokens.weight"] = state[_SHARED].clone()
    return state


_RULES, _FUSED = bart_layer_rules()

#: The fields config.json carries (any value); every other field is MarianConfig's default.
_MAPPED = (
    "vocab_size", "context_length", "d_model", "n_heads", "n_encoder_layers",
    "n_decoder_layers", "d_ff", "activation", "scale_embeddings", "tie_embeddings",
    "separate_source_embedding", "source_vocab_size", "decoder_start_id",
)  # fmt: skip

HF_MARIAN = KeyMap(
    rules=(
        *_RULES,
        KeyRule(_SHARED, "tok_emb.weight"),
        KeyRule("model.encoder.embed_tokens.weight", "src_emb.weight", optional=True),
        KeyRule("final_logits_bias", "final_logits_bias"),
        KeyRule("lm_head.weight", "head.weight", optional=True),  # absent when tied
    ),
    fused=_FUSED,
    ignore_foreign=(r"model\.(en|de)coder\.embed_positions\.weight",),
    config_from_foreign=config_from_hf,
    config_to_foreign=config_to_hf,
    model_type="marian",
    merge_foreign=_merge,
    split_foreign=_split,
    represents=represented(MarianConfig, mapped=_MAPPED),
)
