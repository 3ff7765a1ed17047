"""BART (Lewis et al., 2019): a post-LN encoder-decoder with a LayerNorm over each stack's
embeddings, each stack's own learned positions (read from row 2 on), GELU, one vocabulary
tied to the head and a fixed logits bias. Declarations only; the layout loads when first
used."""

from __future__ import annotations

from ..transformer_encdec.family import declare_encdec_family
from .config import BartConfig

family = declare_encdec_family(
    BartConfig,
    layout=("bart", "zoo_plugins.bart.convert:HF_BART"),
    description="BART: post-LN encoder-decoder, embedding norms, learned positions",
)
