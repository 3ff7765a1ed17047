"""A tokenizer's chat template kept with its saved files, and a tokenizer given another
template (``zoo train --chat-template FILE``), so that what a model was fine-tuned on is
what ``zoo chat`` renders later."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ChatTemplateError, TokenizerError, VocabularyFileError

if TYPE_CHECKING:
    from .base import Tokenizer
    from .chat import ChatTemplate

__all__ = ["chat_from_manifest", "chat_manifest", "read_template_file", "with_chat_template"]


def chat_manifest(tokenizer: Tokenizer) -> dict[str, Any]:
    """The manifest entries (``zoo_tokenizer.json``) that keep ``tokenizer``'s chat
    template(s) and the special-token strings they see; none when it has no template."""
    chat: ChatTemplate | None = getattr(tokenizer, "_chat", None)
    if chat is None:
        return {}
    return {"chat_template": dict(chat.templates), "template_tokens": dict(chat.tokens)}


def chat_from_manifest(directory: Path, manifest: Mapping[str, Any]) -> ChatTemplate | None:
    """The chat template :func:`chat_manifest` kept, or ``None``.

    Raises:
        VocabularyFileError: the kept template is malformed.
    """
    if manifest.get("chat_template") is None:
        return None
    from .chat import ChatTemplate
    from .vocab_files import MANIFEST

    try:
        return ChatTemplate(manifest["chat_template"], manifest.get("template_tokens", {}))
    except TokenizerError as exc:
        raise VocabularyFileError(f"{directory / MANIFEST}: {exc}") from None


def with_chat_template(tokenizer: Tokenizer, source: str) -> Tokenizer:
    """A copy of ``tokenizer`` whose chat template is ``source`` (Jinja, rendered in the
    sandbox of :mod:`zoo.tokenizers.chat`) in place of its own, seeing its special-token
    strings (``eos_token``...). The copy saves its files with the template (it is no longer
    made from its name alone), so a checkpoint saved with it keeps the template.

    Raises:
        ChatTemplateError: ``source`` is not a string, or not a template Jinja can compile.
    """
    from .chat import ChatTemplate, compile_template

    if not isinstance(source, str) or not source.strip():
        raise ChatTemplateError("a chat template is the non-empty Jinja source of a template")
    compile_template(source)  # a syntax error now, not at the first conversation
    made = copy.copy(tokenizer)
    made._chat = ChatTemplate({"default": source}, tokenizer._template_tokens())
    made.by_name = False
    return made


def read_template_file(path: str | Path) -> str:
    """The Jinja source of a chat template file (``--chat-template FILE``), compiled once to
    check it.

    Raises:
        ChatTemplateError: the file cannot be read, is over the sandbox's source limit, is
            not UTF-8, or is not a template Jinja compiles.
    """
    from .chat import compile_template
    from .chat_limits import MAX_SOURCE

    path = Path(path)
    try:
        if path.stat().st_size > 4 * MAX_SOURCE:  # (UTF-8: at most 4 bytes a character)
            raise ChatTemplateError(f"{path} is over {MAX_SOURCE:,} characters")
        source = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"cannot read the chat template {path}: {exc}") from None
    if not source.strip():
        raise ChatTemplateError(f"{path} is empty; a chat template is Jinja source")
    try:
        compile_template(source)
    except ChatTemplateError as exc:
        raise ChatTemplateError(f"{path}: {exc}") from None
    return source
