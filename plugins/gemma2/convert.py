"""The Hugging Face Gemma 2 layout (``Gemma2ForCausalLM``): Llama's projections, four norms
per layer, and a ``config.json`` with Gemma 2's defaults (transformers' own when a key is
absent: tied head, 4 KV heads of 256, window 4096, caps 50 and 30, alternating layers)."""

from __future__ import annotations

import math
from typing import Any

from zoo.checkpoint.hf_config import (
    BOOL,
    LLAMA_FIELDS,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    STRING,
    HFConfigFormat,
    HFConfigReader,
    HFField,
)
from zoo.checkpoint.hf_layout import ANY, KeyRule, hf_layout
from zoo.checkpoint.hf_rules import DOWN, GATE_UP, llama_qkv
from zoo.config import LayerType
from zoo.errors import CheckpointError

from .config import ALTERNATING, Gemma2Config

_LAYER = "model.layers.{i}"


def query_pre_attn_scalar(config: Gemma2Config) -> int:
    """The integer ``s`` with ``s ** -0.5`` the config's score scale (transformers' key is an
    integer); a scale no integer gives cannot be exported."""
    scale = config.attn_scale if config.attn_scale is not None else config.head_size**-0.5
    scalar = round(scale**-2)
    if scalar < 1 or not math.isclose(scalar**-0.5, scale, rel_tol=1e-12):
        raise CheckpointError(
            f"attn_scale = {scale!r} is not s ** -0.5 of an integer s: the Hugging Face Gemma "
            "2 and Gemma 3 layouts store the score scale as the integer query_pre_attn_scalar"
        )
    return scalar


#: transformers' Gemma2Config defaults where they differ from Llama's.
GEMMA2_FIELDS = {
    **LLAMA_FIELDS,
    "n_kv_heads": HFField("num_key_value_heads", 4, write=lambda c: c.n_kv_heads or c.n_heads),
    "head_dim": HFField("head_dim", 256, write=lambda c: c.head_size),
    "tie_embeddings": HFField("tie_word_embeddings", True),
    "sliding_window": HFField("sliding_window", 4096),
    "attn_softcap": HFField("attn_logit_softcapping", 50.0),
    "final_softcap": HFField("final_logit_softcapping", 30.0),
    "attn_scale": HFField(
        "query_pre_attn_scalar", 256, read=lambda s: s**-0.5, write=query_pre_attn_scalar
    ),
}


def read_layer_types(r: HFConfigReader) -> dict[str, Any]:
    """``layer_types``; transformers' alternation (sliding, full, sliding...) when absent or
    null, as transformers 4.x computed it (and 5.x writes it)."""
    layers = r.integer("num_hidden_layers")
    written = r.get("layer_types", None, field="layer_types")
    kinds = written if written is not None else [ALTERNATING[i % 2] for i in range(layers)]
    return {"layer_types": tuple(kinds)}


def write_layer_types(config: Gemma2Config) -> dict[str, Any]:
    """One ``layer_types`` entry per layer."""
    kinds: list[LayerType] = [config.layer_type(i) for i in range(config.n_layers)]
    return {"layer_types": kinds}


GEMMA2_CONFIG = HFConfigFormat(
    family="Gemma2",
    model_type="gemma2",
    architecture="Gemma2ForCausalLM",
    config=Gemma2Config,
    fields=GEMMA2_FIELDS,
    fixed={"hidden_activation": "gelu_pytorch_tanh", "attention_bias": False},
    checked={"use_bidirectional_attention": False},
    # transformers' Gemma 2 reads hidden_activation only; cache_implementation is generate's
    inert=frozenset({"hidden_act", "cache_implementation"}),
    types={
        "num_key_value_heads": POSITIVE_INT,
        "head_dim": POSITIVE_INT,
        "query_pre_attn_scalar": POSITIVE_INT,
        "attn_logit_softcapping": POSITIVE_NUMBER.or_null,
        "final_logit_softcapping": POSITIVE_NUMBER.or_null,
        "hidden_activation": STRING,
        "cache_implementation": STRING.or_null,
        "use_bidirectional_attention": BOOL.or_null,
    },
    read_extra=read_layer_types,
    write_extra=write_layer_types,
)


def _norm(foreign: str, zoo: str) -> KeyRule:
    return KeyRule(f"{_LAYER}.{foreign}.weight", f"blocks.{{i}}.{zoo}.weight")


#: The one-to-one keys: embedding, output projection, the four norms, final norm, head.
GEMMA2_RULES = (
    KeyRule("model.embed_tokens.weight", "tok_emb.weight"),
    KeyRule(f"{_LAYER}.self_attn.o_proj.weight", "blocks.{i}.attn.proj.weight"),
    _norm("input_layernorm", "attn_norm"),
    _norm("post_attention_layernorm", "attn_post_norm"),
    _norm("pre_feedforward_layernorm", "ffn_norm"),
    _norm("post_feedforward_layernorm", "ffn_post_norm"),
    KeyRule("model.norm.weight", "final_norm.weight"),
    KeyRule("lm_head.weight", "head.weight", optional=True),  # absent when tied
    DOWN,
)

HF_GEMMA2 = hf_layout(
    GEMMA2_CONFIG,
    GEMMA2_RULES,
    fused=(*llama_qkv(), *GATE_UP),
    layer_types=ANY,
    layer_pattern=ANY,  # written as the whole layer_types list
)
