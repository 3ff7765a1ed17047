"""Qwen2 and Qwen2.5 (Yang et al., 2024): Llama's composition with biases on the query, key
and value projections. Declarations only; the layout loads when first used."""

from __future__ import annotations

from zoo.plugin.family import declare_family

from .config import Qwen2Config

REPO, REVISION = "Qwen/Qwen2.5-0.5B-Instruct", "7ae557604adf67be50417f59c2c2f167def9a775"

family = declare_family(
    Qwen2Config,
    layout=("qwen2", "zoo_plugins.qwen2.convert:HF_QWEN2"),
    description="Qwen2/2.5: Llama with q/k/v biases (RoPE, RMSNorm, SwiGLU, GQA)",
    repo=REPO,
    revision=REVISION,
    tokenizer="qwen2.5",
    tokenizer_description="Qwen2.5 byte-level BPE with its chat template",
)
