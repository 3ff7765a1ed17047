"""Cohere Command-R (Cohere, 2024) as a third-party plugin: attention and a SwiGLU
feed-forward side by side on one LayerNorm without a bias (``block = "parallel_shared"``,
``norm_bias = False``; transformers' ``CohereLayerNorm`` is mean-centred, in float32, as
``torch.nn.LayerNorm`` in a float32 model), no linear biases, rotary pairs interleaved, a
tied head whose logits are multiplied by ``logit_scale``. Declarations only."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import DecoderConfig
from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec


@dataclasses.dataclass(frozen=True, kw_only=True)
class CohereConfig(DecoderConfig):
    """A :class:`~zoo.config.DecoderConfig` whose components default to Cohere's."""

    architecture: ClassVar[str] = "cohere"

    block: str = "parallel_shared"
    positions: str = "rotary"
    ffn: str = "swiglu"
    bias: bool = False
    logit_scale: float = 0.0625
    rope_theta: float = 500000.0  # transformers' CohereConfig default


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="cohere", config="oot_plugins.cohere:CohereConfig", model="zoo.nn.decoder:DecoderLM",
        description="Cohere: one bias-free LayerNorm for parallel attention and SwiGLU, "
                    "interleaved rotary, scaled logits",
        checkpoint_layouts={"hf-cohere": "oot_plugins.cohere.convert:HF_COHERE"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="cohere-tiny", architecture="cohere",
        description="a tiny Cohere: 4 heads of 16, 2 key/value heads, logits scaled by 1/4",
        config={"vocab_size": 300, "context_length": 128, "d_model": 64, "n_heads": 4,
                "n_kv_heads": 2, "n_layers": 2, "d_ff": 96, "logit_scale": 0.25},
    )]  # fmt: skip
