"""Errors raised by zoo tokenizers. Each says what was wrong and how to fix it."""

from __future__ import annotations

from ..errors import ZooError

__all__ = [
    "ChatTemplateError",
    "TokenizerError",
    "TokenizerInputError",
    "TokenizerUnavailableError",
    "VocabularyFileError",
]


class TokenizerError(ZooError, ValueError):
    """A tokenizer was given something it cannot use (base class of the errors below)."""


class TokenizerInputError(TokenizerError, TypeError):
    """Text that is not a ``str``, or ids that are not integers of the vocabulary."""


class VocabularyFileError(TokenizerError):
    """A vocabulary file is missing, corrupted (wrong sha256) or does not fit (wrong size)."""


class TokenizerUnavailableError(TokenizerError):
    """The tokenizer cannot be created here: its files cannot be fetched, or it must be trained
    first."""


class ChatTemplateError(TokenizerError):
    """A chat template is missing, is not valid Jinja, refuses the conversation
    (``raise_exception``), or was stopped by the sandbox."""
