"""The Hugging Face T5 layout (``T5ForConditionalGeneration``: ``google-t5/t5-*`` v1.0 and
``google/t5-v1_1-*``, ``google/flan-t5-*``): ``shared`` embedding, each stack's blocks of
layers (``layer.0`` self-attention, ``layer.1`` cross-attention in the decoder, then the
feed-forward), the relative bias in each stack's first block, final norms, and an
``lm_head`` of its own in v1.1."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from zoo.checkpoint.hf_layout import FusedRule, KeyMap, KeyRule, represented
from zoo.checkpoint.hf_reader import HFConfigReader
from zoo.checkpoint.hf_seq2seq import decoder_start_id, decoder_start_json, fold_tied

from .config import T5Config

#: ``feed_forward_proj`` -> zoo's ``(ffn, activation)``, as transformers' T5Config reads it:
#: ``gated-gelu`` is the tanh GELU (``gelu_new``), a plain ``gelu`` the erf one.
_FFN = {
    "relu": ("mlp", "relu"),
    "gelu": ("mlp", "gelu"),
    "gelu_new": ("mlp", "gelu_tanh"),
    "silu": ("mlp", "silu"),
    "gated-gelu": ("geglu", "gelu_tanh"),
    "gated-gelu_new": ("geglu", "gelu_tanh"),
    "gated-silu": ("swiglu", "silu"),
}
_WRITTEN = {
    ("mlp", "relu"): "relu",
    ("mlp", "gelu"): "gelu",
    ("mlp", "gelu_tanh"): "gelu_new",
    ("mlp", "silu"): "silu",
    ("geglu", "gelu_tanh"): "gated-gelu",
    ("swiglu", "silu"): "gated-silu",
}
#: What transformers derives from ``feed_forward_proj`` and writes too (5.x).
_DERIVED = {
    "relu": ("relu", False),
    "gelu": ("gelu", False),
    "gelu_new": ("gelu_new", False),
    "silu": ("silu", False),
    "gated-gelu": ("gelu_new", True),
    "gated-gelu_new": ("gelu_new", True),
    "gated-silu": ("silu", True),
}

#: Keys of T5's config.json that change no forward pass.
_INERT = frozenset({"initializer_factor", "classifier_dropout", "output_past", "dropout_rate"})


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """``transformers.T5Config`` dict (4.x or 5.x) -> zoo ``t5`` config values, refusing
    what zoo's T5 does not compute (each key by name). The head's input is scaled as
    ``scale_decoder_outputs`` says (5.x), else when ``tie_word_embeddings`` (4.x); the head is
    tied as ``tie_word_embeddings`` says, until the weights say otherwise
    (:func:`tie_as_the_weights_say`)."""
    r = HFConfigReader(hf, family="T5", inert=_INERT)
    r.expect("is_encoder_decoder", True)
    r.expect("is_decoder", False)
    proj = r.get("feed_forward_proj", "relu")
    r.expect("feed_forward_proj", *_FFN)
    act, gated = _DERIVED[proj]
    r.expect("dense_act_fn", act)
    r.expect("is_gated_act", gated)
    ffn, activation = _FFN[proj]
    d_model = r.integer("d_model", 512, field="d_model")
    heads = r.integer("num_heads", 8, field="n_heads")
    d_kv = r.integer("d_kv", 64, field="head_dim")
    layers = r.integer("num_layers", 6, field="n_encoder_layers")
    tie = r.flag("tie_word_embeddings", True, field="tie_embeddings")
    # 4.x scales the head's input exactly when it ties it; 5.x says so on its own
    scale = r.flag("scale_decoder_outputs", tie, field="scale_decoder_output")
    values = {
        "vocab_size": r.integer("vocab_size", 32128, field="vocab_size"),
        "context_length": r.integer("n_positions", 512, field="context_length"),
        "d_model": d_model,
        "n_heads": heads,
        "head_dim": None if d_kv * heads == d_model else d_kv,
        "d_ff": r.integer("d_ff", 2048, field="d_ff"),
        "n_encoder_layers": layers,
        "n_decoder_layers": r.integer("num_decoder_layers", layers, field="n_decoder_layers"),
        "ffn": ffn,
        "activation": activation,
        "layer_norm_eps": r.number("layer_norm_epsilon", 1e-6, field="layer_norm_eps"),
        "dropout": r.number("dropout_rate", 0.1, field="dropout"),
        "tie_embeddings": tie,
        "scale_decoder_output": scale,
        "relative_attention_num_buckets": r.integer(
            "relative_attention_num_buckets", 32, field="relative_attention_num_buckets"
        ),
        "relative_attention_max_distance": r.integer(
            "relative_attention_max_distance", 128, field="relative_attention_max_distance"
        ),
        "decoder_start_id": decoder_start_id(r, default=0),
    }
    return r.finish(values, T5Config)


def config_to_hf(config: Any) -> dict[str, Any]:
    """zoo ``t5`` config -> ``transformers.T5Config`` dict."""
    proj = _WRITTEN.get((config.ffn, config.activation))
    if proj is None:
        raise ValueError(
            f"T5's feed_forward_proj cannot say ffn = {config.ffn!r} with activation = "
            f"{config.activation!r} (a gated GELU is the tanh one: activation = 'gelu_tanh')"
        )
    return {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "vocab_size": config.vocab_size,
        "n_positions": config.context_length,
        "d_model": config.d_model,
        "d_kv": config.head_size,
        "d_ff": config.d_ff,
        "num_layers": config.n_encoder_layers,
        "num_decoder_layers": config.n_decoder_layers,
        "num_heads": config.n_heads,
        "feed_forward_proj": proj,
        "layer_norm_epsilon": config.layer_norm_eps,
        "dropout_rate": config.dropout,
        "tie_word_embeddings": config.tie_embeddings,
        "scale_decoder_outputs": config.scale_decoder_output,
        "relative_attention_num_buckets": config.relative_attention_num_buckets,
        "relative_attention_max_distance": config.relative_attention_max_distance,
        "is_encoder_decoder": True,
        **decoder_start_json(config),
    }


def tie_as_the_weights_say(config: Any, state: Mapping[str, Tensor]) -> Any:
    """``config`` with the head tied exactly when the checkpoint holds no head of its own
    (``lm_head.weight`` absent, or equal to ``shared.weight``), as transformers 5 ties it:
    5.x writes ``tie_word_embeddings: true`` for every T5, a Flan-T5 it saved included, and a
    4.x file without a head is tied whatever it says."""
    head, shared = state.get("lm_head.weight"), state.get("shared.weight")
    own = head is not None and not (
        shared is not None and head.shape == shared.shape and torch.equal(head, shared)
    )
    return config if config.tie_embeddings != own else config.replace(tie_embeddings=not own)


_GATES = re.compile(r"(.*\.DenseReluDense\.)wi_0\.weight")
_GATED = ("geglu", "swiglu")


def _merge(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """On import: tied copies folded into ``shared`` (a head that differs from it under a
    config that ties them refused, saying what to fix), a gated feed-forward's ``wi_0`` (the
    gate) and ``wi_1`` (up) into one ``wi``, as zoo fuses them."""
    copies = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
    state = fold_tied(state, "shared.weight", copies, family="T5")
    head = state.get("lm_head.weight")
    if config.tie_embeddings and head is not None and "shared.weight" in state:
        # checked here to say what to fix (the tied head stays: loading folds it)
        fix = "a head of its own (T5 v1.1, Flan-T5) needs tie_word_embeddings: false"
        both = {"shared.weight": state["shared.weight"], "lm_head.weight": head}
        fold_tied(both, "shared.weight", ("lm_head.weight",), family="T5", fix=fix)
    for key in [k for k in state if _GATES.fullmatch(k)]:
        stem = key.removesuffix("wi_0.weight")
        if f"{stem}wi_1.weight" in state:
            gate, up = state.pop(key), state.pop(f"{stem}wi_1.weight")
            state[f"{stem}wi.weight"] = torch.cat([gate, up])
    return state


def _split(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """On export: a gated feed-forward's ``wi`` as ``wi_0`` (the gate) and ``wi_1``."""
    if config.ffn in _GATED:
        for key in [k for k in state if k.endswith(".DenseReluDense.wi.weight")]:
            stem = key.removesuffix("wi.weight")
            gate, up = state.pop(key).chunk(2)
            state[f"{stem}wi_0.weight"], state[f"{stem}wi_1.weight"] = gate, up
    return state


def _rule(foreign: str, zoo: str, **kwargs: bool) -> KeyRule:
    return KeyRule(f"{foreign}.weight", f"{zoo}.weight", **kwargs)


def _layer_rules() -> tuple[tuple[KeyRule, ...], tuple[FusedRule, ...]]:
    """The blocks' keys: the encoder's index ``{i}``, the decoder's ``{j}``."""
    enc, dec = "encoder.block.{i}.layer", "decoder.block.{j}.layer"
    rules = (
        _rule(f"{enc}.0.SelfAttention.o", "encoder.{i}.attn.proj"),
        _rule(f"{enc}.0.layer_norm", "encoder.{i}.attn_norm"),
        _rule(f"{enc}.1.DenseReluDense.wi", "encoder.{i}.ffn.fc"),
        _rule(f"{enc}.1.DenseReluDense.wo", "encoder.{i}.ffn.proj"),
        _rule(f"{enc}.1.layer_norm", "encoder.{i}.ffn_norm"),
        _rule(f"{dec}.0.SelfAttention.o", "decoder.{j}.attn.proj"),
        _rule(f"{dec}.0.layer_norm", "decoder.{j}.attn_norm"),
        _rule(f"{dec}.1.EncDecAttention.q", "decoder.{j}.cross_attn.q"),
        _rule(f"{dec}.1.EncDecAttention.o", "decoder.{j}.cross_attn.proj"),
        _rule(f"{dec}.1.layer_norm", "decoder.{j}.cross_norm"),
        _rule(f"{dec}.2.DenseReluDense.wi", "decoder.{j}.ffn.fc"),
        _rule(f"{dec}.2.DenseReluDense.wo", "decoder.{j}.ffn.proj"),
        _rule(f"{dec}.2.layer_norm", "decoder.{j}.ffn_norm"),
    )
    fused = (
        FusedRule(
            "encoder.{i}.attn.qkv.weight",
            tuple(f"{enc}.0.SelfAttention.{p}.weight" for p in "qkv"),
            ("q", "kv", "kv"),
        ),
        FusedRule(
            "decoder.{j}.attn.qkv.weight",
            tuple(f"{dec}.0.SelfAttention.{p}.weight" for p in "qkv"),
            ("q", "kv", "kv"),
        ),
        FusedRule(
            "decoder.{j}.cross_attn.kv.weight",
            tuple(f"{dec}.1.EncDecAttention.{p}.weight" for p in "kv"),
            ("kv", "kv"),
        ),
    )
    return rules, fused


_RULES, _FUSED = _layer_rules()

#: The fields config.json carries (any value); every other field is T5Config's default.
_MAPPED = (
    "vocab_size", "context_length", "d_model", "n_heads", "head_dim", "d_ff",
    "n_encoder_layers", "n_decoder_layers", "ffn", "activation", "layer_norm_eps",
    "tie_embeddings", "scale_decoder_output", "relative_attention_num_buckets",
    "relative_attention_max_distance", "decoder_start_id",
)  # fmt: skip

_BIAS = "block.0.layer.0.SelfAttention.relative_attention_bias"

HF_T5 = KeyMap(
    rules=(
        *_RULES,
        _rule("shared", "tok_emb"),
        _rule(f"encoder.{_BIAS}", "src_pos_emb"),
        _rule(f"decoder.{_BIAS}", "pos_emb"),
        _rule("encoder.final_layer_norm", "encoder_norm"),
        _rule("decoder.final_layer_norm", "decoder_norm"),
        _rule("lm_head", "head", optional=True),  # absent when tied
    ),
    fused=_FUSED,
    # a bias no cross-attention reads (transformers ignores it on load too)
    ignore_foreign=(
        r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight",
    ),
    config_from_foreign=config_from_hf,
    config_to_foreign=config_to_hf,
    config_from_weights=tie_as_the_weights_say,
    model_type="t5",
    merge_foreign=_merge,
    split_foreign=_split,
    represents=represented(T5Config, mapped=_MAPPED),
)
