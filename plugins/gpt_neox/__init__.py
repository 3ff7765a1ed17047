"""GPT-NeoX (Black et al., 2022) and Pythia (Biderman et al., 2023): LayerNorm, a GELU MLP,
rotary positions on a quarter of each head, and attention and MLP side by side (a parallel
residual). Declarations only; the layout loads when first used."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import DecoderConfig
from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource
from zoo.tokenizers.repo import repo_tokenizer_spec

REPO, REVISION = "EleutherAI/pythia-160m", "50f5173d932e8e61f858120bcb800b97af589f46"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPTNeoXConfig(DecoderConfig):
    """A :class:`~zoo.config.DecoderConfig` whose components default to GPT-NeoX's."""

    architecture: ClassVar[str] = "gpt-neox"

    positions: str = "rotary"
    parallel_residual: bool = True
    tie_embeddings: bool = False


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="gpt-neox", config="zoo_plugins.gpt_neox:GPTNeoXConfig",
        model="zoo.nn.decoder:DecoderLM",
        description="GPT-NeoX: parallel residual, partial rotary, LayerNorm, GELU MLP",
        checkpoint_layouts={"hf-gpt-neox": "zoo_plugins.gpt_neox.convert:HF_GPT_NEOX"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="pythia-160m", architecture="gpt-neox", tokenizer="pythia",
        description="Pythia 160M: 12 layers, width 768, 12 heads, rotary on 25%",
        config={"vocab_size": 50304, "context_length": 2048, "d_model": 768, "n_heads": 12,
                "n_layers": 12, "d_ff": 3072, "rotary_dim": 16},
        weights=WeightsSource(  # revision and sha256 as several public projects pin them
            repo=REPO, revision=REVISION, layout="hf-gpt-neox",
            sha256="29d2e457a664e41c12c735f20a36dc0956a665f614a54ce5db21a32e75965270"),
    )]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [repo_tokenizer_spec(
        "pythia", REPO, revision=REVISION, description="GPT-NeoX byte-level BPE (50277 ids)",
    )]  # fmt: skip
