"""Llama (Touvron et al., 2023) as a composition of zoo components: rotary positions,
RMSNorm, SwiGLU, grouped-query attention, no biases, untied head. The shared decoder does the
rest. Only declarations here; the config and checkpoint layout are imported when first used.
"""

from __future__ import annotations

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource
from zoo.tokenizers.repo import repo_tokenizer_spec

TINYLLAMA = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
SMOLLM2_135M = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_REVISION = "12fd25f77366fa6b3b4b768ec3050bf629380bac"


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [
        ArchitectureSpec(
            name="llama",
            config="zoo_plugins.llama.config:LlamaConfig",
            model="zoo.nn.decoder:DecoderLM",
            description="Llama: pre-norm causal decoder (RoPE, RMSNorm, SwiGLU, GQA), untied head",
            checkpoint_layouts={"hf-llama": "zoo_plugins.llama.convert:HF_LLAMA"},
        )
    ]


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="tinyllama-1.1b",
            architecture="llama",
            tokenizer="tinyllama",
            description="TinyLlama 1.1B Chat v1.0: 22 layers, width 2048, 32 heads, 4 KV heads",
            config={"vocab_size": 32000, "context_length": 2048, "d_model": 2048,
                    "n_heads": 32, "n_kv_heads": 4, "n_layers": 22, "d_ff": 5632},
            weights=WeightsSource(repo=TINYLLAMA, layout="hf-llama"),
        ),
        ModelSpec(
            name="smollm2-135m-instruct",
            architecture="llama",
            tokenizer="smollm2",
            description="SmolLM2 135M Instruct: 30 layers, width 576, 9 heads, 3 KV heads, tied",
            config={"vocab_size": 49152, "context_length": 8192, "d_model": 576, "n_heads": 9,
                    "n_kv_heads": 3, "n_layers": 30, "d_ff": 1536, "rope_theta": 100000.0,
                    "tie_embeddings": True},
            weights=WeightsSource(
                # revision and sha256 as several public projects pin them
                repo=SMOLLM2_135M, layout="hf-llama",
                revision=SMOLLM2_REVISION,
                sha256="5af571cbf074e6d21a03528d2330792e532ca608f24ac70a143f6b369968ab8c",
            ),
        ),
        ModelSpec(
            name="llama-tiny",
            architecture="llama",
            tokenizer="byte",
            description="a small Llama-shaped model for tests: 2 layers, width 64, GQA 4/2",
            config={"vocab_size": 320, "context_length": 128, "d_model": 64, "n_heads": 4,
                    "n_kv_heads": 2, "n_layers": 2, "d_ff": 160},
        ),
    ]  # fmt: skip


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [
        TokenizerSpec(
            name="tinyllama",
            factory="zoo_plugins.llama.tokenizer:load",
            description=f"Llama SentencePiece BPE, 32000 ids: tokenizer.json of {TINYLLAMA}",
            reads_checkpoint=True,
            checkpoint_files=("tokenizer.json",),
        ),
        repo_tokenizer_spec(
            "smollm2",
            SMOLLM2_135M,
            revision=SMOLLM2_REVISION,
            extra=("generation_config.json",),
            description="SmolLM2 byte-level BPE with its chat template",
        ),
    ]
