"""Key rules that several Hugging Face checkpoint layouts share: Llama's key names
(``LlamaForCausalLM``), which Qwen2, Qwen3, Mistral, Mixtral, Gemma 2, Gemma 3 and OLMo-2 keep
for the tensors they have in common. A family's layout (its plugin's ``convert.py``) takes
them from here, not from another plugin::

    from zoo.checkpoint.hf_layout import hf_layout
    from zoo.checkpoint.hf_rules import DOWN, GATE_UP, llama_qkv, llama_rules

    rules, fused = (*llama_rules(), DOWN), (*llama_qkv(bias=True), *GATE_UP)
    HF_QWEN2 = hf_layout(QWEN2_CONFIG, rules, fused=fused)

Separate q/k/v and gate/up projections in the checkpoint are fused ``attn.qkv`` and
``ffn.fc`` in zoo (:class:`~zoo.checkpoint.hf_layout.FusedRule`).
"""

from __future__ import annotations

from .hf_layout import FusedRule, KeyRule, fused_linear

__all__ = ["DOWN", "GATE_UP", "llama_qkv", "llama_rules"]

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
