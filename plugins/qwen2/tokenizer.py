"""Qwen2.5's tokenizer: the files of its Hub repo at the pinned revision (or of a checkpoint
folder holding them)."""

from __future__ import annotations

from pathlib import Path

from zoo.tokenizers import Tokenizer
from zoo.tokenizers.repo import repo_tokenizer

from . import QWEN25_05B, REVISION


def load(directory: str | Path | None = None) -> Tokenizer:
    return repo_tokenizer(
        QWEN25_05B,
        name="qwen2.5",
        revision=REVISION,
        extra=("generation_config.json",),
        directory=directory,
    )
