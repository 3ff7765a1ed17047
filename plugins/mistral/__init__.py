"""Mistral 7B (Jiang et al., 2023): Llama's composition with an optional sliding attention
window (v0.1 attends to the last 4096 keys; v0.3 to all of them)."""

from __future__ import annotations

from zoo.plugin.family import declare_family

from .config import MistralConfig

REPO, REVISION = "mistralai/Mistral-7B-v0.3", "caa1feb0e54d415e2df31207e5f4e273e33509b1"

family = declare_family(
    MistralConfig,
    layout=("mistral", "zoo_plugins.mistral.convert:HF_MISTRAL"),
    description="Mistral: Llama with a sliding window",
    repo=REPO,
    revision=REVISION,
    tokenizer="mistral-v0.3",
    tokenizer_description="Mistral v0.3 SentencePiece BPE (32768 ids)",
    tokenizer_files=(),
)
