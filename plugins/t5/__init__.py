"""T5 (Raffel et al., 2020): a pre-norm encoder-decoder with RMS norms (no mean, no bias), no
biases, unscaled attention scores plus each stack's relative position bias, ReLU (v1.0) or
gated GELU (v1.1, Flan-T5), and a head tied to the embedding with its input scaled by
``d_model ** -0.5`` (v1.0) or a head of its own (v1.1). Declarations only; the layout and the
position scheme load when first used."""

from __future__ import annotations

from zoo.plugin.specs import ComponentSpec

from ..transformer_encdec.family import declare_encdec_family
from .config import T5Config

family = declare_encdec_family(
    T5Config,
    layout=("t5", "zoo_plugins.t5.convert:HF_T5"),
    description="T5: pre-norm RMSNorm encoder-decoder, relative position bias per stack",
    components=(
        ComponentSpec(
            "positions",
            "t5_relative",
            "zoo_plugins.t5.positions:t5_relative",
            "T5's relative position bias: a learned score bias per head and distance bucket",
            ("relative_attention_num_buckets", "relative_attention_max_distance"),
        ),
    ),
)
