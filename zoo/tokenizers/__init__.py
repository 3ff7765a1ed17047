"""Tokenizers: one protocol, thin wrappers over tiktoken and the ``tokenizers`` library.

    >>> import zoo
    >>> tok = zoo.tokenizer("gpt2-124m")
    >>> tok.encode("Every effort moves you")
    [6109, 3626, 6100, 345]
    >>> batch = tok.encode_padded(["Hello world", "Hi"])   # input_ids, attention_mask tensors

Each plugin declares its own tokenizer (``zoo_tokenizers`` hook); this package holds what they
share: :class:`Tokenizer` (the protocol), :class:`TiktokenTokenizer`, :class:`HFTokenizer`,
the trainable :class:`SubwordBPE`, saving / loading next to weights
(:func:`save_tokenizer`, :func:`load_tokenizer`, :func:`load_directory`), Hugging Face
tokenizer folders with their chat templates (:func:`from_pretrained`, :func:`load_folder`;
:class:`ChatTemplate` renders conversations as ``transformers`` does, in a sandbox).

Importing this package imports neither tiktoken, ``tokenizers``, jinja2 nor torch; the
classes that need them are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import ROLES, Tokenizer, check_fits
from .errors import (
    ChatTemplateError,
    TokenizerError,
    TokenizerInputError,
    TokenizerUnavailableError,
    VocabularyFileError,
)
from .serialization import load_directory, load_tokenizer, save_tokenizer

if TYPE_CHECKING:
    from .chat import ChatTemplate
    from .hf_backend import HFTokenizer
    from .hub import hub_files
    from .pretrained import from_pretrained, load_folder
    from .subword import SubwordBPE
    from .tiktoken_backend import TiktokenTokenizer

__all__ = [
    "ROLES",
    "ChatTemplate",
    "ChatTemplateError",
    "HFTokenizer",
    "SubwordBPE",
    "TiktokenTokenizer",
    "Tokenizer",
    "TokenizerError",
    "TokenizerInputError",
    "TokenizerUnavailableError",
    "VocabularyFileError",
    "check_fits",
    "from_pretrained",
    "hub_files",
    "load_directory",
    "load_folder",
    "load_tokenizer",
    "save_tokenizer",
]

_LAZY = {
    "ChatTemplate": ".chat",
    "HFTokenizer": ".hf_backend",
    "from_pretrained": ".pretrained",
    "load_folder": ".pretrained",
    "SubwordBPE": ".subword",
    "TiktokenTokenizer": ".tiktoken_backend",
    "hub_files": ".hub",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
