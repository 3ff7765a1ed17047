"""Qwen2 and Qwen2.5 (Yang et al., 2024): Llama's composition with biases on the query, key
and value projections. Declarations only; the layout loads when first used."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource
from zoo.tokenizers.repo import repo_tokenizer_spec

from ..llama.config import LlamaConfig

REPO, REVISION = "Qwen/Qwen2.5-0.5B-Instruct", "7ae557604adf67be50417f59c2c2f167def9a775"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen2Config(LlamaConfig):
    """Llama's components, biased q/k/v projections, Qwen's rotary base and epsilon."""

    architecture: ClassVar[str] = "qwen2"

    qkv_bias: bool | None = True
    rope_theta: float = 1000000.0
    layer_norm_eps: float = 1e-6
    tie_embeddings: bool = True


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="qwen2", config="zoo_plugins.qwen2:Qwen2Config", model="zoo.nn.decoder:DecoderLM",
        description="Qwen2/2.5: Llama with q/k/v biases (RoPE, RMSNorm, SwiGLU, GQA)",
        checkpoint_layouts={"hf-qwen2": "zoo_plugins.qwen2.convert:HF_QWEN2"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="qwen2.5-0.5b-instruct", architecture="qwen2", tokenizer="qwen2.5",
        description="Qwen2.5 0.5B Instruct: 24 layers, width 896, 14 heads, 2 KV heads",
        config={"vocab_size": 151936, "context_length": 32768, "d_model": 896, "n_heads": 14,
                "n_kv_heads": 2, "n_layers": 24, "d_ff": 4864},
        weights=WeightsSource(  # revision and sha256 as several public projects pin them
            repo=REPO, revision=REVISION, layout="hf-qwen2",
            sha256="fdf756fa7fcbe7404d5c60e26bff1a0c8b8aa1f72ced49e7dd0210fe288fb7fe"),
    )]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [repo_tokenizer_spec(
        "qwen2.5", REPO, revision=REVISION, extra=("generation_config.json",),
        description="Qwen2.5 byte-level BPE with its chat template",
    )]  # fmt: skip
