"""Chat fine-tuning data read and checked one line at a time (no torch: ``zoo train --task
chat`` checks the file before anything loads), each line against OpenAI's fine-tuning format
(``"tool_calls": "rm -rf"``, a string, was once accepted; a lone surrogate was found
later, without its line; the whole file, every parsed line and every encoding were held at
once, many times the file's size: docs/benchmarks.md, "Figures behind design choices").

A line is ``{"messages": [...], "tools": [...]}`` (``tools`` optional). A message has:

- ``role``: ``system``, ``developer``, ``user``, ``assistant`` or ``tool``;
- ``content``: a string (an assistant's may be ``null`` beside ``tool_calls``);
- ``name``: a string; ``weight`` (an assistant's): 0 or 1, whether its reply is learned;
- ``tool_calls`` (an assistant's): a non-empty list of ``{"id": str, "type": "function",
  "function": {"name": str, "arguments": str}}`` (``arguments`` is the JSON text);
- ``tool_call_id`` (a tool's): a string.

A tool is ``{"type": "function", "function": {"name": str, "description": str,
"parameters": {...}}}``. Every string must be encodable as UTF-8: a lone surrogate (``"\\ud800"``
in the JSON) is refused with the place it is in. Each check raises ``ValueError`` with the
reason; the reader adds the file and the line.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import jsonfile
from .data_files import DataError

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_MESSAGES",
    "ROLES",
    "Conversation",
    "conversation",
    "count_conversations",
    "iter_conversations",
]

#: The most messages one line holds.
MAX_MESSAGES = 1024
#: The roles a message may have, and the keys a message and a line may hold.
ROLES = ("system", "developer", "user", "assistant", "tool")
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "weight"})
_LINE_KEYS = frozenset({"messages", "tools"})
_CALL_KEYS = frozenset({"id", "type", "function"})
_TOOL_KEYS = frozenset({"type", "function"})
#: A JSON escape of a UTF-16 surrogate: only such a line can hold a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


@dataclasses.dataclass(frozen=True)
class Conversation:
    """One checked line: its number, its messages and its tools (``None``: none)."""

    line: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


def _kind(value: Any) -> str:
    """A JSON value's type, as a person reads it."""
    names = {str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    names.update({list: "a list", dict: "an object", type(None): "null"})
    return names.get(type(value), type(value).__name__)


def _string(value: Any, where: str, *, empty: bool = True) -> None:
    if not isinstance(value, str) or (not empty and not value):
        wanted = "a string" if empty else "a non-empty string"
        raise ValueError(f"{where} must be {wanted}, got {_kind(value)}")


def _keys(value: Any, allowed: frozenset[str], where: str, what: str) -> None:
    if type(value) is dict and value.keys() <= allowed:  # (the common case, first)
        return
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be {what}, got {_kind(value)}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ValueError(
            f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; it holds "
            f"{', '.join(sorted(allowed))}"
        )


def _function(value: Any, where: str, required: tuple[str, ...]) -> None:
    """A tool call's or a tool's ``function`` object."""
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object, got {_kind(value)}")
    for key in required:
        if key not in value:
            raise ValueError(f"{where} has no {key!r}")
    _string(value.get("name"), f"{where}.name", empty=False)
    for key in ("arguments", "description"):
        if key in value:
            _string(value[key], f"{where}.{key}")
    if "parameters" in value and not isinstance(value["parameters"], dict):
        raise ValueError(f"{where}.parameters must be an object (a JSON schema)")


def _tool_calls(calls: Any, where: str) -> None:
    """An assistant message's ``tool_calls``: OpenAI's list of function calls."""
    if not isinstance(calls, list) or not calls:
        raise ValueError(
            f"{where}.tool_calls must be a non-empty list of calls "
            '[{"id": ..., "type": "function", "function": {"name": ..., "arguments": "{...}"}}]'
            f", got {_kind(calls)}"
        )
    for i, call in enumerate(calls):
        at = f"{where}.tool_calls[{i}]"
        _keys(call, _CALL_KEYS, at, 'an object {"id", "type", "function"}')
        _string(call.get("id"), f"{at}.id", empty=False)
        if call.get("type") != "function":
            raise ValueError(f"{at}.type must be 'function', got {call.get('type')!r}")
        _function(call.get("function"), f"{at}.function", ("name", "arguments"))


#: Keys only one role's messages hold, and that role.
_OWNED = {"tool_calls": "assistant", "weight": "assistant", "tool_call_id": "tool"}


def _message(message: Any, index: int) -> None:
    """Message ``index`` of a line, checked (a ``ValueError`` says why it is refused)."""
    plain = type(message) is dict and len(message) == 2 and type(message.get("content")) is str
    if plain and message.get("role") in ROLES:  # {"role": ..., "content": "..."}: all there is
        return
    where = f"message {index}"
    _keys(message, _MESSAGE_KEYS, where, "an object with 'role' and 'content'")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise ValueError(f"{where} has role {role!r}; roles are {', '.join(ROLES)}")
    where = f"{where} ({role})"
    for key, owner in _OWNED.items():
        if key in message and role != owner:
            raise ValueError(f"{where} has {key!r}, which only the {owner}'s messages have")
    if "tool_calls" in message:
        _tool_calls(message["tool_calls"], where)
    if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
        raise ValueError(
            f"{where} needs a string 'content' (null only beside 'tool_calls'), got "
            f"{_kind(content)}"
        )
    _optional(message, where)


def _optional(message: dict[str, Any], where: str) -> None:
    """A message's ``name``, ``tool_call_id`` and ``weight``, where given."""
    for key in ("name", "tool_call_id"):
        if key in message:
            _string(message[key], f"{where}.{key}")
    weight = message.get("weight", 1)
    if type(weight) is not int or weight not in (0, 1):
        raise ValueError(f"{where}.weight must be 0 or 1 (learn this reply or not), got {weight!r}")


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ValueError(f"'tools' must be a list of tools (JSON schemas), got {_kind(tools)}")
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        _keys(tool, _TOOL_KEYS, at, 'an object {"type": "function", "function": {...}}')
        if tool.get("type") != "function":
            raise ValueError(f"{at}.type must be 'function', got {tool.get('type')!r}")
        _function(tool.get("function"), f"{at}.function", ("name",))
    return tools


def conversation(record: Any, surrogates: bool, line: int) -> Conversation:
    """A parsed line, checked (a ``ValueError`` says why it is refused); ``surrogates``: the
    line's JSON escapes a surrogate, so its strings are checked for a lone one."""
    if surrogates:  # first: a message naming a key would show it
        _check_text(record, "")
    if not isinstance(record, dict):
        raise ValueError('a line is one JSON object: {"messages": [...]}')
    if not record.keys() <= _LINE_KEYS:
        unknown = sorted(set(record) - _LINE_KEYS)
        raise ValueError(
            f"unknown key(s) {', '.join(map(repr, unknown))}; a line holds 'messages' (and "
            "optionally 'tools')"
        )
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of messages")
    if len(messages) > MAX_MESSAGES:
        raise ValueError(f"{len(messages)} messages, more than {MAX_MESSAGES} in one line")
    learned = 0
    for i, message in enumerate(messages):
        _message(message, i)
        learned += message["role"] == "assistant" and message.get("weight", 1) == 1
    if not learned:
        raise ValueError(
            "no assistant message (or every one has weight 0): there is no reply to learn"
        )
    return Conversation(line, messages, _tools(record.get("tools")))


def _check_text(value: Any, where: str) -> None:
    """Refuse a string (key or value) that UTF-8 cannot encode: a lone surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{where or 'a key'} holds a lone surrogate ({value[exc.start]!r} at character "
                f"{exc.start}), which is not text: write the character itself, or its pair"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, f"{where}: a key" if where else "")
            _check_text(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_text(item, f"{where}[{i}]")


#: The largest conversations file and one conversation (line).
MAX_FILE_BYTES = 1 << 30
MAX_LINE_BYTES = 1 << 20


def iter_conversations(path: str | os.PathLike[str]) -> Iterator[Conversation]:
    """The conversations of a ``.jsonl`` file, one line at a time (nothing else of the file
    is held): each line read up to :data:`MAX_LINE_BYTES`, decoded, parsed and checked
    (:func:`zoo.train.chat_lines.conversation`).

    Raises:
        DataError: a folder, a file over :data:`MAX_FILE_BYTES`, or a line that is not a
            conversation (its number and why: too long, not UTF-8, not JSON, a wrong type).
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path} is a folder; chat fine-tuning reads one .jsonl file")
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        if os.fstat(handle.fileno()).st_size > MAX_FILE_BYTES:
            raise DataError(f"{path} is over {MAX_FILE_BYTES:,} bytes; split it or sample it")
        number = 0
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            try:
                found = _line(raw)
                checked = None if found is None else conversation(*found, number)
            except ValueError as exc:
                raise DataError(f"{path}, line {number}: {exc}") from None
            if checked is not None:
                yield checked


def _line(raw: bytes) -> tuple[Any, bool] | None:
    """A line's bytes (its line break included) parsed, and whether its JSON escapes a
    surrogate; ``None`` when blank. A ``ValueError`` says why it is refused."""
    if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
        raise ValueError(f"longer than {MAX_LINE_BYTES:,} bytes")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1}); convert the "
            "file to UTF-8"
        ) from None
    if not line.strip():
        return None
    try:
        record = jsonfile.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    return record, _SURROGATE_ESCAPE.search(line) is not None


def count_conversations(path: str | os.PathLike[str]) -> int:
    """Check every line of a ``.jsonl`` file in one streaming pass (see
    :func:`iter_conversations`) and count its conversations.

    Raises:
        DataError: a line that is not a conversation, or none at all.
    """
    count = sum(1 for _ in iter_conversations(path))
    if not count:
        raise DataError(f"{path} holds no conversation")
    return count
