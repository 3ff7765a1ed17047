"""The Hugging Face Llama checkpoint layout (``LlamaForCausalLM``): separate q/k/v and
gate/up projections there, fused ``qkv`` and ``fc`` in zoo."""

from __future__ import annotations

from zoo.checkpoint.hf_config import LLAMA_FIELDS, HFConfigFormat
from zoo.checkpoint.hf_layout import FusedRule, KeyRule, fused_linear, hf_layout

from .config import LlamaConfig

_ATTN, _MLP = "model.layers.{i}.self_attn", "model.layers.{i}.mlp"


def _rule(foreign: str, zoo: str, **kwargs: bool) -> KeyRule:
    return KeyRule(f"{foreign}.weight", f"{zoo}.weight", **kwargs)


def llama_rules(*, qk_norm: bool = False) -> tuple[KeyRule, ...]:
    """The one-to-one keys of ``LlamaForCausalLM`` and the families that copy it (Qwen2/3,
    Mistral, Mixtral); ``qk_norm`` adds Qwen3's per-head query/key norms."""
    norms = (
        (_rule(f"{_ATTN}.q_norm", "blocks.{i}.attn.q_norm"),
         _rule(f"{_ATTN}.k_norm", "blocks.{i}.attn.k_norm"))
        if qk_norm else ()
    )  # fmt: skip
    return (
        _rule("model.embed_tokens", "tok_emb"),
        _rule("model.layers.{i}.input_layernorm", "blocks.{i}.attn_norm"),
        _rule(f"{_ATTN}.o_proj", "blocks.{i}.attn.proj"),
        *norms,
        _rule("model.layers.{i}.post_attention_layernorm", "blocks.{i}.ffn_norm"),
        _rule("model.norm", "final_norm"),
        _rule("lm_head", "head", optional=True),  # absent when tied to the embedding
    )


def llama_qkv(*, bias: bool = False) -> tuple[FusedRule, ...]:
    """q/k/v projections, fused into zoo's ``attn.qkv``."""
    parts = tuple(f"{_ATTN}.{p}_proj" for p in "qkv")
    return fused_linear("blocks.{i}.attn.qkv", parts, ("q", "kv", "kv"), bias=bias)


#: The SwiGLU feed-forward: gate/up fused into zoo's ``ffn.fc``, down as ``ffn.proj``.
DOWN = _rule(f"{_MLP}.down_proj", "blocks.{i}.ffn.proj")
GATE_UP = fused_linear("blocks.{i}.ffn.fc", (f"{_MLP}.gate_proj", f"{_MLP}.up_proj"), ("d_ff",) * 2)

LLAMA_CONFIG = HFConfigFormat(
    family="Llama",
    model_type="llama",
    architecture="LlamaForCausalLM",
    config=LlamaConfig,
    fields=LLAMA_FIELDS,
    fixed={"hidden_act": "silu", "attention_bias": False, "mlp_bias": False},
    checked={"rope_interleaved": False},  # SmolLM2's: rotate-half, zoo's layout
    inert=frozenset({"is_encoder_decoder", "is_llama_config", "transformers.js_config"}),
)

HF_LLAMA = hf_layout(
    LLAMA_CONFIG,
    (*llama_rules(), DOWN),
    fused=(*llama_qkv(), *GATE_UP),
    ignore_foreign=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
)
