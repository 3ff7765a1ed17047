"""OLMo-2 (OLMo et al., 2025): Llama's components with the norms moved after attention and
the MLP, inside the residual (no norm before either), and queries and keys RMS-normalised
over their full projected width (every head at once) before rotary positions."""

from __future__ import annotations

from zoo.plugin.family import declare_family

from .config import Olmo2Config

REPO, REVISION = "allenai/OLMo-2-0425-1B-Instruct", "48d788eca847d4d7548f375ad03d3c9312f6139e"

family = declare_family(
    Olmo2Config,
    layout=("olmo2", "zoo_plugins.olmo2.convert:HF_OLMO2"),
    description="OLMo-2: Llama with norms after each branch and full-width q/k norms",
    repo=REPO,
    revision=REVISION,
    tokenizer_description="OLMo-2 byte-level BPE (cl100k-based) with its chat template",
)
