"""Mixtral (Jiang et al., 2024): Mistral's attention with a sparse mixture of eight SwiGLU
experts in every block, each token routed to two of them."""

from __future__ import annotations

from zoo.hookspecs import hookimpl
from zoo.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource

MIXTRAL_8X7B = "mistralai/Mixtral-8x7B-v0.1"
REVISION = "fc7ac94680e38d7348cfa806e51218e6273104b0"


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [
        ArchitectureSpec(
            name="mixtral",
            config="zoo_plugins.mixtral.config:MixtralConfig",
            model="zoo.nn.decoder:DecoderLM",
            description="Mixtral: Mistral with a top-2 mixture of SwiGLU experts",
            checkpoint_layouts={"hf-mixtral": "zoo_plugins.mixtral.convert:HF_MIXTRAL"},
        )
    ]


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="mixtral-8x7b",
            architecture="mixtral",
            tokenizer="mixtral",
            description="Mixtral 8x7B v0.1: 32 layers, width 4096, 8 experts, top 2",
            config={"vocab_size": 32000, "context_length": 32768, "d_model": 4096,
                    "n_heads": 32, "n_kv_heads": 8, "n_layers": 32, "d_ff": 14336},
            weights=WeightsSource(
                repo=MIXTRAL_8X7B, layout="hf-mixtral",
                revision=REVISION,
                filename="model.safetensors.index.json",  # sharded
            ),
        ),
        ModelSpec(
            name="mixtral-tiny",
            architecture="mixtral",
            tokenizer="byte",
            description="a small Mixtral-shaped model for tests: 2 layers, 4 experts, top 2",
            config={"vocab_size": 320, "context_length": 128, "d_model": 64, "n_heads": 4,
                    "n_kv_heads": 2, "n_layers": 2, "d_ff": 96, "n_experts": 4},
        ),
    ]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [
        TokenizerSpec(
            name="mixtral",
            factory="zoo_plugins.mixtral.tokenizer:load",
            description=f"Mixtral SentencePiece BPE (32000 ids), from {MIXTRAL_8X7B}",
            reads_checkpoint=True,
            checkpoint_files=("tokenizer.json", "tokenizer_config.json"),
        )
    ]
