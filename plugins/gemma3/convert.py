"""The Hugging Face Gemma 3 text layout (``Gemma3ForCausalLM``, ``model_type = "gemma3_text"``).

Gemma 2's keys (Llama's projections; ``input_layernorm`` and ``post_attention_layernorm``
around attention, ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm`` around the
MLP) plus each layer's per-head ``q_norm``/``k_norm``, and Gemma 2's ``config.json`` fields.

``config.json`` as transformers 4.50+ and 5 write it: a rotary base per kind of layer
(``rope_theta`` and ``rope_local_base_freq``, or 5's ``rope_parameters: {"full_attention":
{...}, "sliding_attention": {...}}``), the layers' kinds as ``layer_types`` or as older files'
``sliding_window_pattern`` (every n-th layer global), the score scale as
``query_pre_attn_scalar``. Rotary scaling (``rope_scaling``, a ``rope_type`` other than
``"default"``: the 4B and larger models' linear scaling), bidirectional attention and
attention soft-capping (which transformers' Gemma 3 never applies) are refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from zoo.checkpoint.hf_config import (
    POSITIVE_INT,
    POSITIVE_NUMBER,
    HFConfigFormat,
    HFConfigReader,
    HFField,
)
from zoo.checkpoint.hf_layout import ANY, KeyRule, hf_layout
from zoo.checkpoint.hf_rules import GATE_UP, llama_qkv

from ..gemma2.convert import GEMMA2_FIELDS, GEMMA2_RULES
from .config import Gemma3Config, every_sixth_global

_ATTN = "model.layers.{i}.self_attn"
_KINDS = ("full_attention", "sliding_attention")

#: Gemma 2's keys plus each layer's per-head ``q_norm``/``k_norm``.
GEMMA3_RULES = (
    *GEMMA2_RULES,
    KeyRule(f"{_ATTN}.q_norm.weight", "blocks.{i}.attn.q_norm.weight"),
    KeyRule(f"{_ATTN}.k_norm.weight", "blocks.{i}.attn.k_norm.weight"),
)

#: Gemma 2's fields (transformers' Gemma 3 defaults are the same: tied, 4 KV heads of 256,
#: window 4096, query_pre_attn_scalar 256) without the attention cap, the final cap null by
#: default, and the rotary bases read per layer kind (:func:`read_gemma3`).
GEMMA3_FIELDS: Mapping[str, str | HFField] = {
    **{k: v for k, v in GEMMA2_FIELDS.items() if k not in ("attn_softcap", "rope_theta")},
    "final_softcap": HFField("final_logit_softcapping"),
}


def _positive(r: HFConfigReader, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise r._error(f"{name} = {value!r} must be a positive number")
    if not math.isfinite(value):
        raise r._error(f"{name} = {value!r} must be finite")
    return float(value)


def _rope_thetas(r: HFConfigReader) -> dict[str, float]:
    """``rope_theta`` (global layers) and ``rope_local_theta`` (sliding layers), from
    transformers 5's ``rope_parameters`` per layer kind or 4.x's ``rope_theta`` and
    ``rope_local_base_freq`` (both: they must agree). Anything but the default rotary
    embedding is refused, naming the key."""
    scaling = r.get("rope_scaling", None)
    if scaling is not None:
        raise r._error(
            f"rope_scaling = {scaling!r}: zoo implements only the default rotary embedding "
            "(no scaled or extended variants)"
        )
    params = r.get("rope_parameters", {})
    flat = sorted(set(params) - set(_KINDS))
    if flat:
        raise r._error(
            f"rope_parameters has {', '.join(f'{k} = {params[k]!r}' for k in flat)}; Gemma 3 "
            f"reads its rotary parameters per layer kind ({' and '.join(_KINDS)}), and "
            "transformers ignores these (fix the file)"
        )
    return {
        "rope_theta": _kind_theta(r, params, "full_attention", "rope_theta", 1_000_000.0),
        "rope_local_theta": _kind_theta(
            r, params, "sliding_attention", "rope_local_base_freq", 10_000.0
        ),
    }


def _kind_theta(
    r: HFConfigReader, params: Mapping[str, Any], kind: str, top_key: str, default: float
) -> float:
    """The rotary base of the layers of ``kind``: ``rope_parameters.<kind>.rope_theta`` or the
    4.x key ``top_key`` (both: they must agree), else ``default``; read as zoo's field of the
    same meaning (``rope_theta``, ``rope_local_theta``)."""
    field = "rope_theta" if kind == "full_attention" else "rope_local_theta"
    sub = params.get(kind) or {}
    where = f"rope_parameters.{kind}"
    if not isinstance(sub, Mapping):
        raise r._error(f"{where} = {sub!r} must be an object")
    _check_default_rotary(r, where, sub)
    nested = f"{kind}.rope_theta"  # read as rope_parameters.<kind>.rope_theta
    theta = r._both(top_key, {nested: sub.get("rope_theta")}, nested, field=field)
    return default if theta is None else _positive(r, r.keys[field], theta)


def _check_default_rotary(r: HFConfigReader, where: str, sub: Mapping[str, Any]) -> None:
    """Refuse a layer kind's rotary parameters other than the default embedding's."""
    rope_type = sub.get("rope_type", sub.get("type", "default"))
    extra = sorted(set(sub) - {"rope_type", "type", "rope_theta"})
    if rope_type != "default" or extra:
        shown = f"{where}.rope_type = {rope_type!r}" if rope_type != "default" else where
        shown += "".join(f", {where}.{k} = {sub[k]!r}" for k in extra)
        raise r._error(
            f"{shown}: zoo implements only the default rotary embedding (no scaled or "
            "extended variants)"
        )


def _layer_types(r: HFConfigReader) -> tuple[str, ...]:
    """``layer_types``, else transformers' reading of ``sliding_window_pattern`` (default 6:
    every sixth layer global); the pattern is moot when the file lists the layers."""
    r.get("_sliding_window_pattern", None)  # what transformers 5 saves back: never read
    pattern = r.get("sliding_window_pattern", None)
    listed = r.get("layer_types", None, field="layer_types")
    if listed is not None:
        return tuple(listed)
    return every_sixth_global(r.integer("num_hidden_layers"), 6 if pattern is None else pattern)


def read_gemma3(r: HFConfigReader) -> dict[str, Any]:
    """What :data:`GEMMA3_FIELDS` cannot say: the rotary bases and the layer kinds."""
    softcap = r.get("attn_logit_softcapping", None)
    if softcap is not None:
        raise r._error(
            f"attn_logit_softcapping = {softcap!r}: transformers' Gemma 3 never applies it (its "
            "attention passes no cap), so the file is ambiguous; set it to null"
        )
    return {**_rope_thetas(r), "layer_types": _layer_types(r)}


def write_gemma3(config: Gemma3Config) -> dict[str, Any]:
    """The keys :func:`read_gemma3` reads, as transformers 5 writes them."""
    local = config.rope_theta if config.rope_local_theta is None else config.rope_local_theta
    return {
        "attn_logit_softcapping": None,
        "layer_types": [config.layer_type(i) for i in range(config.n_layers)],
        "rope_parameters": {
            "full_attention": {"rope_theta": config.rope_theta, "rope_type": "default"},
            "sliding_attention": {"rope_theta": local, "rope_type": "default"},
        },
    }


GEMMA3_CONFIG = HFConfigFormat(
    family="Gemma 3",
    model_type="gemma3_text",
    architecture="Gemma3ForCausalLM",
    config=Gemma3Config,
    fields=GEMMA3_FIELDS,
    fixed={
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "use_bidirectional_attention": False,
    },
    inert=frozenset({"cache_implementation"}),
    types={
        "num_key_value_heads": POSITIVE_INT,
        "head_dim": POSITIVE_INT,
        "query_pre_attn_scalar": POSITIVE_INT,
        "sliding_window_pattern": POSITIVE_INT,
        "_sliding_window_pattern": POSITIVE_INT,
        "rope_local_base_freq": POSITIVE_NUMBER.or_null,
        "final_logit_softcapping": POSITIVE_NUMBER.or_null,
        "attn_logit_softcapping": POSITIVE_NUMBER.or_null,
    },
    read_extra=read_gemma3,
    write_extra=write_gemma3,
)

HF_GEMMA3 = hf_layout(
    GEMMA3_CONFIG,
    GEMMA3_RULES,
    fused=(*llama_qkv(), *GATE_UP),
    rope_theta=ANY,
    rope_local_theta=ANY,
    layer_types=ANY,
    layer_pattern=ANY,  # written as the whole layer_types list
)
