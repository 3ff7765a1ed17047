"""Marian (Junczys-Dowmunt et al., 2018), the OPUS-MT translation models: Vaswani et al.'s
post-LN encoder-decoder with static sinusoidal positions laid out sines then cosines, token
embeddings scaled by ``sqrt(d_model)``, a fixed logits bias and, in most models, one
vocabulary for source and target. Declarations only; the layout loads when first used."""

from __future__ import annotations

import dataclasses

from zoo.plugin.specs import ComponentSpec, TokenizerSpec

from ..transformer_encdec.family import declare_encdec_family
from .config import MarianConfig

#: Marian's tokenizer: the checkpoint's SentencePiece pair (source.spm, target.spm and
#: vocab.json, as transformers' MarianTokenizer saves them), read by zoo.tokenizers.
TOKENIZER = TokenizerSpec(
    "marian-spm",
    "zoo.tokenizers.sentencepiece_pair:pair_tokenizer",
    "SentencePiece source/target pair with its vocab.json (sentencepiece)",
    reads_checkpoint=True,
    checkpoint_files=("source.spm", "target.spm", "vocab.json"),
)

_family = declare_encdec_family(
    MarianConfig,
    layout=("marian", "zoo_plugins.marian.convert:HF_MARIAN"),
    description="Marian (OPUS-MT): post-LN encoder-decoder, static sin|cos positions",
    components=(
        ComponentSpec(
            "positions",
            "sinusoidal_halves",
            "zoo_plugins.marian.positions:sinusoidal_halves",
            "Marian's fixed sinusoidal vectors, sines then cosines (not interleaved)",
            (),
        ),
    ),
)
family = dataclasses.replace(_family, tokenizers=(TOKENIZER,))
