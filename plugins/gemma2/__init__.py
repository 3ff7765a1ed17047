"""Gemma 2 (Google, 2024): a decoder whose blocks put an RMSNorm before and after each
branch, scaled by ``1 + weight``; a GeGLU feed-forward with the tanh GELU; heads apart from
the model width, scores scaled by ``query_pre_attn_scalar ** -0.5`` and soft-capped, logits
soft-capped; sliding and full attention alternating layer by layer; token embeddings scaled
by ``sqrt(d_model)`` and tied to the head; no biases."""

from __future__ import annotations

from zoo.plugin.family import declare_family

from .config import Gemma2Config

REPO, REVISION = "google/gemma-2-2b-it", "299a8560bedf22ed1c72a8a11e7dce4a7f9f51f8"

family = declare_family(
    Gemma2Config,
    layout=("gemma2", "zoo_plugins.gemma2.convert:HF_GEMMA2"),
    description="Gemma 2: sandwich norms (1+w), GeGLU, soft-capped scores and logits, "
    "alternating sliding/full layers",
    repo=REPO,
    revision=REVISION,
    tokenizer_description="Gemma 2 SentencePiece BPE (256000 ids) with its chat template",
)
