"""GPT-J (Wang and Komatsuzaki, 2021) as a third-party plugin: attention and MLP side by side
on one LayerNorm (``block = "parallel_shared"``), a tanh-GELU MLP with biases, q/k/v and
output projections without, rotary positions on the first ``rotary_dim`` features of each
head, and an untied LM head with a bias. Declarations only; the layout loads when first used."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from zoo.config import Activation, DecoderConfig
from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec, ModelSpec


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPTJConfig(DecoderConfig):
    """A :class:`~zoo.config.DecoderConfig` whose components default to GPT-J's."""

    architecture: ClassVar[str] = "gptj"

    block: str = "parallel_shared"
    positions: str = "rotary"
    activation: Activation = "gelu_tanh"
    bias: bool = False  # q/k/v and the attention output
    mlp_bias: bool | None = True
    norm_bias: bool | None = True
    head_bias: bool = True
    tie_embeddings: bool = False


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [ArchitectureSpec(
        name="gptj", config="oot_plugins.gptj:GPTJConfig", model="zoo.nn.decoder:DecoderLM",
        description="GPT-J: one LayerNorm for parallel attention and MLP, interleaved rotary",
        checkpoint_layouts={"hf-gptj": "oot_plugins.gptj.convert:HF_GPTJ"},
    )]  # fmt: skip


@hookimpl
def zoo_models() -> list[ModelSpec]:
    return [ModelSpec(
        name="gptj-tiny", architecture="gptj",
        description="a tiny GPT-J: heads of 44 features, 30 of them rotary",
        config={"vocab_size": 300, "context_length": 128, "d_model": 88, "n_heads": 2,
                "n_layers": 2, "d_ff": 128, "rotary_dim": 30},
    )]  # fmt: skip
