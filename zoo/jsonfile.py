"""Reading JSON that zoo did not write itself (a file, a safetensors header's metadata, a
server's answer), bounded in size and depth.

Python's ``json`` parses nested arrays and objects by recursion: ``[[[...]]]`` 100,000 deep is
a ``RecursionError`` from deep inside the parser, and a value a few hundred levels deep that does
parse is a ``RecursionError`` later, wherever zoo walks it. Every ``json.loads`` of zoo goes
through :func:`loads` (or :func:`read` for a file), which turns the parser's
``RecursionError`` into a :class:`JSONError` and refuses a parsed value that nests more than
:data:`MAX_DEPTH` levels (counted without recursion; real configs, tokenizer files and records
nest a few). A :class:`JSONError` is a ``ValueError``, so a caller's ``except ValueError``
turns it into its own error class with the file's name.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

__all__ = ["MAX_BYTES", "MAX_DEPTH", "JSONError", "depth", "loads", "read"]

#: The deepest nesting of arrays and objects accepted.
MAX_DEPTH = 100

#: The largest file :func:`read` reads, by default.
MAX_BYTES = 64 << 20


class JSONError(ValueError):
    """JSON that zoo refuses: nested deeper than :data:`MAX_DEPTH`, or a file too large."""


def depth(value: Any, *, stop_after: int | None = None) -> int:
    """How deep the lists and dicts of a parsed JSON value nest (a scalar: 0), counted level
    by level without recursion; the count stops at ``stop_after + 1`` when that is given."""
    level = [value] if isinstance(value, (dict, list)) else []
    found = 0
    while level and (stop_after is None or found <= stop_after):
        found += 1
        children = itertools.chain.from_iterable(
            item.values() if isinstance(item, dict) else item for item in level
        )
        level = [child for child in children if isinstance(child, (dict, list))]
    return found


def _too_deep(max_depth: int) -> JSONError:
    return JSONError(
        f"the JSON is nested too deeply (more than {max_depth} levels of arrays and objects; "
        "a real file nests a few): it is damaged or hostile and was not read"
    )


def loads(text: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH, **options: Any) -> Any:
    """``json.loads(text, **options)``, refusing a value nested deeper than ``max_depth``.

    Raises:
        JSONError: nested too deep (a ``ValueError``).
        ValueError: not JSON (``json.JSONDecodeError``), or bytes not in UTF-8.
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    try:
        value = json.loads(text, **options)
    except RecursionError:  # the parser's own limit (about 1,000 levels), always > max_depth
        raise _too_deep(max_depth) from None
    if depth(value, stop_after=max_depth) > max_depth:
        raise _too_deep(max_depth)
    return value


def read(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    **options: Any,
) -> Any:
    """The JSON value in the file ``path`` (UTF-8), read only if it is at most ``max_bytes``
    bytes and nests at most ``max_depth`` levels.

    Raises:
        OSError: the file cannot be read.
        JSONError: too large or nested too deep (a ``ValueError``).
        ValueError: not JSON, or not UTF-8.
    """
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise JSONError(
            f"{os.fspath(path)} is over {max_bytes:,} bytes, more than zoo reads of a JSON "
            "file of this kind; it was not read"
        )
    return loads(data, max_depth=max_depth, **options)
