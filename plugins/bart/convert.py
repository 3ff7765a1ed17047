"""The Hugging Face BART layout (``BartForConditionalGeneration``, ``facebook/bart-*``):
BART's layer keys, one ``model.shared`` embedding tied to the head, each stack's learned
positions (``max_position_embeddings + 2`` rows) and ``layernorm_embedding``, and
``final_logits_bias`` (zeros where a checkpoint lacks it, as transformers loads it); the
layout itself is :func:`zoo.checkpoint.hf_seq2seq.bart_layout`, which mBART shares."""

from __future__ import annotations

from zoo.checkpoint.hf_seq2seq import bart_layout

from .config import BartConfig

#: What transformers' ``BartForConditionalGeneration`` computes that older config.json files
#: still spell: post-LN layers, no final norms, an embedding norm, learned positions from row 2.
_CHECKED = {
    "normalize_before": False,
    "add_final_layer_norm": False,
    "normalize_embedding": True,
    "static_position_embeddings": False,
    "add_bias_logits": False,
    "extra_pos_embeddings": 2,
}

HF_BART = bart_layout(
    BartConfig,
    family="BART",
    model_type="bart",
    architecture="BartForConditionalGeneration",
    checked=_CHECKED,
)
