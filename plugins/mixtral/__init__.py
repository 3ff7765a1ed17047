"""Mixtral (Jiang et al., 2024): Mistral's attention with a sparse mixture of eight SwiGLU
experts in every block, each token routed to two of them."""

from __future__ import annotations

from zoo.hookspecs import hookimpl
from zoo.specs import ArchitectureSpec, ModelSpec, WeightsSource

MIXTRAL_8X7B = "mistralai/Mixtral-8x7B-v0.1"


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
            tokenizer="tinyllama",  # the Llama 2 SentencePiece vocabulary (32000 ids)
            description="Mixtral 8x7B v0.1: 32 layers, width 4096, 8 experts, top 2",
            config={"vocab_size": 32000, "context_length": 32768, "d_model": 4096,
                    "n_heads": 32, "n_kv_heads": 8, "n_layers": 32, "d_ff": 14336},
            weights=WeightsSource(
                repo=MIXTRAL_8X7B, layout="hf-mixtral",
                revision="fc7ac94680e38d7348cfa806e51218e6273104b0",
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
