"""transformer-encdec: the encoder-decoder Transformer of Vaswani et al. (2017): post-LN
encoder layers and decoder layers with cross-attention, ReLU, fixed sinusoidal positions, one
embedding shared by source, target and the LM head (a shared subword vocabulary).

This module only declares specs; the model and config are imported when first used.
"""

from __future__ import annotations

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, TokenizerSpec


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [
        ArchitectureSpec(
            name="transformer-encdec",
            config="zoo_plugins.transformer_encdec.config:EncoderDecoderConfig",
            model="zoo_plugins.transformer_encdec.model:EncoderDecoder",
            description="encoder-decoder Transformer (Vaswani et al. 2017), post-LN",
            blocks=(
                "post-LN encoder layer (self-attention, ReLU FFN)",
                "post-LN decoder layer (causal self-attention, cross-attention, ReLU FFN)",
                "final LayerNorm on encoder and decoder (as torch.nn.Transformer)",
            ),
        )
    ]


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [
        TokenizerSpec(
            name="subword-bpe",
            factory="zoo_plugins.transformer_encdec.tokenizer:load",
            reads_checkpoint=True,
            description="trainable byte-level BPE shared by source and target, "
            "<pad> <unk> <s> </s>; trained with SubwordBPE.train and saved with the weights",
        )
    ]
