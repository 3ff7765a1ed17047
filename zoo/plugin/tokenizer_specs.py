"""The tokenizer of a Hugging Face model repo, declared for a named model: its
``tokenizer.json``, ``tokenizer_config.json`` (roles, chat template) and, where the repo has
one, ``generation_config.json`` (end ids), fetched once at a pinned revision and cached, or read
from a checkpoint folder that holds them.

A plugin declares one with :func:`repo_tokenizer_spec`; this module imports nothing heavy, so
a plugin's hooks stay light. The Hub client that fetches the files,
:func:`zoo.hub.tokenizer_files.repo_tokenizer`, stands above the plugin contract: the factory
names it by a lazy ``"module:function"`` reference, as specs name the code they declare, and
it is imported when the tokenizer is first made."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from .._lazy import resolve
from .specs import TokenizerSpec

if TYPE_CHECKING:
    from ..tokenizers.base import Tokenizer

__all__ = ["RepoTokenizer", "repo_tokenizer_spec"]


@dataclasses.dataclass(frozen=True)
class RepoTokenizer:
    """A tokenizer factory: :func:`zoo.hub.tokenizer_files.repo_tokenizer` of one repo at one
    revision."""

    repo: str
    name: str
    revision: str = "main"
    extra: tuple[str, ...] = ()

    #: What makes the tokenizer (fetching its files from the Hub), imported on first use.
    make: ClassVar[str] = "zoo.hub.tokenizer_files:repo_tokenizer"

    def __call__(self, directory: str | os.PathLike[str] | None = None) -> Tokenizer:
        make: Callable[..., Tokenizer] = resolve(self.make)
        return make(
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
