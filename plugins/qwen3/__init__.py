"""Qwen3 (Qwen team, 2025): Qwen2 without q/k/v biases, with heads 128 wide apart from the
model width, and each head's queries and keys RMS-normalised before rotary positions."""

from __future__ import annotations

from zoo.plugin.family import declare_family

from .config import Qwen3Config

REPO, REVISION = "Qwen/Qwen3-0.6B", "c1899de289a04d12100db370d81485cdf75e47ca"

family = declare_family(
    Qwen3Config,
    layout=("qwen3", "zoo_plugins.qwen3.convert:HF_QWEN3"),
    description="Qwen3: Llama with q/k norms and head_dim apart from the width",
    repo=REPO,
    revision=REVISION,
    tokenizer_description="Qwen3 byte-level BPE with its chat template",
)
