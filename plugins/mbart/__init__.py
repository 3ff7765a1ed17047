"""mBART (Liu et al., 2020): BART's composition made pre-LN, with a LayerNorm after each
stack and token embeddings scaled by ``sqrt(d_model)``. Declarations only; the layout loads
when first used."""

from __future__ import annotations

from ..transformer_encdec.family import declare_encdec_family
from .config import MBartConfig

family = declare_encdec_family(
    MBartConfig,
    layout=("mbart", "zoo_plugins.mbart.convert:HF_MBART"),
    description="mBART: pre-LN BART with final norms and scaled embeddings",
)
