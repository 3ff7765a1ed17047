"""Mistral 7B (Jiang et al., 2023): Llama's composition with an optional sliding attention
window (v0.1 attends to the last 4096 keys; v0.3 to all of them)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource
from zoo.tokenizers.repo import repo_tokenizer_spec

from ..llama.config import LlamaConfig

REPO, REVISION = "mistralai/Mistral-7B-v0.3", "caa1feb0e54d415e2df31207e5f4e273e33509b1"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MistralConfig(LlamaConfig):
    """Llama's components with Mistral's rotary base; ``sliding_window`` from the model."""

    architecture: ClassVar[str] = "mistral"

    rope_theta: float = 1000000.0


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="mistral", config="zoo_plugins.mistral:MistralConfig",
        model="zoo.nn.decoder:DecoderLM", description="Mistral: Llama with a sliding window",
        checkpoint_layouts={"hf-mistral": "zoo_plugins.mistral.convert:HF_MISTRAL"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="mistral-7b-v0.3", architecture="mistral", tokenizer="mistral-v0.3",
        description="Mistral 7B v0.3: 32 layers, width 4096, 32 heads, 8 KV heads (3 shards)",
        config={"vocab_size": 32768, "context_length": 32768, "d_model": 4096, "n_heads": 32,
                "n_kv_heads": 8, "n_layers": 32, "d_ff": 14336},
        weights=WeightsSource(  # no shard sha256 is confirmed by two public sources
            repo=REPO, revision=REVISION, layout="hf-mistral",
            filename="model.safetensors.index.json"),
    )]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [repo_tokenizer_spec(
        "mistral-v0.3", REPO, revision=REVISION,
        description="Mistral v0.3 SentencePiece BPE (32768 ids)",
    )]  # fmt: skip
