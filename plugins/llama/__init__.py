"""Llama (Touvron et al., 2023) as a composition of zoo components: rotary positions,
RMSNorm, SwiGLU, grouped-query attention, no biases, untied head. The shared decoder does the
rest. Only declarations here; the config and checkpoint layout are imported when first used.
"""

from __future__ import annotations

from zoo.plugin.family import declare_family
from zoo.plugin.specs import TokenizerSpec

from .config import LlamaConfig

TINYLLAMA = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
SMOLLM2_135M = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_REVISION = "12fd25f77366fa6b3b4b768ec3050bf629380bac"

family = declare_family(
    LlamaConfig,
    layout=("llama", "zoo_plugins.llama.convert:HF_LLAMA"),
    description="Llama: pre-norm causal decoder (RoPE, RMSNorm, SwiGLU, GQA), untied head",
    repo=SMOLLM2_135M,
    revision=SMOLLM2_REVISION,
    tokenizer="smollm2",
    tokenizer_description="SmolLM2 byte-level BPE with its chat template",
    tokenizers=[
        TokenizerSpec(
            name="tinyllama",
            factory="zoo_plugins.llama.tokenizer:load",
            description=f"Llama SentencePiece BPE, 32000 ids: tokenizer.json of {TINYLLAMA}",
            reads_checkpoint=True,
            checkpoint_files=("tokenizer.json",),
        )
    ],
)
