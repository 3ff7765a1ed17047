"""What the Hugging Face encoder-decoder layouts share (Marian, BART, T5): BART's layer keys,
which Marian and mBART keep; embeddings one model ties but a checkpoint may store under several
names; the logits bias stored as a ``(1, vocab)`` row. A family's layout (its plugin's
``convert.py``) takes them from here::

    rules, fused = bart_layer_rules()
    HF_MARIAN = KeyMap(rules=(*rules, ...), fused=fused, merge_foreign=..., ...)

zoo's encoder-decoder (``zoo_plugins.transformer_encdec``) names its layers ``encoder.{i}``
and ``decoder.{i}``: self-attention ``attn`` (one fused ``qkv``), cross-attention
``cross_attn`` (``q``, and ``kv`` fused), ``ffn`` (``fc``, ``proj``) and the norms
``attn_norm``, ``cross_norm``, ``ffn_norm``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ..errors import CheckpointError
from .hf_layout import FusedRule, KeyMap, KeyRule, fused_linear, linear_rules, represented
from .hf_reader import HFConfigReader

__all__ = [
    "ACTIVATIONS",
    "BART_INERT",
    "bart_layer_rules",
    "bart_layout",
    "decoder_start_id",
    "fold_tied",
    "logits_bias_in",
    "logits_bias_out",
    "read_bart_sizes",
    "write_bart_sizes",
]

#: transformers' ``activation_function`` names zoo computes, as zoo's ``activation``
#: (``ACT2FN``: ``gelu`` is the exact erf GELU, ``gelu_new`` the tanh one, ``swish`` SiLU).
ACTIVATIONS: Mapping[str, str] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "swish": "silu",
    "silu": "silu",
}

#: zoo's ``activation`` as the BART family's ``config.json`` spells it.
_WRITTEN = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "swish"}

#: Keys of the BART family's ``config.json`` (Marian, mBART) that change no forward pass:
#: training-time dropouts and layer drops, initialisation, classification heads, and keys
#: of older transformers that only generation or training read.
BART_INERT = frozenset(
    {
        "activation_dropout", "encoder_layerdrop", "decoder_layerdrop", "init_std",
        "classifier_dropout", "classif_dropout", "_num_labels", "output_past",
        "force_bos_token_to_be_generated",
    }
)  # fmt: skip


def bart_layer_rules(prefix: str = "model.") -> tuple[tuple[KeyRule, ...], tuple[FusedRule, ...]]:
    """The key rules of ``BartForConditionalGeneration``'s layers (``MarianMTModel`` and
    ``MBartForConditionalGeneration`` keep them): one-to-one rules, and q/k/v (cross-attention:
    k/v) fused into zoo's ``qkv`` (``kv``); every projection has a bias. ``prefix``: what
    precedes ``encoder.layers`` in the checkpoint. The encoder's layer index is ``{i}``, the
    decoder's ``{j}`` (the stacks' depths differ: an export wants each stack's own)."""
    enc, dec = f"{prefix}encoder.layers.{{i}}", f"{prefix}decoder.layers.{{j}}"
    rules: list[KeyRule] = []
    fused: list[FusedRule] = []
    for foreign, zoo in ((enc, "encoder.{i}"), (dec, "decoder.{j}")):
        rules += [
            *linear_rules(f"{foreign}.self_attn.out_proj", f"{zoo}.attn.proj"),
            *linear_rules(f"{foreign}.self_attn_layer_norm", f"{zoo}.attn_norm"),
            *linear_rules(f"{foreign}.fc1", f"{zoo}.ffn.fc"),
            *linear_rules(f"{foreign}.fc2", f"{zoo}.ffn.proj"),
            *linear_rules(f"{foreign}.final_layer_norm", f"{zoo}.ffn_norm"),
        ]
        qkv = tuple(f"{foreign}.self_attn.{p}_proj" for p in "qkv")
        fused += fused_linear(f"{zoo}.attn.qkv", qkv, ("q", "kv", "kv"), bias=True)
    rules += [
        *linear_rules(f"{dec}.encoder_attn.q_proj", "decoder.{j}.cross_attn.q"),
        *linear_rules(f"{dec}.encoder_attn.out_proj", "decoder.{j}.cross_attn.proj"),
        *linear_rules(f"{dec}.encoder_attn_layer_norm", "decoder.{j}.cross_norm"),
    ]
    kv = (f"{dec}.encoder_attn.k_proj", f"{dec}.encoder_attn.v_proj")
    fused += fused_linear("decoder.{j}.cross_attn.kv", kv, ("kv", "kv"), bias=True)
    return tuple(rules), tuple(fused)


def fold_tied(
    state: Mapping[str, Tensor],
    canonical: str,
    aliases: tuple[str, ...],
    *,
    family: str,
    fix: str = "fix config.json to say they are separate, or remove the stale copy",
) -> dict[str, Tensor]:
    """``state`` with the ``aliases`` of a tied tensor folded into ``canonical`` (older
    transformers saved a tied embedding under every name; newer ones once): the first present
    becomes ``canonical`` when it is absent; one whose values differ is refused, naming both
    (the model ties them, so it could not hold both) and saying how to ``fix`` it."""
    out = dict(state)
    for alias in aliases:
        tensor = out.pop(alias, None)
        if tensor is None:
            continue
        kept = out.get(canonical)
        if kept is None:
            out[canonical] = tensor
        elif kept.shape != tensor.shape or not torch.equal(kept, tensor):
            raise CheckpointError(
                f"{family} checkpoint: {alias} differs from {canonical}, but its config.json "
                f"ties them (one tensor in the model); {fix}"
            )
    return out


def logits_bias_in(state: Mapping[str, Tensor], vocab_size: int) -> dict[str, Tensor]:
    """``final_logits_bias`` as zoo holds it, ``(vocab,)`` from the checkpoint's ``(1, vocab)``;
    zeros where the checkpoint has none (transformers' BART and Marian start it at zero and
    load checkpoints without it)."""
    out = dict(state)
    bias = out.get("final_logits_bias")
    if bias is None:  # in the checkpoint's dtype: one dtype for every weight
        dtype = next((t.dtype for t in out.values() if t.is_floating_point()), torch.float32)
        out["final_logits_bias"] = torch.zeros(vocab_size, dtype=dtype)
    elif bias.ndim == 2 and bias.shape[0] == 1:
        out["final_logits_bias"] = bias[0]
    return out


def logits_bias_out(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``final_logits_bias`` as transformers stores it, a ``(1, vocab)`` row."""
    out = dict(state)
    if "final_logits_bias" in out:
        out["final_logits_bias"] = out["final_logits_bias"][None]
    return out


def _same(r: HFConfigReader, key: str, other: str, default: int) -> int:
    """``key``, which zoo's one size for both stacks requires to equal ``other``."""
    value, twin = r.integer(key, default), r.integer(other, default)
    if value != twin:
        raise r._error(
            f"{key} = {value} but {other} = {twin}: zoo's encoder-decoder has one size for "
            "both stacks, so it refuses rather than load a different model"
        )
    return value


def read_bart_sizes(r: HFConfigReader) -> dict[str, Any]:
    """The sizes and activation of a BART-family ``config.json`` (Marian, mBART; both
    transformers generations), as zoo's encoder-decoder fields; the defaults are
    transformers' ``BartConfig``'s (``MarianConfig`` has the same). Head counts and
    feed-forward widths must be equal in both stacks; 4.x's ``num_hidden_layers`` must be
    ``encoder_layers``."""
    act = r.get("activation_function", "gelu")
    r.expect("activation_function", *ACTIVATIONS)
    r.expect("is_encoder_decoder", True)
    r.expect("is_decoder", False)
    encoder_layers = r.integer("encoder_layers", 12, field="n_encoder_layers")
    r.expect("num_hidden_layers", encoder_layers)
    return {
        "d_model": r.integer("d_model", 1024, field="d_model"),
        "n_heads": _same(r, "encoder_attention_heads", "decoder_attention_heads", 16),
        "d_ff": _same(r, "encoder_ffn_dim", "decoder_ffn_dim", 4096),
        "n_encoder_layers": encoder_layers,
        "n_decoder_layers": r.integer("decoder_layers", 12, field="n_decoder_layers"),
        "context_length": r.integer("max_position_embeddings", 1024, field="context_length"),
        "dropout": r.number("dropout", 0.1, field="dropout"),
        "activation": ACTIVATIONS[act],
        "scale_embeddings": r.flag("scale_embedding", False, field="scale_embeddings"),
        "tie_embeddings": r.flag("tie_word_embeddings", True, field="tie_embeddings"),
        "decoder_start_id": decoder_start_id(r),
    }


def decoder_start_id(r: HFConfigReader, default: int | None = None) -> int | None:
    """``decoder_start_token_id`` of a ``config.json`` as zoo's ``decoder_start_id``;
    ``default`` (the family's transformers default, which transformers 5 leaves out of the
    file) where absent or null."""
    value = r.get("decoder_start_token_id", None, field="decoder_start_id")
    if value is None:
        return default
    return r.integer("decoder_start_token_id", field="decoder_start_id")


def write_bart_sizes(config: Any) -> dict[str, Any]:
    """:func:`read_bart_sizes`' keys of a zoo encoder-decoder config."""
    return {
        "d_model": config.d_model,
        "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "encoder_layers": config.n_encoder_layers,
        "decoder_layers": config.n_decoder_layers,
        "max_position_embeddings": config.context_length,
        "dropout": config.dropout,
        "activation_function": _WRITTEN[config.activation],
        "scale_embedding": config.scale_embeddings,
        "tie_word_embeddings": config.tie_embeddings,
        "is_encoder_decoder": True,
        **decoder_start_json(config),
    }


def decoder_start_json(config: Any) -> dict[str, int]:
    """``decoder_start_token_id`` for a ``config.json`` where the zoo config names one
    (transformers wants an integer there, or no key)."""
    start = config.decoder_start_id
    return {} if start is None else {"decoder_start_token_id": start}


#: The fields a BART-family config.json carries (any value in an export).
_BART_MAPPED = (
    "vocab_size", "context_length", "d_model", "n_heads", "n_encoder_layers",
    "n_decoder_layers", "d_ff", "activation", "scale_embeddings", "tie_embeddings",
    "decoder_start_id",
)  # fmt: skip

_SHARED = "model.shared.weight"
_COPIES = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")


def bart_layout(
    config: type,
    *,
    family: str,
    model_type: str,
    architecture: str,
    checked: Mapping[str, Any],
    final_norms: bool = False,
) -> KeyMap:
    """The layout of a BART-family ``...ForConditionalGeneration`` (BART, mBART): BART's
    layer keys, one ``model.shared`` embedding tied to the head (copies under the encoder's and
    decoder's names folded into it), each stack's learned positions and
    ``layernorm_embedding``, ``final_logits_bias`` (zeros where a checkpoint lacks it, as
    transformers loads it) and, with ``final_norms``, each stack's ``layer_norm`` (mBART).
    ``config.json`` is read by :func:`read_bart_sizes` plus ``vocab_size``; the ``checked``
    keys of older transformers must hold what this family computes (or be absent).

    Args:
        config: the family's zoo config class.
        family: its name in messages (``"BART"``).
        model_type, architecture: its ``config.json``'s ``model_type`` and class.
        checked: ``{key: value}`` that must hold, read and not written.
        final_norms: each stack ends with a norm (``model.encoder.layer_norm``).
    """

    def read(hf: Mapping[str, Any]) -> dict[str, Any]:
        r = HFConfigReader(hf, family=family, inert=BART_INERT)
        for key, value in checked.items():
            r.expect(key, value)
        values = read_bart_sizes(r)
        values["vocab_size"] = r.integer("vocab_size", 50265, field="vocab_size")
        # the family's own default (BART: its end of text)
        start = getattr(config, "decoder_start_id", None)  # a dataclass default: a class attribute
        values["decoder_start_id"] = decoder_start_id(r, default=start)
        return r.finish(values, config)

    def write(zoo_config: Any) -> dict[str, Any]:
        return {
            "model_type": model_type,
            "architectures": [architecture],
            **write_bart_sizes(zoo_config),
            "vocab_size": zoo_config.vocab_size,
        }

    def merge(state: dict[str, Tensor], zoo_config: Any) -> dict[str, Tensor]:
        state = fold_tied(state, _SHARED, _COPIES, family=family)
        return logits_bias_in(state, zoo_config.vocab_size)

    def split(state: dict[str, Tensor], zoo_config: Any) -> dict[str, Tensor]:
        # a head of its own: the embedding under the encoder's and decoder's names too
        # (transformers 5 ties them to model.shared only with the head)
        state = logits_bias_out(state)
        if not zoo_config.tie_embeddings and _SHARED in state:
            for copy in _COPIES:
                state[copy] = state[_SHARED].clone()
        return state

    rules, fused = bart_layer_rules()
    norms = (
        (*linear_rules("model.encoder.layer_norm", "encoder_norm"),
         *linear_rules("model.decoder.layer_norm", "decoder_norm"))
        if final_norms else ()
    )  # fmt: skip
    return KeyMap(
        rules=(
            *rules,
            *norms,
            KeyRule(_SHARED, "tok_emb.weight"),
            KeyRule("model.encoder.embed_positions.weight", "src_pos_emb.weight"),
            KeyRule("model.decoder.embed_positions.weight", "pos_emb.weight"),
            *linear_rules("model.encoder.layernorm_embedding", "src_embed_norm"),
            *linear_rules("model.decoder.layernorm_embedding", "tgt_embed_norm"),
            KeyRule("final_logits_bias", "final_logits_bias"),
            KeyRule("lm_head.weight", "head.weight", optional=True),  # absent when tied
        ),
        fused=fused,
        config_from_foreign=read,
        config_to_foreign=write,
        model_type=model_type,
        merge_foreign=merge,
        split_foreign=split,
        represents=represented(config, mapped=_BART_MAPPED),
    )
