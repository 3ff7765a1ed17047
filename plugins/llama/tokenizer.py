"""TinyLlama's tokenizer: the ``tokenizer.json`` of its Hub repo (or of a checkpoint
directory), through ``tokenizers``, fetched once and cached."""

from __future__ import annotations

from pathlib import Path

import tokenizers

from zoo.hub.tokenizer_files import hub_files
from zoo.tokenizers.hf_backend import TOKENIZER_FILE, HFTokenizer

from . import TINYLLAMA


def load(directory: str | Path | None = None) -> HFTokenizer:
    """The tokenizer in ``directory``, else the one of the TinyLlama repo (cached)."""
    if directory is not None and (Path(directory) / TOKENIZER_FILE).is_file():
        path = Path(directory) / TOKENIZER_FILE
    else:
        fix = "or pass directory=... holding its tokenizer.json"
        (path,) = hub_files(TINYLLAMA, [TOKENIZER_FILE], what="Llama tokenizer", fix=fix)
    return HFTokenizer(
        tokenizers.Tokenizer.from_file(str(path)),
        name="tinyllama",
        roles={"bos": "<s>", "eos": "</s>", "unk": "<unk>"},
        wrap=("bos", None),  # <s> first, as the Llama tokenizer adds it
        description=f"Llama SentencePiece BPE from {TINYLLAMA}",
    )
