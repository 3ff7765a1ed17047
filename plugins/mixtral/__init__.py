"""Mixtral (Jiang et al., 2024): Mistral's attention with a sparse mixture of eight SwiGLU
experts in every block, each token routed to two of them."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource
from zoo.tokenizers.repo import repo_tokenizer_spec

from ..mistral import MistralConfig

REPO, REVISION = "mistralai/Mixtral-8x7B-v0.1", "fc7ac94680e38d7348cfa806e51218e6273104b0"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixtralConfig(MistralConfig):
    """Mistral's components with eight SwiGLU experts per block, two per token."""

    architecture: ClassVar[str] = "mixtral"

    n_experts: int | None = 8


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="mixtral", config="zoo_plugins.mixtral:MixtralConfig",
        model="zoo.nn.decoder:DecoderLM", description="Mixtral: Mistral, top-2 of 8 experts",
        checkpoint_layouts={"hf-mixtral": "zoo_plugins.mixtral.convert:HF_MIXTRAL"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="mixtral-8x7b", architecture="mixtral", tokenizer="mixtral",
        description="Mixtral 8x7B v0.1: 32 layers, width 4096, 8 experts, top 2",
        config={"vocab_size": 32000, "context_length": 32768, "d_model": 4096, "n_heads": 32,
                "n_kv_heads": 8, "n_layers": 32, "d_ff": 14336},
        weights=WeightsSource(  # 19 shards; no sha256 confirmed by two public sources
            repo=REPO, revision=REVISION, layout="hf-mixtral",
            filename="model.safetensors.index.json"),
    ), ModelSpec(
        name="mixtral-tiny", architecture="mixtral", tokenizer="byte",
        config={"vocab_size": 320, "context_length": 128, "d_model": 64, "n_heads": 4,
                "n_kv_heads": 2, "n_layers": 2, "d_ff": 96, "n_experts": 4},
        description="a small Mixtral-shaped model for tests: 2 layers, 4 experts, top 2",
    )]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [repo_tokenizer_spec(
        "mixtral", REPO, revision=REVISION, description="Mixtral SentencePiece BPE (32000 ids)",
    )]  # fmt: skip
