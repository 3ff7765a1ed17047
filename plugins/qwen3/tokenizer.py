"""Qwen3's tokenizer: the files of its Hub repo at the pinned revision (or of a checkpoint
folder holding them)."""

from __future__ import annotations

from pathlib import Path

from zoo.tokenizers import Tokenizer
from zoo.tokenizers.repo import repo_tokenizer

from . import QWEN3_06B, REVISION


def load(directory: str | Path | None = None) -> Tokenizer:
    return repo_tokenizer(
        QWEN3_06B,
        name="qwen3",
        revision=REVISION,
        extra=("generation_config.json",),
        directory=directory,
    )
