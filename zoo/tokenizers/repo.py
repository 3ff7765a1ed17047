"""The tokenizer of a Hugging Face model repo, for a named model: its ``tokenizer.json``,
``tokenizer_config.json`` (roles, chat template) and, where the repo has one,
``generation_config.json`` (end ids), fetched once at a pinned revision and cached, or read
from a checkpoint folder that holds them.

A plugin declares one with :func:`repo_tokenizer_spec`; this module imports nothing heavy, so
a plugin's hooks stay light (the files are read when the tokenizer is first made)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..plugin.specs import TokenizerSpec

if TYPE_CHECKING:
    from .base import Tokenizer

__all__ = ["RepoTokenizer", "repo_tokenizer", "repo_tokenizer_spec"]


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
    from .hub import hub_files
    from .pretrained import TOKENIZER_CONFIG, from_pretrained, is_pretrained

    if directory is not None and is_pretrained(Path(directory)):
        return from_pretrained(Path(directory), name=name)
    files = ["tokenizer.json", TOKENIZER_CONFIG, *extra]
    fix = "or pass directory=... holding the repo's tokenizer files"
    paths = hub_files(repo, files, revision=revision, what=f"{name} tokenizer", fix=fix)
    return from_pretrained(
        paths[0].parent, name=name, description=f"{name}: the tokenizer of {repo}@{revision[:12]}"
    )


@dataclasses.dataclass(frozen=True)
class RepoTokenizer:
    """A tokenizer factory: :func:`repo_tokenizer` of one repo at one revision."""

    repo: str
    name: str
    revision: str = "main"
    extra: tuple[str, ...] = ()

    def __call__(self, directory: str | os.PathLike[str] | None = None) -> Tokenizer:
        return repo_tokenizer(
            self.repo, name=self.name, revision=self.revision, extra=self.extra, directory=directory
        )


def repo_tokenizer_spec(
    name: str,
    repo: str,
    *,
    revision: str = "main",
    extra: tuple[str, ...] = (),
    description: str = "",
) -> TokenizerSpec:
    """The :class:`~zoo.plugin.specs.TokenizerSpec` of the Hugging Face tokenizer of the Hub model
    repo ``repo`` (``tokenizer.json``, ``tokenizer_config.json`` with its chat template, and
    ``extra`` files the repo has, e.g. ``generation_config.json`` for its end ids) at
    ``revision``, fetched once and cached; a checkpoint folder holding those files wins
    (``zoo.load`` passes it)."""
    return TokenizerSpec(
        name=name,
        factory=RepoTokenizer(repo, name, revision, extra),
        description=f"{description}, from {repo}" if description else f"from {repo}",
        reads_checkpoint=True,
        checkpoint_files=("tokenizer.json", "tokenizer_config.json"),
    )
