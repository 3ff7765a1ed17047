"""The tokenizer of a Hugging Face model repo, for a named model: its ``tokenizer.json``,
``tokenizer_config.json`` (roles, chat template) and, where the repo has one,
``generation_config.json`` (end ids), fetched once at a pinned revision and cached, or read
from a checkpoint folder that holds them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .base import Tokenizer
from .hub import hub_files
from .pretrained import TOKENIZER_CONFIG, from_pretrained, is_pretrained

__all__ = ["repo_tokenizer"]


def repo_tokenizer(
    repo: str,
    *,
    name: str,
    revision: str = "main",
    extra: Sequence[str] = (),
    directory: str | os.PathLike[str] | None = None,
) -> Tokenizer:
    """The tokenizer files of ``repo`` (``extra``: more files the repo has, e.g.
    ``generation_config.json``) as a zoo tokenizer named ``name``; a ``directory`` holding
    Hugging Face tokenizer files (a checkpoint's folder) wins over the Hub.

    Raises:
        TokenizerUnavailableError: a file is neither cached nor downloadable.
    """
    if directory is not None and is_pretrained(Path(directory)):
        return from_pretrained(Path(directory), name=name)
    files = ["tokenizer.json", TOKENIZER_CONFIG, *extra]
    fix = "or pass directory=... holding the repo's tokenizer files"
    paths = hub_files(repo, files, revision=revision, what=f"{name} tokenizer", fix=fix)
    return from_pretrained(
        paths[0].parent, name=name, description=f"{name}: the tokenizer of {repo}@{revision[:12]}"
    )
