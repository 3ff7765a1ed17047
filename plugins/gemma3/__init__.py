"""Gemma 3 text (Google DeepMind, 2025): Gemma 2's four norms per block with ``(1 + w)``
RMSNorm, GeGLU and scaled, tied embeddings, plus per-head q/k norms, five sliding-window
layers to one global layer, and a rotary base per kind of layer (10,000 on sliding layers,
1,000,000 on global ones). No soft-capping. Declarations only; the layout loads when used."""

from __future__ import annotations

from zoo.plugin.family import declare_family

from .config import Gemma3Config

REPO, REVISION = "google/gemma-3-1b-it", "dcc83ea841ab6100d6b47a070329e1ba4cf78752"

family = declare_family(
    Gemma3Config,
    layout=("gemma3_text", "zoo_plugins.gemma3.convert:HF_GEMMA3"),
    description="Gemma 3 text: sandwich-normed (1+w) blocks, q/k norms, sliding and "
    "global layers with a rotary base each, GeGLU, scaled tied embeddings",
    repo=REPO,
    revision=REVISION,
    tokenizer_description="Gemma 3 SentencePiece-style BPE, 262,144 ids, with its chat template",
)
