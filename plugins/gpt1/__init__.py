"""GPT-1 (Radford et al., 2018): post-LN decoder blocks (``ln(x + attn(x))``,
``ln(x + mlp(x))``), GELU (tanh approximation, as the original code), no final LayerNorm,
learned absolute positions, tied LM head.

This module only declares specs; the model and config are imported when first used.
"""

from __future__ import annotations

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, TokenizerSpec


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [
        ArchitectureSpec(
            name="gpt1",
            config="zoo_plugins.gpt1.config:GPT1Config",
            model="zoo.nn.decoder:DecoderLM",
            description="GPT-1: post-LN causal decoder, no final LayerNorm, tied LM head",
            blocks=("post-LN decoder block (causal self-attention, GELU-tanh MLP)",),
            checkpoint_layouts={"hf-openai-gpt": "zoo_plugins.gpt1.convert:HF_OPENAI_GPT"},
            hf_model_types={"openai-gpt": "hf-openai-gpt"},
        )
    ]


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [
        TokenizerSpec(
            name="gpt1-bpe",
            factory="zoo_plugins.gpt1.tokenizer:load",
            reads_checkpoint=True,
            checkpoint_files=("vocab.json", "merges.txt"),
            description="OpenAI GPT BPE, 40478 ids, lowercased, </w> word ends; vocab.json + "
            "merges.txt from the Hub repo openai-community/openai-gpt (cached)",
        )
    ]
