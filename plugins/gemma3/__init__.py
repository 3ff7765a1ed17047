"""Gemma 3 text (Google DeepMind, 2025): Gemma 2's four norms per block with ``(1 + w)``
RMSNorm, GeGLU and scaled, tied embeddings, plus per-head q/k norms, five sliding-window
layers to one global layer, and a rotary base per kind of layer (10,000 on sliding layers,
1,000,000 on global ones). No soft-capping. Declarations only; the layout loads when used."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import LayerType
from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource
from zoo.tokenizers.repo import repo_tokenizer_spec

from ..gemma2 import Gemma2Config

REPO, REVISION = "google/gemma-3-1b-it", "dcc83ea841ab6100d6b47a070329e1ba4cf78752"


def every_sixth_global(n_layers: int, pattern: int = 6) -> tuple[LayerType, ...]:
    """``layer_types`` of ``n_layers`` layers where every ``pattern``-th is global and the
    others slide (transformers' reading of Gemma 3's ``sliding_window_pattern``)."""
    return tuple(
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gemma3Config(Gemma2Config):
    """Gemma 2's components (four ``(1 + w)`` RMSNorms per block, tanh-GELU GeGLU, rotary
    positions, scaled and tied embeddings, no biases) without its caps, with per-head q/k
    norms, a rotary base per kind of layer (1e6 global, 1e4 sliding) and scores scaled by
    ``query_pre_attn_scalar ** -0.5`` (transformers' default 256: ``attn_scale = 1/16``)."""

    architecture: ClassVar[str] = "gemma3"

    qk_norm: bool = True
    attn_softcap: float | None = None
    final_softcap: float | None = None
    rope_theta: float = 1_000_000.0
    rope_local_theta: float | None = 10_000.0
    attn_scale: float | None = 256**-0.5


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="gemma3", config="zoo_plugins.gemma3:Gemma3Config", model="zoo.nn.decoder:DecoderLM",
        description="Gemma 3 text: sandwich-normed (1+w) blocks, q/k norms, sliding and "
                    "global layers with a rotary base each, GeGLU, scaled tied embeddings",
        checkpoint_layouts={"hf-gemma3": "zoo_plugins.gemma3.convert:HF_GEMMA3"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="gemma-3-1b-it", architecture="gemma3", tokenizer="gemma3",
        description="Gemma 3 1B instruction-tuned: 26 layers (every sixth global, the others "
                    "a 512-token window), width 1152, 4 heads of 256, 1 KV head",
        config={"vocab_size": 262144, "context_length": 32768, "d_model": 1152, "n_heads": 4,
                "n_kv_heads": 1, "head_dim": 256, "n_layers": 26, "d_ff": 6912,
                "sliding_window": 512, "layer_types": every_sixth_global(26)},
        weights=WeightsSource(  # revision and sha256 as several public projects pin them
            repo=REPO, revision=REVISION, layout="hf-gemma3",
            sha256="3d4ef8d71c14db7e448a09ebe891cfb6bf32c57a9b44499ae0d1c098e48516b6"),
    )]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [repo_tokenizer_spec(
        "gemma3", REPO, revision=REVISION, extra=("generation_config.json",),
        description="Gemma 3 SentencePiece-style BPE, 262,144 ids, with its chat template",
    )]  # fmt: skip
