"""GPT-NeoX (Black et al., 2022) and Pythia (Biderman et al., 2023): LayerNorm, a GELU MLP,
rotary positions on a quarter of each head, and attention and MLP side by side (a parallel
residual). Declarations only; the layout loads when first used."""

from __future__ import annotations

from zoo.plugin.family import declare_family

from .config import GPTNeoXConfig

REPO, REVISION = "EleutherAI/pythia-160m", "50f5173d932e8e61f858120bcb800b97af589f46"

family = declare_family(
    GPTNeoXConfig,
    layout=("gpt_neox", "zoo_plugins.gpt_neox.convert:HF_GPT_NEOX"),
    description="GPT-NeoX: parallel residual, partial rotary, LayerNorm, GELU MLP",
    repo=REPO,
    revision=REVISION,
    tokenizer="pythia",
    tokenizer_description="GPT-NeoX byte-level BPE (50277 ids)",
    tokenizer_files=(),
)
