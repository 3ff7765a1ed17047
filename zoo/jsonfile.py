"""Reading JSON that zoo did not write itself (a file, a safetensors header's metadata, a
server's answer), bounded in size and depth.

Python's ``json`` parses nested arrays and objects by recursion: ``[[[...]]]`` 100,000 deep is
a ``RecursionError`` from deep inside the parser, and a value a few hundred levels deep that does
parse is a ``RecursionError`` later, wherever zoo walks it. Every ``json.loads`` of zoo goes
through :func:`loads` (or :func:`read` for a file), which counts the nesting first, without
recursion, and refuses more than :data:`MAX_DEPTH` levels (real configs, tokenizer files and
records nest a few). The error is a :class:`JSONError`, a ``ValueError``, so a caller's
``except ValueError`` turns it into its own error class with the file's name.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from typing import Any

__all__ = ["MAX_BYTES", "MAX_DEPTH", "JSONError", "depth", "loads", "read"]

#: The deepest nesting of arrays and objects accepted.
MAX_DEPTH = 100

#: The largest file :func:`read` reads, by default.
MAX_BYTES = 64 << 20

# A JSON string (escapes included), to blank out before counting brackets.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OTHER = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JSONError(ValueError):
    """JSON that zoo refuses: nested deeper than :data:`MAX_DEPTH`, or a file too large."""


def depth(text: str) -> int:
    """How deep the arrays and objects of the JSON ``text`` nest (brackets inside strings do
    not count), computed without recursion. Cheap when ``text`` holds few brackets."""
    if text.count("[") + text.count("{") == 0:
        return 0
    brackets = _OTHER.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def loads(text: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH, **options: Any) -> Any:
    """``json.loads(text, **options)``, refusing nesting deeper than ``max_depth``.

    Raises:
        JSONError: nested too deep (a ``ValueError``).
        ValueError: not JSON (``json.JSONDecodeError``), or bytes not in UTF-8.
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    if text.count("[") + text.count("{") > max_depth and (found := depth(text)) > max_depth:
        raise JSONError(
            f"the JSON is nested too deeply ({found:,} levels; zoo reads at most {max_depth}, "
            "and a real file nests a few): it is damaged or hostile and was not read"
        )
    try:
        return json.loads(text, **options)
    except RecursionError:  # nesting within max_depth, on a stack already deep
        raise JSONError(
            "the JSON is nested too deeply for Python's parser here; it was not read"
        ) from None


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
