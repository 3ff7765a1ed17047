"""A conversation as a chat template sees it, prepared as ``transformers`` prepares it:
message objects (dataclasses, pydantic models) made dicts, every value rebuilt from plain JSON
types (a template sees no object's methods), ``None`` values dropped and the reasoning copied
under the names templates read."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ChatTemplateError

__all__ = ["REASONING_FIELDS", "plain", "plain_messages"]

#: Reasoning is passed under these names; templates read the first (transformers 5).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _as_dicts(value: Any) -> Any:
    """Message objects (dataclasses, pydantic models such as the OpenAI client's) as dicts,
    everything else as it is."""
    exact = type(value)  # (JSON's own types first, the usual case: the same result)
    if exact is dict:
        return {key: _as_dicts(item) for key, item in value.items()}
    if exact is list:
        return [_as_dicts(item) for item in value]
    return value if exact is str else _other_as_dicts(value)


def _other_as_dicts(value: Any) -> Any:
    """:func:`_as_dicts` of what is not a ``dict``, ``list`` or ``str``."""
    if isinstance(value, Mapping):
        return {key: _as_dicts(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_dicts(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_as_dicts(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _as_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _as_dicts(value.model_dump())
    return value


#: Subclasses of the JSON scalars (a ``str`` enum, an ``IntEnum``) as the plain value.
_SCALARS: tuple[tuple[type, Any], ...] = (
    (str, str.__str__),
    (int, int.__int__),
    (float, float.__float__),
)


def plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types only, so a template sees no object's methods;
    anything else becomes ``"<TypeName>"`` (as ``transformers`` does)."""
    exact = type(value)  # (JSON's own containers first, the usual case: the same result)
    if exact is dict:
        return {plain(key): plain(item) for key, item in value.items()}
    if exact is list:
        return [plain(item) for item in value]
    return _plain_other(value)


def _plain_other(value: Any) -> Any:
    """:func:`plain` of what is not a ``dict`` or ``list``."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind, convert in _SCALARS:
        if isinstance(value, kind):
            return convert(value)
    if isinstance(value, Mapping):
        return {plain(key): plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    return _plain_object(value)


def _plain_object(value: Any) -> Any:
    """A numpy scalar, dataclass or pydantic model as plain data; anything else as
    ``"<TypeName>"``."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain(value.model_dump())
    return f"<{type(value).__name__}>"


def plain_messages(messages: Any) -> list[dict[str, Any]]:
    """The conversation as a template sees it: each message a dict of plain data, keys whose
    value is ``None`` dropped (an OpenAI ``content=None``), and the reasoning copied under
    ``reasoning_content`` and ``thinking`` when given under any of their names.

    Raises:
        ChatTemplateError: not a list of messages (dicts, dataclasses or pydantic models).
    """
    messages = _as_dicts(getattr(messages, "messages", messages))
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ChatTemplateError(
            "messages must be a list of messages such as "
            f"[{{'role': 'user', 'content': 'Hi'}}], got {type(messages).__name__}"
        )
    if not messages:
        raise ChatTemplateError("the conversation is empty: give at least one message")
    chat = []
    for i, message in enumerate(messages):
        if isinstance(message, (list, tuple)):
            raise ChatTemplateError(
                "one conversation at a time: messages is a list of messages, not a batch of "
                "conversations (render each conversation on its own)"
            )
        if not isinstance(message, dict):
            raise ChatTemplateError(
                f"message {i} must be a dict with 'role' and 'content', got "
                f"{type(message).__name__}"
            )
        message = {plain(key): plain(value) for key, value in message.items() if value is not None}
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat
