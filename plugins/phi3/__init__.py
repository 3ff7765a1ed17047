"""Phi-3 (Microsoft, 2024): Llama's composition with the query, key and value projections
fused into one ``qkv_proj`` and the gate and up projections into one ``gate_up_proj`` in its
checkpoints, and (the 4k models) a sliding window of 2047 keys on every layer."""

from __future__ import annotations

from zoo.plugin.family import declare_family

from .config import Phi3Config

REPO, REVISION = "microsoft/Phi-3-mini-4k-instruct", "f39ac1d28e925b323eae81227eaba4464caced4e"

family = declare_family(
    Phi3Config,
    layout=("phi3", "zoo_plugins.phi3.convert:HF_PHI3"),
    description="Phi-3: Llama with fused qkv and gate_up projections in its checkpoints",
    repo=REPO,
    revision=REVISION,
    tokenizer="phi-3",
    tokenizer_description="Phi-3 SentencePiece BPE (32064 ids) with its chat template",
)
