"""Mixtral (Jiang et al., 2024): Mistral's attention with a sparse mixture of eight SwiGLU
experts in every block, each token routed to two of them."""

from __future__ import annotations

from zoo.plugin.family import declare_family

from .config import MixtralConfig

REPO, REVISION = "mistralai/Mixtral-8x7B-v0.1", "fc7ac94680e38d7348cfa806e51218e6273104b0"

family = declare_family(
    MixtralConfig,
    layout=("mixtral", "zoo_plugins.mixtral.convert:HF_MIXTRAL"),
    description="Mixtral: Mistral, top-2 of 8 experts",
    repo=REPO,
    revision=REVISION,
    tokenizer_description="Mixtral SentencePiece BPE (32000 ids)",
    tokenizer_files=(),
    lora_targets=("attn.qkv", "attn.proj"),  # the experts are stacked tensors, not linears
)
