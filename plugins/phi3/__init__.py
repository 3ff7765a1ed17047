"""Phi-3 (Microsoft, 2024): Llama's composition with the query, key and value projections
fused into one ``qkv_proj`` and the gate and up projections into one ``gate_up_proj`` in its
checkpoints, and (the 4k models) a sliding window of 2047 keys on every layer."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource
from zoo.tokenizers.repo import repo_tokenizer_spec

from ..llama.config import LlamaConfig

REPO, REVISION = "microsoft/Phi-3-mini-4k-instruct", "f39ac1d28e925b323eae81227eaba4464caced4e"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Phi3Config(LlamaConfig):
    """Llama's components (RMSNorm, SwiGLU, rotary); ``sliding_window`` and ``rotary_dim``
    from the model."""

    architecture: ClassVar[str] = "phi3"


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="phi3", config="zoo_plugins.phi3:Phi3Config", model="zoo.nn.decoder:DecoderLM",
        description="Phi-3: Llama with fused qkv and gate_up projections in its checkpoints",
        checkpoint_layouts={"hf-phi3": "zoo_plugins.phi3.convert:HF_PHI3"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="phi-3-mini-4k-instruct", architecture="phi3", tokenizer="phi-3",
        description="Phi-3 mini 4k instruct: 32 layers, width 3072, 32 heads, window 2047 "
                    "(3.8B parameters, 2 shards)",
        config={"vocab_size": 32064, "context_length": 4096, "d_model": 3072, "n_heads": 32,
                "n_kv_heads": 32, "n_layers": 32, "d_ff": 8192, "sliding_window": 2047},
        weights=WeightsSource(  # no shard sha256 is confirmed by two public sources
            repo=REPO, revision=REVISION, layout="hf-phi3",
            filename="model.safetensors.index.json"),
    )]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [repo_tokenizer_spec(
        "phi-3", REPO, revision=REVISION, extra=("generation_config.json",),
        description="Phi-3 SentencePiece BPE (32064 ids) with its chat template",
    )]  # fmt: skip
