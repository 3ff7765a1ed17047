"""Gemma 2 (Google, 2024): a decoder whose blocks put an RMSNorm before and after each
branch, scaled by ``1 + weight``; a GeGLU feed-forward with the tanh GELU; heads apart from
the model width, scores scaled by ``query_pre_attn_scalar ** -0.5`` and soft-capped, logits
soft-capped; sliding and full attention alternating layer by layer; token embeddings scaled
by ``sqrt(d_model)`` and tied to the head; no biases."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation, DecoderConfig
from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource
from zoo.tokenizers.repo import repo_tokenizer_spec

REPO, REVISION = "google/gemma-2-2b-it", "299a8560bedf22ed1c72a8a11e7dce4a7f9f51f8"

#: Gemma 2's layers: sliding first, then full, alternating (transformers' default).
ALTERNATING = ("sliding_attention", "full_attention")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gemma2Config(DecoderConfig):
    """The shared decoder with Gemma 2's components: four norms per block (``sandwich``),
    ``(1 + w)`` RMSNorm, tanh-GELU GeGLU, rotary positions, scaled and tied embeddings, no
    biases, scores capped at 50 and logits at 30 (transformers' defaults); sizes, window,
    ``layer_types`` and ``attn_scale`` from the model."""

    architecture: ClassVar[str] = "gemma2"

    positions: str = "rotary"
    norm: str = "rmsnorm1p"
    ffn: str = "geglu"
    activation: Activation = "gelu_tanh"
    block: str = "sandwich"
    bias: bool = False
    scale_embeddings: bool = True
    layer_norm_eps: float = 1e-6
    attn_softcap: float | None = 50.0
    final_softcap: float | None = 30.0


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="gemma2", config="zoo_plugins.gemma2:Gemma2Config", model="zoo.nn.decoder:DecoderLM",
        description="Gemma 2: sandwich norms (1+w), GeGLU, soft-capped scores and logits, "
                    "alternating sliding/full layers",
        checkpoint_layouts={"hf-gemma2": "zoo_plugins.gemma2.convert:HF_GEMMA2"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="gemma-2-2b-it", architecture="gemma2", tokenizer="gemma2",
        description="Gemma 2 2B instruct: 26 layers, width 2304, 8 heads of 256, 4 KV heads, "
                    "window 4096 on every other layer (2.6B parameters, 2 shards; Gemma "
                    "Terms of Use)",
        config={"vocab_size": 256000, "context_length": 8192, "d_model": 2304, "n_heads": 8,
                "n_kv_heads": 4, "head_dim": 256, "n_layers": 26, "d_ff": 9216,
                "sliding_window": 4096, "layer_types": ALTERNATING * 13,
                "attn_scale": 256**-0.5},
        weights=WeightsSource(  # revision and index sha256 as several public projects pin them
            repo=REPO, revision=REVISION, layout="hf-gemma2",
            filename="model.safetensors.index.json",
            sha256="ada0043f3e3b2e5ab2f445cad9c0fbbf9d91ad444675e6a82b822591c63abf5a"),
    )]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [repo_tokenizer_spec(
        "gemma2", REPO, revision=REVISION, extra=("generation_config.json",),
        description="Gemma 2 SentencePiece BPE (256000 ids) with its chat template",
    )]  # fmt: skip
