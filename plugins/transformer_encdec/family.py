"""A Hugging Face encoder-decoder family (Marian, BART, T5) declared in one call: the shared
encoder-decoder (:class:`~zoo_plugins.transformer_encdec.model.EncoderDecoder`) with the
family's config class, its checkpoint layout, and the components it supplies (a position
scheme zoo.nn lacks). Declarations only: nothing here imports torch or the layout.

Example (the ``t5`` plugin's ``__init__.py``)::

    family = declare_encdec_family(
        T5Config,
        layout=("t5", "zoo_plugins.t5.convert:HF_T5"),
        description="T5: pre-norm RMSNorm encoder-decoder, relative position bias",
        components=(
            ComponentSpec("positions", "t5_relative", "zoo_plugins.t5.positions:t5_relative"),
        ),
    )
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from zoo.plugin.family import Family, declare_family
from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ComponentSpec

__all__ = ["ENCODER_DECODER", "EncoderDecoderFamily", "declare_encdec_family"]

#: The model class every encoder-decoder family builds.
ENCODER_DECODER = "zoo_plugins.transformer_encdec.model:EncoderDecoder"


@dataclasses.dataclass(frozen=True)
class EncoderDecoderFamily(Family):
    """A :class:`~zoo.plugin.family.Family` that also supplies components (the plugin itself,
    named by its entry point)."""

    components: tuple[ComponentSpec, ...] = ()

    @hookimpl
    def zoo_components(self) -> list[ComponentSpec]:
        """The components the family supplies."""
        return list(self.components)


#: The layers a LoRA adapts by default in an encoder-decoder: zoo's defaults (attention's and
#: the feed-forward's projections, ``zoo.adapters.lora_config.DEFAULT_TARGETS``, not imported
#: here: it would load torch with the plugin) and the decoder's cross-attention (peft's
#: q/k/v/out_proj of ``encoder_attn`` in Marian and BART, ``EncDecAttention`` in T5).
LORA_TARGETS = (
    "attn.qkv", "attn.proj", "ffn.fc", "ffn.proj",
    "cross_attn.q", "cross_attn.kv", "cross_attn.proj",
)  # fmt: skip


def declare_encdec_family(
    config: type,
    *,
    layout: tuple[str, str],
    description: str,
    components: Sequence[ComponentSpec] = (),
    lora_targets: tuple[str, ...] = LORA_TARGETS,
) -> EncoderDecoderFamily:
    """The encoder-decoder architecture of ``config`` (its ``architecture`` is the name),
    reading the Hugging Face ``model_type`` of ``layout`` (``(model_type, "module:KEYMAP")``,
    as for :func:`~zoo.plugin.family.declare_family`), and the ``components`` it supplies.
    No tokenizer is declared: the families' tokenizers (SentencePiece files) come with their
    checkpoints. A LoRA adapts ``lora_targets`` by default: the self-attention's, the
    cross-attention's and the feed-forward's projections."""
    family = declare_family(
        config,
        layout=layout,
        description=description,
        model=ENCODER_DECODER,
        lora_targets=lora_targets,
    )
    return EncoderDecoderFamily(family.architecture, family.tokenizers, tuple(components))
