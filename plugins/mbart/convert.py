"""The Hugging Face mBART layout (``MBartForConditionalGeneration``, ``facebook/mbart-*``):
BART's (:func:`zoo.checkpoint.hf_seq2seq.bart_layout`) plus each stack's final
``layer_norm``."""

from __future__ import annotations

from zoo.checkpoint.hf_seq2seq import bart_layout

from .config import MBartConfig

#: What transformers' ``MBartForConditionalGeneration`` computes that older config.json files
#: still spell: pre-LN layers, final norms, an embedding norm, learned positions from row 2.
_CHECKED = {
    "normalize_before": True,
    "add_final_layer_norm": True,
    "normalize_embedding": True,
    "static_position_embeddings": False,
    "add_bias_logits": False,
    "extra_pos_embeddings": 2,
}

HF_MBART = bart_layout(
    MBartConfig,
    family="mBART",
    model_type="mbart",
    architecture="MBartForConditionalGeneration",
    checked=_CHECKED,
    final_norms=True,
)
