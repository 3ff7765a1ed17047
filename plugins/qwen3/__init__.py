"""Qwen3 (Qwen team, 2025): Qwen2 without q/k/v biases, with heads 128 wide apart from the
model width, and each head's queries and keys RMS-normalised before rotary positions."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource
from zoo.tokenizers.repo import repo_tokenizer_spec

from ..qwen2 import Qwen2Config

REPO, REVISION = "Qwen/Qwen3-0.6B", "c1899de289a04d12100db370d81485cdf75e47ca"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen3Config(Qwen2Config):
    """Qwen2's components without q/k/v biases, with per-head q/k RMSNorm."""

    architecture: ClassVar[str] = "qwen3"

    qkv_bias: bool | None = None
    qk_norm: bool = True


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="qwen3", config="zoo_plugins.qwen3:Qwen3Config", model="zoo.nn.decoder:DecoderLM",
        description="Qwen3: Llama with q/k norms and head_dim apart from the width",
        checkpoint_layouts={"hf-qwen3": "zoo_plugins.qwen3.convert:HF_QWEN3"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="qwen3-0.6b", architecture="qwen3", tokenizer="qwen3",
        description="Qwen3 0.6B: 28 layers, width 1024, 16 heads of 128, 8 KV heads",
        config={"vocab_size": 151936, "context_length": 40960, "d_model": 1024, "n_heads": 16,
                "n_kv_heads": 8, "head_dim": 128, "n_layers": 28, "d_ff": 3072},
        weights=WeightsSource(  # revision and sha256 as several public projects pin them
            repo=REPO, revision=REVISION, layout="hf-qwen3",
            sha256="f47f71177f32bcd101b7573ec9171e6a57f4f4d31148d38e382306f42996874b"),
    )]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [repo_tokenizer_spec(
        "qwen3", REPO, revision=REVISION, extra=("generation_config.json",),
        description="Qwen3 byte-level BPE with its chat template",
    )]  # fmt: skip
