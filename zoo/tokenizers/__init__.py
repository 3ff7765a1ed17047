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
classes that need them are imported on first use. It stands on :mod:`zoo.errors` alone: a
tokenizer stored by name is made by the caller (``load_tokenizer(..., by_name=...)``), and
fetching tokenizer files from the Hub lives in :mod:`zoo.hub.tokenizer_files`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
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
    from .chat_files import with_chat_template
    from .hf_backend import HFTokenizer
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
    "load_directory",
    "load_folder",
    "load_tokenizer",
    "save_tokenizer",
    "with_chat_template",
]

#: Imported on first use: they import tiktoken, ``tokenizers`` or jinja2.
_LAZY = {
    "ChatTemplate": "zoo.tokenizers.chat:ChatTemplate",
    "HFTokenizer": "zoo.tokenizers.hf_backend:HFTokenizer",
    "from_pretrained": "zoo.tokenizers.pretrained:from_pretrained",
    "load_folder": "zoo.tokenizers.pretrained:load_folder",
    "SubwordBPE": "zoo.tokenizers.subword:SubwordBPE",
    "TiktokenTokenizer": "zoo.tokenizers.tiktoken_backend:TiktokenTokenizer",
    "with_chat_template": "zoo.tokenizers.chat_files:with_chat_template",
}

__getattr__ = lazy_attributes(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(__all__)
