"""GPT-NeoX (Black et al., 2022) and Pythia (Biderman et al., 2023): LayerNorm, a GELU MLP,
rotary positions on a quarter of each head, and attention and MLP side by side (a parallel
residual). Declarations only; config and layout load when first used."""

from __future__ import annotations

from zoo.hookspecs import hookimpl
from zoo.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource

PYTHIA_160M = "EleutherAI/pythia-160m"
REVISION = "50f5173d932e8e61f858120bcb800b97af589f46"


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [
        ArchitectureSpec(
            name="gpt-neox",
            config="zoo_plugins.gpt_neox.config:GPTNeoXConfig",
            model="zoo.nn.decoder:DecoderLM",
            description="GPT-NeoX: parallel residual, partial rotary, LayerNorm, GELU MLP",
            checkpoint_layouts={"hf-gpt-neox": "zoo_plugins.gpt_neox.convert:HF_GPT_NEOX"},
        )
    ]


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="pythia-160m",
            architecture="gpt-neox",
            tokenizer="pythia",
            description="Pythia 160M: 12 layers, width 768, 12 heads, rotary on 25%",
            config={"vocab_size": 50304, "context_length": 2048, "d_model": 768,
                    "n_heads": 12, "n_layers": 12, "d_ff": 3072},
            weights=WeightsSource(
                # revision and sha256 as several public projects pin them
                repo=PYTHIA_160M, layout="hf-gpt-neox",
                revision=REVISION,
                sha256="29d2e457a664e41c12c735f20a36dc0956a665f614a54ce5db21a32e75965270",
            ),
        ),
    ]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [
        TokenizerSpec(
            name="pythia",
            factory="zoo_plugins.gpt_neox.tokenizer:load",
            description=f"GPT-NeoX byte-level BPE (50277 ids), from {PYTHIA_160M}",
            reads_checkpoint=True,
            checkpoint_files=("tokenizer.json", "tokenizer_config.json"),
        )
    ]
