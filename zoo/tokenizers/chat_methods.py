"""The methods a chat template may call on the values it reaches: an allowlist, each method
with the size of what it would build, computed before it runs.

A template reaches strings (``Markup`` among them), bytes, integers, floats, lists, tuples,
ranges, dicts, sets and a dict's views. Every method of theirs that a template may call is in
:data:`METHODS`, with a *sizer*: given the value and the call's arguments, it refuses a
result above :data:`~.chat_limits.MAX_SIZE` characters (or bytes) or
:data:`~.chat_limits.MAX_ITEMS` items before the method runs; ``None`` marks a method whose
result is a number, a bool, or no larger than its value and arguments. A method of these
types that is not listed, a method of any other built-in type (a generator's ``send``, a
``mappingproxy``'s ``copy``...) and a built-in function or type are refused by name
(:func:`check_call`): a method is let through once its result is sized, rather than until it is
found to build too much. The template's own globals, macros, ``loop`` and the caller's Python
functions are code the caller chose, and are left to the checks on what they return.

Where a bound is a multiple of the value's length (a case mapping writes at most
:data:`CASE_GROWTH` characters for one, an encoding 4 bytes, an error handler up to 96...) and
that multiple is over the limit, the size is counted exactly, a chunk at a time, each chunk's
result at most :data:`_CHUNK` long, so that a long string whose result fits is not refused
and nothing long is built to find out.
"""

from __future__ import annotations

import codecs
import types
from collections.abc import Callable, Collection, Mapping, Sized
from encodings import aliases, normalize_encoding
from typing import Any

import markupsafe

from . import chat_limits as limits
from .chat_limits import LimitError, as_int, check_items, check_text, is_int, text_size

__all__ = ["CASE_GROWTH", "METHODS", "check_call", "escaped_size"]

#: Most characters one character's case mapping writes (``'ﬃ'.upper()`` is ``'FFI'``;
#: ``'İ'.lower()`` writes 2): ``upper``, ``casefold``, ``title``, ``swapcase`` and
#: ``capitalize``'s first character write at most 3, ``lower`` 2.
CASE_GROWTH = {"upper": 3, "casefold": 3, "title": 3, "swapcase": 3, "lower": 2}
#: Case mappings whose length is the sum of each character's (counted by chunks when needed).
_CONTEXT_FREE = frozenset({"upper", "lower", "casefold", "swapcase"})
#: Characters mapped or encoded at a time when a result's size is counted exactly.
_CHUNK = 1 << 20
#: Most characters ``markupsafe.escape`` writes for one (``'`` is ``&#39;``).
_ESCAPE_GROWTH = 5

#: Codecs a template may encode or decode with, and the most bytes each writes for one
#: character (decoding writes at most one character a byte).
CODECS = {
    "utf_8": 4, "utf_16": 4, "utf_16_le": 4, "utf_16_be": 4, "utf_32": 4, "utf_32_le": 4,
    "utf_32_be": 4, "ascii": 1, "latin_1": 1, "cp1252": 1,
}  # fmt: skip
#: Error handlers, and the most characters each writes for one it cannot code.
ENCODE_ERRORS = {
    "strict": 1, "ignore": 1, "replace": 1, "surrogateescape": 1, "surrogatepass": 1,
    "backslashreplace": 10, "xmlcharrefreplace": 10, "namereplace": 96,
}  # fmt: skip
DECODE_ERRORS = {
    "strict": 1, "ignore": 1, "replace": 1, "surrogateescape": 1, "surrogatepass": 1,
    "backslashreplace": 4,
}  # fmt: skip
_BOM = 4  # bytes a UTF-16 or UTF-32 encoding writes first


def escaped_size(value: Any) -> int:
    """At least the length of ``markupsafe.escape(value)``."""
    if isinstance(value, markupsafe.Markup):
        return len(value)
    if isinstance(value, str):
        return len(value) + 4 * sum(value.count(c) for c in "&<>'\"")
    return _ESCAPE_GROWTH * text_size(value)


def _arg_size(owner: Any, value: Any) -> int:
    """Characters ``value`` adds to a result of ``owner``'s method (escaped by ``Markup``)."""
    if isinstance(owner, markupsafe.Markup):
        return escaped_size(value)
    return len(value) if isinstance(value, (str, bytes, bytearray)) else text_size(value)


def _like(s: Any, value: Any) -> bool:
    """Whether ``value`` is an argument of the kind ``s``'s methods take (a string for a
    string, bytes for bytes)."""
    if isinstance(s, str):
        return isinstance(value, str)
    return isinstance(value, (bytes, bytearray))


def _occurrences(s: Any, part: Any) -> int:
    """How many times ``s`` holds ``part``, or its escaped form for a ``Markup`` (which
    escapes some methods' arguments, by version): the more of the two."""
    if isinstance(s, markupsafe.Markup):
        return max(s.count(part), s.count(markupsafe.escape(part)))
    return int(s.count(part))


def _counted(data: Any, code: Callable[[Any, bool], Sized], growth: int) -> int | None:
    """The length of what ``code`` writes for ``data``, given a chunk at a time (with
    ``final`` on the last, empty, one), each chunk small enough that its output is at most
    :data:`_CHUNK` long at ``growth`` per character, or as much of it as goes past
    :data:`~.chat_limits.MAX_SIZE`; ``None`` when ``data`` cannot be coded (the call then
    raises its own error)."""
    step = max(1, _CHUNK // max(1, growth))
    total = 0
    try:
        for start in range(0, len(data), step):
            total += len(code(data[start : start + step], False))
            if total > limits.MAX_SIZE:
                return total  # enough to refuse it
        return total + len(code(data[:0], True))
    except (UnicodeError, LookupError, TypeError, ValueError):
        return None


def _build(name: str, size: int | None) -> None:
    if size is not None:
        check_text(size, f"{name}() would build a string of")


# -- strings and bytes -----------------------------------------------------------------------
#: How many characters one character's mapping writes, at most, by method (``capitalize``:
#: its first as ``title``, the others as ``lower``).
_GROWTH = {**CASE_GROWTH, "capitalize": 2}


def case_size(name: str, s: str) -> int:
    """At least the length of ``s`` mapped by ``name`` (``upper``, ``lower``, ``title``,
    ``capitalize``...), exact when the bound would refuse it and the mapping is one
    character at a time; for the methods and the filters of that name."""
    if s.isascii():
        return len(s)
    bound = _GROWTH[name] * len(s) + (1 if name == "capitalize" else 0)
    if bound <= limits.MAX_SIZE or name not in _CONTEXT_FREE:
        return bound
    method = getattr(str, name)
    exact = _counted(s, lambda part, final: method(part), _GROWTH[name])
    return bound if exact is None else exact


def _case(name: str) -> Callable[..., None]:
    def size(s: Any, *_: Any, **__: Any) -> None:
        if isinstance(s, str):  # bytes map one byte to one
            _build(name, case_size(name, s))

    return size


def _padding(name: str) -> Callable[..., None]:
    def size(s: Any, width: Any = 0, *_: Any, **__: Any) -> None:
        _build(name, max(len(s), as_int(width)))

    return size


def _expandtabs(s: Any, tabsize: Any = 8, *_: Any, **__: Any) -> None:
    tab = "\t" if isinstance(s, str) else b"\t"
    _build("expandtabs", len(s) + s.count(tab) * max(0, as_int(tabsize)))


def _replace(s: Any, old: Any = "", new: Any = "", count: Any = -1, *_: Any, **__: Any) -> None:
    if not _like(s, old) or not _like(s, new):
        return  # the method raises its own TypeError
    times = _occurrences(s, old) if old else len(s) + 1
    if is_int(count) and count >= 0:
        times = min(times, count)
    _build("replace", len(s) + times * max(0, _arg_size(s, new) - len(old)))


def _join(s: Any, items: Any = (), *_: Any, **__: Any) -> None:
    if not isinstance(items, Collection):
        return  # a lazy iterable is drawn, one step an item, before the call
    check_items(len(items), "a join over")
    text = sum(_arg_size(s, item) for item in items)
    _build("join", text + max(0, len(items) - 1) * len(s))


def _translate(s: Any, table: Any = None, *_: Any, **__: Any) -> None:
    if isinstance(s, (bytes, bytearray)) or table is None:
        return  # bytes map a byte to a byte
    if isinstance(table, Mapping):
        check_items(len(table), "a translation table of")
        values: Any = table.values()
    elif isinstance(table, (str, list, tuple)):
        values = table  # str.translate looks characters up in any sequence
    else:
        raise LimitError(
            f"chat templates can translate with a dict, list, tuple or str table, not "
            f"{type(table).__name__} (what it writes is not sized before it is built)"
        )
    longest = max((len(v) for v in values if isinstance(v, str)), default=1)
    _build("translate", len(s) * max(1, longest))


def _split(s: Any, sep: Any = None, maxsplit: Any = -1, *_: Any, **__: Any) -> None:
    pieces = len(s) // 2 + 2 if sep is None else len(s) + 1
    if _like(s, sep) and sep:
        pieces = _occurrences(s, sep) + 1
    if is_int(maxsplit) and maxsplit >= 0:
        pieces = min(pieces, maxsplit + 1)
    _pieces("split", s, pieces)


def _splitlines(s: Any, *_: Any, **__: Any) -> None:
    if isinstance(s, str):
        breaks = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
        _pieces("splitlines", s, 1 + sum(s.count(c) for c in breaks))
    else:
        _pieces("splitlines", s, 1 + s.count(b"\n") + s.count(b"\r"))


def _pieces(name: str, s: Any, pieces: int) -> None:
    """Refuse a list of ``pieces`` parts of ``s``: too many, or too long a text."""
    check_items(pieces, f"{name}() would build a list of")
    check_text(limits.repr_size(s) + 5 * pieces + 16, f"{name}() would build a list whose text is")


def _encode(s: Any, encoding: Any = "utf-8", errors: Any = "strict", *_: Any, **__: Any) -> None:
    if not isinstance(encoding, str) or not isinstance(errors, str):
        return
    codec = _codec(encoding, "encode")
    growth = _handler(errors, ENCODE_ERRORS, "encode")
    if (s.isascii() and CODECS[codec] == 1) or codec == "utf_8":
        growth *= 1 if s.isascii() else 4
    else:
        growth *= CODECS[codec]
    size = len(s) * growth + _BOM
    if size > limits.MAX_SIZE:  # counted exactly, a chunk at a time
        encoder = codecs.getincrementalencoder(codec)(errors)
        exact = _counted(s, encoder.encode, growth)
        size = size if exact is None else exact
    _build("encode", size)


def _decode(b: Any, encoding: Any = "utf-8", errors: Any = "strict", *_: Any, **__: Any) -> None:
    if not isinstance(encoding, str) or not isinstance(errors, str):
        return
    codec = _codec(encoding, "decode")
    growth = _handler(errors, DECODE_ERRORS, "decode")
    size = len(b) * growth
    if size > limits.MAX_SIZE:
        decoder = codecs.getincrementaldecoder(codec)(errors)
        exact = _counted(b, decoder.decode, growth)
        size = size if exact is None else exact
    _build("decode", size)


def _codec(encoding: str, verb: str) -> str:
    key = normalize_encoding(encoding).lower()
    key = aliases.aliases.get(key, key)
    if key not in CODECS:
        raise LimitError(
            f"chat templates can {verb} only with {', '.join(sorted(CODECS))}, not "
            f"{encoding!r} (its output is not sized before it is built)"
        )
    return key


def _handler(errors: str, table: dict[str, int], verb: str) -> int:
    if errors not in table:
        raise LimitError(
            f"chat templates can {verb} only with the error handlers {', '.join(table)}, not "
            f"{errors!r} (its output is not sized before it is built)"
        )
    return table[errors]


def _hex(b: Any, sep: Any = None, *_: Any, **__: Any) -> None:
    _build("hex", len(b) * (2 if sep is None else 3))


def _maketrans(x: Any = None, y: Any = "", z: Any = "", *_: Any, **__: Any) -> None:
    if isinstance(x, Mapping):
        check_items(len(x), "maketrans() would build a table of")
        check_text(text_size(x), "maketrans() would build a table whose text is")
    elif isinstance(x, Sized) and isinstance(z, Sized):
        check_items(len(x) + len(z), "maketrans() would build a table of")


def _escape(cls: Any, value: Any = "", *_: Any, **__: Any) -> None:
    _build("escape", escaped_size(value))


#: String methods whose result is a number, a bool, or parts of the string.
_SMALL_STRING = (
    "count", "endswith", "find", "index", "isalnum", "isalpha", "isascii", "isdecimal",
    "isdigit", "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle",
    "isupper", "lstrip", "partition", "removeprefix", "removesuffix", "rfind", "rindex",
    "rpartition", "rstrip", "startswith", "strip", "unescape", "striptags",
)  # fmt: skip
_CASES = ("capitalize", "casefold", "lower", "swapcase", "title", "upper")
_STRING: dict[str, Callable[..., None] | None] = {
    **dict.fromkeys(_SMALL_STRING),
    **{name: _case(name) for name in _CASES},
    **{name: _padding(name) for name in ("center", "ljust", "rjust", "zfill")},
    "expandtabs": _expandtabs,
    "replace": _replace,
    "join": _join,
    "translate": _translate,
    "split": _split,
    "rsplit": _split,
    "splitlines": _splitlines,
    "encode": _encode,
    "escape": _escape,  # Markup's
}
#: What only ``str`` has (or ``Markup``).
_STRING_ONLY = (
    "casefold", "encode", "isdecimal", "isidentifier", "isnumeric", "isprintable", "escape",
    "unescape", "striptags",
)  # fmt: skip
_BYTES: dict[str, Callable[..., None] | None] = {
    **{name: size for name, size in _STRING.items() if name not in _STRING_ONLY},
    "decode": _decode,
    "hex": _hex,
    "fromhex": None,
}


# -- numbers and containers ------------------------------------------------------------------
def _to_bytes(n: Any, length: Any = 1, *_: Any, **__: Any) -> None:
    check_text(as_int(length), "to_bytes() would build a string of")


def _from_bytes(cls: Any, data: Any = b"", *_: Any, **__: Any) -> None:
    bits = limits.MAX_POWER_BITS
    if isinstance(data, Sized) and 8 * len(data) > bits:
        what = "from_bytes() would build an integer of more bits than"
        raise limits.over(what, bits, bits, "MAX_POWER_BITS")


def _fromkeys(cls: Any, keys: Any = (), value: Any = None, *_: Any, **__: Any) -> None:
    if isinstance(keys, Sized):
        check_items(len(keys), "fromkeys() would build a dict of")
        written = 8 * len(keys) if isinstance(keys, range) else text_size(keys)
        text = written + len(keys) * (text_size(value) + 8)  # "key: value, "
        check_text(text, "fromkeys() would build a dict whose text is")


def _union(s: Any, *others: Any, **__: Any) -> None:
    items = len(s) + sum(len(other) for other in others if isinstance(other, Sized))
    check_items(items, "a set operation would build a set of")


_Table = dict[str, Callable[..., None] | None]
_INT: _Table = {
    **dict.fromkeys(("as_integer_ratio", "bit_count", "bit_length", "conjugate", "is_integer")),
    "to_bytes": _to_bytes,
    "from_bytes": _from_bytes,
}
_FLOAT: _Table = dict.fromkeys(("as_integer_ratio", "conjugate", "fromhex", "hex", "is_integer"))
_SEQUENCE: _Table = dict.fromkeys(("copy", "count", "index"))
_DICT: _Table = {**dict.fromkeys(("copy", "get", "items", "keys", "values")), "fromkeys": _fromkeys}
_SET: _Table = {
    **dict.fromkeys(("copy", "difference", "intersection", "isdisjoint", "issubset", "issuperset")),
    "union": _union,
    "symmetric_difference": _union,
}
_VIEWS: tuple[type, ...] = (type({}.keys()), type({}.values()), type({}.items()))

#: What a template may call on each type it reaches: method name -> sizer (``None``: the
#: result is a number, a bool, or no larger than the value and the arguments).
METHODS: tuple[tuple[type | tuple[type, ...], str, _Table], ...] = (
    (str, "str", _STRING),
    ((bytes, bytearray), "bytes", _BYTES),
    (int, "int", _INT),
    (float, "float", _FLOAT),
    ((list, tuple, range), "sequence", _SEQUENCE),
    (dict, "dict", _DICT),
    ((set, frozenset), "set", _SET),
    (_VIEWS, "view", {"isdisjoint": None}),
)
#: Static methods, reached through a value (``''.maketrans``), that have no owner.
_STATIC = {"str.maketrans": _maketrans, "bytes.maketrans": None, "bytearray.maketrans": None}
_BUILTIN_CALLABLES = (
    types.BuiltinFunctionType, types.MethodWrapperType, types.WrapperDescriptorType,
    types.MethodDescriptorType, types.ClassMethodDescriptorType,
)  # fmt: skip


def _table(owner: Any) -> _Table | None:
    kind = owner if isinstance(owner, type) else type(owner)
    for types_, _, table in METHODS:
        if issubclass(kind, types_):
            return table
    return None


def check_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a call of ``obj`` from a template before it runs: a method not in
    :data:`METHODS` (or a built-in function or type), or one whose result would be above
    :data:`~.chat_limits.MAX_SIZE` or :data:`~.chat_limits.MAX_ITEMS`."""
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", type(obj).__name__)
    table = None if owner is None or isinstance(owner, types.ModuleType) else _table(owner)
    if table is not None:  # a method of a value (or a class method, bound to its type)
        if name not in table:
            _refuse(owner, name)
        if isinstance(owner, markupsafe.Markup) and name != "join":  # it escapes arguments
            for value in (*args, *kwargs.values()):
                check_text(escaped_size(value), f"{name}() would escape an argument of")
        sizer = table[name]
        if sizer is not None:
            sizer(owner, *args, **kwargs)
    elif isinstance(obj, _BUILTIN_CALLABLES):  # a static method, or any other built-in
        qualified = getattr(obj, "__qualname__", name)
        if qualified not in _STATIC:
            _refuse(owner, name, qualified)
        static = _STATIC[qualified]
        if static is not None:
            static(*args, **kwargs)
    elif isinstance(obj, type) and obj.__module__ == "builtins":
        _refuse(None, name, f"{name}()")
    # else: the template's globals, macros and loops, and the caller's Python functions


def _refuse(owner: Any, name: str, qualified: str | None = None) -> None:
    kind = owner.__name__ if isinstance(owner, type) else type(owner).__name__
    what = qualified or f"{kind}.{name}"
    raise LimitError(
        f"chat templates cannot call {what}: it is not among the methods whose result is "
        "sized before it is built (zoo.tokenizers.chat_methods.METHODS); the chat template is "
        "refused"
    )
