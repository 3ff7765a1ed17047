"""StarCoder2 (Lozhkov et al., 2024) as a third-party plugin: a pre-LN block of LayerNorms
(always with biases), grouped-query attention, a tanh-GELU MLP, rotary positions and a
sliding window; ``use_bias: false`` drops the biases of the linear layers only
(``bias = False`` beside ``norm_bias = True``). Declarations only."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation, DecoderConfig
from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec


@dataclasses.dataclass(frozen=True, kw_only=True)
class Starcoder2Config(DecoderConfig):
    """A :class:`~zoo.config.DecoderConfig` whose components default to StarCoder2's."""

    architecture: ClassVar[str] = "starcoder2"

    positions: str = "rotary"
    activation: Activation = "gelu_tanh"
    norm_bias: bool | None = True  # LayerNorms keep their biases whatever use_bias says


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="starcoder2", config="oot_plugins.starcoder2:Starcoder2Config",
        model="zoo.nn.decoder:DecoderLM",
        description="StarCoder2: pre-LN LayerNorm, GQA, tanh-GELU MLP, sliding window",
        checkpoint_layouts={"hf-starcoder2": "oot_plugins.starcoder2.convert:HF_STARCODER2"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="starcoder2-tiny", architecture="starcoder2",
        description="a tiny StarCoder2: linears without biases, a window of 7",
        config={"vocab_size": 300, "context_length": 128, "d_model": 64, "n_heads": 4,
                "n_kv_heads": 2, "n_layers": 2, "d_ff": 96, "bias": False,
                "sliding_window": 7},
    )]  # fmt: skip
