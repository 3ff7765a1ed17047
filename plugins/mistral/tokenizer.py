"""Mistral v0.3's tokenizer: the files of its Hub repo at the pinned revision (or of a checkpoint
folder holding them)."""

from __future__ import annotations

from pathlib import Path

from zoo.tokenizers import Tokenizer
from zoo.tokenizers.repo import repo_tokenizer

from . import MISTRAL_7B, REVISION


def load(directory: str | Path | None = None) -> Tokenizer:
    return repo_tokenizer(MISTRAL_7B, name="mistral-v0.3", revision=REVISION, directory=directory)
