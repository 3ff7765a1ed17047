"""OLMo-2 (OLMo et al., 2025): Llama's components with the norms moved after attention and
the MLP, inside the residual (no norm before either), and queries and keys RMS-normalised
over their full projected width (every head at once) before rotary positions."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource
from zoo.tokenizers.repo import repo_tokenizer_spec

from ..llama.config import LlamaConfig

REPO, REVISION = "allenai/OLMo-2-0425-1B-Instruct", "48d788eca847d4d7548f375ad03d3c9312f6139e"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Olmo2Config(LlamaConfig):
    """Llama's components in a post-branch block, with q/k RMSNorm over all heads' width."""

    architecture: ClassVar[str] = "olmo2"

    block: str = "post_branch"
    qk_norm: bool = True
    qk_norm_scope: Literal["head", "full"] = "full"
    rope_theta: float = 500000.0
    layer_norm_eps: float = 1e-6


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="olmo2", config="zoo_plugins.olmo2:Olmo2Config", model="zoo.nn.decoder:DecoderLM",
        description="OLMo-2: Llama with norms after each branch and full-width q/k norms",
        checkpoint_layouts={"hf-olmo2": "zoo_plugins.olmo2.convert:HF_OLMO2"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="olmo-2-1b-instruct", architecture="olmo2", tokenizer="olmo2",
        description="OLMo-2 0425 1B Instruct: 16 layers, width 2048, 16 heads, untied head",
        config={"vocab_size": 100352, "context_length": 4096, "d_model": 2048, "n_heads": 16,
                "n_kv_heads": 16, "n_layers": 16, "d_ff": 8192},
        weights=WeightsSource(  # the revision public projects pin; no published weights hash
            repo=REPO, revision=REVISION, layout="hf-olmo2"),
    )]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [repo_tokenizer_spec(
        "olmo2", REPO, revision=REVISION, extra=("generation_config.json",),
        description="OLMo-2 byte-level BPE (cl100k-based) with its chat template",
    )]  # fmt: skip
