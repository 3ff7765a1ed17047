"""Mistral 7B (Jiang et al., 2023): Llama's composition with an optional sliding attention
window (v0.1 attends to the last 4096 keys; v0.3 to all of them)."""

from __future__ import annotations

from zoo.hookspecs import hookimpl
from zoo.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource

MISTRAL_7B = "mistralai/Mistral-7B-v0.3"
REVISION = "caa1feb0e54d415e2df31207e5f4e273e33509b1"


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [
        ArchitectureSpec(
            name="mistral",
            config="zoo_plugins.mistral.config:MistralConfig",
            model="zoo.nn.decoder:DecoderLM",
            description="Mistral: Llama with a sliding attention window",
            checkpoint_layouts={"hf-mistral": "zoo_plugins.mistral.convert:HF_MISTRAL"},
        )
    ]


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="mistral-7b-v0.3",
            architecture="mistral",
            tokenizer="mistral-v0.3",
            description="Mistral 7B v0.3: 32 layers, width 4096, 32 heads, 8 KV heads (3 shards)",
            config={"vocab_size": 32768, "context_length": 32768, "d_model": 4096,
                    "n_heads": 32, "n_kv_heads": 8, "n_layers": 32, "d_ff": 14336},
            weights=WeightsSource(
                repo=MISTRAL_7B, layout="hf-mistral",
                revision=REVISION,
                filename="model.safetensors.index.json",  # sharded
            ),
        ),
    ]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [
        TokenizerSpec(
            name="mistral-v0.3",
            factory="zoo_plugins.mistral.tokenizer:load",
            description=f"Mistral v0.3 SentencePiece BPE (32768 ids), from {MISTRAL_7B}",
            reads_checkpoint=True,
            checkpoint_files=("tokenizer.json", "tokenizer_config.json"),
        )
    ]
