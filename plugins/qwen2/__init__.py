"""Qwen2 and Qwen2.5 (Yang et al., 2024): Llama's composition with biases on the query, key
and value projections. Declarations only; the config and layout load when first used."""

from __future__ import annotations

from zoo.hookspecs import hookimpl
from zoo.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource

QWEN25_05B = "Qwen/Qwen2.5-0.5B-Instruct"
REVISION = "7ae557604adf67be50417f59c2c2f167def9a775"


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [
        ArchitectureSpec(
            name="qwen2",
            config="zoo_plugins.qwen2.config:Qwen2Config",
            model="zoo.nn.decoder:DecoderLM",
            description="Qwen2/2.5: Llama with q/k/v biases (RoPE, RMSNorm, SwiGLU, GQA)",
            checkpoint_layouts={"hf-qwen2": "zoo_plugins.qwen2.convert:HF_QWEN2"},
        )
    ]


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="qwen2.5-0.5b-instruct",
            architecture="qwen2",
            tokenizer="qwen2.5",
            description="Qwen2.5 0.5B Instruct: 24 layers, width 896, 14 heads, 2 KV heads",
            config={"vocab_size": 151936, "context_length": 32768, "d_model": 896,
                    "n_heads": 14, "n_kv_heads": 2, "n_layers": 24, "d_ff": 4864},
            weights=WeightsSource(
                # revision and sha256 as several public projects pin them
                repo=QWEN25_05B, layout="hf-qwen2",
                revision=REVISION,
                sha256="fdf756fa7fcbe7404d5c60e26bff1a0c8b8aa1f72ced49e7dd0210fe288fb7fe",
            ),
        ),
    ]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [
        TokenizerSpec(
            name="qwen2.5",
            factory="zoo_plugins.qwen2.tokenizer:load",
            description=f"Qwen2.5 byte-level BPE with its chat template, from {QWEN25_05B}",
            reads_checkpoint=True,
            checkpoint_files=("tokenizer.json", "tokenizer_config.json"),
        )
    ]
