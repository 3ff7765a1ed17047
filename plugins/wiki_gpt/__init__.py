"""wiki-gpt: a WordPiece GPT for Wikipedia sentences, a stack of post-LN Transformer
encoder layers run with a causal mask (``torch.nn.TransformerEncoderLayer(norm_first=False,
activation="relu")``), fixed sinusoidal positions, untied LM head with bias.

This module only declares specs; the model and config are imported when first used.
"""

from __future__ import annotations

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, TokenizerSpec


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [
        ArchitectureSpec(
            name="wiki-gpt",
            config="zoo_plugins.wiki_gpt.config:WikiGPTConfig",
            model="zoo.nn.decoder:DecoderLM",
            description="post-LN Transformer encoder layers under a causal mask, "
            "sinusoidal positions, untied LM head",
            blocks=("post-LN encoder layer under a causal + padding mask (ReLU FFN)",),
        )
    ]


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [
        TokenizerSpec(
            name="bert-wordpiece-uncased",
            factory="zoo_plugins.wiki_gpt.tokenizer:load",
            description="BERT WordPiece uncased, 30522 ids, vocab shipped with zoo; "
            "<GO>/<SEP>/<PAD> = [CLS]/[SEP]/[PAD]",
        )
    ]
