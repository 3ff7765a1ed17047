"""GPT-2 (Radford et al., 2019): pre-LN decoder blocks, final LayerNorm, GELU (tanh),
learned absolute positions, LM head tied to the token embedding.

This module only declares specs; the model and config are imported when first used.
"""

from __future__ import annotations

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, TokenizerSpec


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [
        ArchitectureSpec(
            name="gpt2",
            config="zoo_plugins.gpt2.config:GPT2Config",
            model="zoo.nn.decoder:DecoderLM",
            description="GPT-2: pre-LN causal decoder, final LayerNorm, tied LM head",
            blocks=(
                "pre-LN decoder block (causal self-attention, GELU-tanh MLP)",
                "final LayerNorm",
            ),
            checkpoint_layouts={"hf-gpt2": "zoo_plugins.gpt2.convert:HF_GPT2"},
            hf_model_types={"gpt2": "hf-gpt2"},
        )
    ]


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [
        TokenizerSpec(
            name="gpt2-bpe",
            factory="zoo_plugins.gpt2.tokenizer:load",
            reads_checkpoint=True,
            # a Hugging Face folder's files: checked to be GPT-2's own before it is attached
            checkpoint_files=(("vocab.json", "merges.txt"), ("tokenizer.json",)),
            description="GPT-2 byte-level BPE via tiktoken, 50257 ids, ranks shipped with zoo "
            "(sha256-checked)",
        )
    ]
