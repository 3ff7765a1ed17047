"""The budgets of a chat-template rendering: steps, sizes, bytes and seconds.

A template from the Hub is hostile input, so every rendering runs with these limits, which
change no output of a template that keeps to them:

- :data:`MAX_STEPS` steps in all: every ``for`` iteration, call (macros, methods, globals,
  ``caller``, recursive ``loop``), filter, test, arithmetic operator and item drawn from a
  lazy filter (``map``, ``select``...) is one step;
- :data:`MAX_SECONDS` seconds of wall-clock time, checked at every step;
- :data:`MAX_SIZE` characters in any string, and in the text of any value (what ``str()``,
  ``tojson`` or ``~`` would write; a list shared many times over counts every time it would be
  written out); :data:`MAX_ITEMS` items in any list, tuple or dict. Both are checked *before*
  the value is built, from the sizes of the operands and the widths and precisions of a
  ``%`` or ``format`` spec, so that nothing large is allocated first;
- :data:`MAX_ALLOCATED` bytes allocated in all by the values the template builds (what it
  could keep alive at once, in variables, macro frames or namespaces);
- :data:`MAX_DEPTH` levels of nesting in a value, :data:`MAX_CALL_DEPTH` levels of calls;
- :data:`MAX_POWER_BITS` bits in an integer built with ``+``, ``-``, ``*``, ``**`` or
  ``int.from_bytes``;
- and, before a template compiles, :data:`MAX_SOURCE` characters and :data:`MAX_NODES`
  syntax nodes (:func:`check_source`, :func:`check_nodes`).

This module holds the budgets, the meter of the rendering under way and the measure of a
value's text; :mod:`.chat_operations` checks each operator, call, filter and format against
them before it runs. A template past any of them gets a :class:`LimitError` (a Jinja
``SecurityError``) that names the limit and its value; :func:`zoo.tokenizers.chat._render`
turns it into a :class:`~zoo.tokenizers.ChatTemplateError`. Nothing here imports outside the
standard library and Jinja.
"""

from __future__ import annotations

import contextvars
import itertools
import re
import sys
import time
from collections.abc import (
    Iterable,
    Iterator,
    Mapping,
    MappingView,
)
from typing import Any

import jinja2.exceptions
import jinja2.filters
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils

__all__ = [
    "MAX_ALLOCATED",
    "MAX_CALL_DEPTH",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_NODES",
    "MAX_POWER_BITS",
    "MAX_SECONDS",
    "MAX_SIZE",
    "MAX_SOURCE",
    "MAX_STEPS",
    "LimitError",
    "Meter",
]

#: Steps one rendering may take: loop iterations, calls, filters, tests and operators.
MAX_STEPS = 1_000_000
#: Wall-clock seconds one rendering may take.
MAX_SECONDS = 10.0
#: Longest string (in characters) a template may build or write, and longest text of a value.
MAX_SIZE = 1 << 24
#: Most items in a list, tuple or dict a template may build.
MAX_ITEMS = 1 << 20
#: Bytes one rendering may allocate in all, over the strings and containers it builds.
MAX_ALLOCATED = 1 << 28
#: Largest integer result of ``+``, ``-``, ``*``, ``**`` or ``int.from_bytes``, in bits.
MAX_POWER_BITS = 4096
#: Deepest nesting of lists, dicts and namespaces a value may have when it is measured.
MAX_DEPTH = 200
#: Deepest nesting of calls (a macro calling a macro, a recursive loop...).
MAX_CALL_DEPTH = 64
#: Longest template source, in characters (real ones are a few thousand).
MAX_SOURCE = 1 << 18
#: Most syntax nodes in a template (real ones have a few hundred): compiling is bounded too.
MAX_NODES = 20_000

#: Characters written for a value the measure does not know (a function, a loop...).
_OTHER_SIZE = 200
#: Containers measured at this text size or more are remembered for the rendering.
_REMEMBER_SIZE = 1024
#: Bytes charged for remembering one container's size.
_REMEMBER_COST = 256


class LimitError(jinja2.exceptions.SecurityError):
    """A rendering went past one of the budgets of this module."""


def over(what: str, value: int, limit: int, name: str) -> LimitError:
    return LimitError(
        f"{what} {value:,}, above the limit of {limit:,} ({name}); the chat template is refused"
    )


def check_text(size: int, what: str = "the template would build a string of") -> None:
    """Refuse a string of ``size`` characters above :data:`MAX_SIZE`."""
    if size > MAX_SIZE:
        raise over(what, size, MAX_SIZE, "MAX_SIZE characters")


def check_items(count: int, what: str = "the template would build a list of") -> None:
    """Refuse a list, tuple or dict of ``count`` items above :data:`MAX_ITEMS`."""
    if count > MAX_ITEMS:
        raise over(what, count, MAX_ITEMS, "MAX_ITEMS items")


def is_int(value: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_int(value: Any, default: int = 0) -> int:
    """``value`` as the integer Python would use for a width or count (``default`` when it
    is none: the operation itself then raises its usual error)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return int(value) if abs(value) < 1e30 else sys.maxsize


def check_source(source: str) -> None:
    """Refuse a template source longer than :data:`MAX_SOURCE` before it is parsed."""
    if len(source) > MAX_SOURCE:
        raise over("the template's source is", len(source), MAX_SOURCE, "MAX_SOURCE characters")


def check_nodes(tree: jinja2.nodes.Node) -> None:
    """Refuse a parsed template of more than :data:`MAX_NODES` nodes before it compiles."""
    count, pending = 0, [tree]
    while pending:
        count += 1
        if count > MAX_NODES:
            raise LimitError(
                f"the template has more than {MAX_NODES:,} syntax nodes (MAX_NODES); the chat "
                "template is refused"
            )
        pending.extend(pending.pop().iter_child_nodes())


# -- the meter of the rendering under way ----------------------------------------------------
class Meter:
    """The budgets left to one rendering: steps, the deadline, bytes, and the text sizes of
    large containers already measured (lists and dicts cannot change in the sandbox)."""

    def __init__(self) -> None:
        self.steps = MAX_STEPS
        self.deadline = time.monotonic() + MAX_SECONDS
        self.allocated = 0
        self.depth = 0  # calls under way
        self.sizes: dict[int, tuple[Any, int, int]] = {}  # id -> (container, size, height)
        self.counted: dict[int, Any] = {}  # large values already charged, by id

    def step(self) -> None:
        """One step more; refused past :data:`MAX_STEPS` or :data:`MAX_SECONDS`."""
        self.steps -= 1
        if self.steps < 0:
            raise over(
                "the template ran more steps (loop iterations, calls, filters, tests and "
                "operators) than",
                MAX_STEPS,
                MAX_STEPS,
                "MAX_STEPS steps",
            )
        if time.monotonic() > self.deadline:
            raise LimitError(
                f"the template ran for more than {MAX_SECONDS:g} seconds (MAX_SECONDS); the "
                "chat template is refused"
            )

    def charge(self, size: int) -> None:
        """``size`` bytes more allocated; refused past :data:`MAX_ALLOCATED`."""
        self.allocated += size
        if self.allocated > MAX_ALLOCATED:
            raise over(
                "the template allocated more bytes than", MAX_ALLOCATED, MAX_ALLOCATED,
                "MAX_ALLOCATED bytes",
            )  # fmt: skip

    def charge_value(self, value: Any) -> None:
        """Charge a string or container the template built (a large one once only)."""
        if not isinstance(value, (str, bytes, list, tuple, dict, int)):
            return
        size = sys.getsizeof(value)
        if size >= 1 << 16:
            if self.counted.get(id(value)) is value:
                return
            self.counted[id(value)] = value
        self.charge(size)


_METER: contextvars.ContextVar[Meter | None] = contextvars.ContextVar(
    "zoo_chat_meter", default=None
)


def start() -> contextvars.Token[Meter | None]:
    """A fresh meter for the rendering that starts (give the token to :func:`stop`)."""
    return _METER.set(Meter())


def stop(token: contextvars.Token[Meter | None]) -> None:
    """The rendering is over: its meter is dropped."""
    _METER.reset(token)


def step() -> None:
    """One step of the rendering under way (nothing outside a rendering)."""
    meter = _METER.get()
    if meter is not None:
        meter.step()


def enter_call() -> Meter | None:
    """A call starts: one step, one level deeper (give the result to :func:`leave_call`);
    refused past :data:`MAX_CALL_DEPTH` levels."""
    meter = _METER.get()
    if meter is not None:
        meter.step()
        meter.depth += 1
        if meter.depth > MAX_CALL_DEPTH:
            raise over("the template nested calls", meter.depth, MAX_CALL_DEPTH,
                        "MAX_CALL_DEPTH levels")  # fmt: skip
    return meter


def leave_call(meter: Meter | None) -> None:
    """The call :func:`enter_call` started is over."""
    if meter is not None:
        meter.depth -= 1


def built(value: Any) -> Any:
    """``value``, a result the template built, once its sizes are checked and its bytes
    charged."""
    kind = type(value)
    if kind is bool or kind is float or value is None:
        return value
    if kind is int:
        if value.bit_length() <= 64:
            return value
    elif isinstance(value, (str, bytes)):
        if len(value) > MAX_SIZE:
            check_text(len(value))
    elif isinstance(value, (list, tuple, dict)):
        check_items(len(value))
        check_text(text_size(value), "the template would build a value whose text is")
    meter = _METER.get()
    if meter is not None:
        meter.charge_value(value)
    return value


def counted(items: Iterable[Any]) -> Iterator[Any]:
    """``items``, each one a step (the lazy results of ``map``, ``select``...)."""
    for item in items:
        step()
        yield item


# -- the text size of a value ----------------------------------------------------------------
#: ASCII control characters that ``repr`` writes as ``\\x00`` and JSON as ``\\u0000``.
_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: Bytes that ``repr`` writes as ``\\x00`` (all but printable ASCII, tab and line breaks).
_BYTE_ESCAPES = re.compile(b"[^\x20-\x7e\t\n\r]")
#: Characters written as two (``\\n``, ``\\"``...) by ``repr`` or JSON.
_TWO = ("\\", "'", '"', "\t", "\n", "\r")
#: Tabs and line breaks, deleted to ask whether the rest of a text is printable.
_BREAKS = str.maketrans("", "", "\t\n\r")
#: Characters looked at a time when a long text's printable characters are checked.
_CHUNK = 1 << 20
#: Strings up to this long are measured by writing their ``repr``.
_SHORT = 4096


def _string_size(text: str | bytes | bytearray) -> int:
    """At least the length of ``repr(text)`` (as a container writes it) and of its JSON
    text without ``ensure_ascii``: each character written as an escape counts its escape,
    two characters for ``\\n`` or a quote, and, once there is any other character to escape,
    6 for each ASCII character (``\\u0000``) or 10 for any (``\\U000e0001``)."""
    extra = 3 if type(text) in (str, bytes) else 5 + len(type(text).__name__)
    if len(text) <= _SHORT:  # written out (a short copy): exact, and faster than counting
        if isinstance(text, (bytes, bytearray)):
            return len(repr(text))
        if _CONTROLS.search(text) is not None:
            return 6 * len(text) + extra
        return len(repr(text)) + text.count('"') + 1  # JSON escapes each '"'
    if isinstance(text, (bytes, bytearray)):
        if _BYTE_ESCAPES.search(text) is None:
            return len(text) + sum(text.count(c.encode()) for c in _TWO) + extra
        return 4 * len(text) + extra
    if _CONTROLS.search(text) is None and (text.isascii() or _printable(text)):
        return len(text) + sum(text.count(c) for c in _TWO) + extra
    return (6 if text.isascii() else 10) * len(text) + extra


def _printable(text: str) -> bool:
    """Whether each character of ``text`` but tabs and line breaks is printable."""
    if text.isprintable():
        return True
    return all(
        text[i : i + _CHUNK].translate(_BREAKS).isprintable() for i in range(0, len(text), _CHUNK)
    )


def repr_size(value: Any, ascii: bool = False) -> int:
    """At least the length of ``repr(value)`` (``ascii(value)`` with ``ascii``): what ``%r``,
    ``!r`` and a string inside a container write."""
    if isinstance(value, (str, bytes, bytearray)):
        size = _string_size(value)
        wide = ascii and isinstance(value, str) and not value.isascii()
        return 10 * len(value) + 3 if wide else size
    return text_size(value) * (10 if ascii else 1)


#: What the measure walks: its text is made of its items' (or keys' and values').
_CONTAINERS = (list, tuple, dict, set, frozenset, MappingView, jinja2.utils.Namespace)


class _Measure:
    """One measurement: a value's text size and nesting, each container walked once."""

    def __init__(self, meter: Meter | None) -> None:
        self.meter = meter
        self.seen: dict[int, tuple[Any, int, int, bool]] = {}  # id -> (value, size, height, pure)

    def size(self, value: Any, depth: int) -> tuple[int, int, bool]:
        """(text size, nesting height, whether it can be remembered: no namespace inside)."""
        if isinstance(value, (str, bytes, bytearray)):
            return self._string(value), 0, True
        if value is None or isinstance(value, (bool, float)):
            return 32, 0, True
        if isinstance(value, int):
            return value.bit_length() // 3 + 3, 0, True
        if isinstance(value, jinja2.Undefined):
            return 16, 0, True
        if not isinstance(value, _CONTAINERS):
            return _OTHER_SIZE, 0, True
        return self._container(value, depth)

    def _string(self, value: str | bytes | bytearray) -> int:
        if len(value) < _REMEMBER_SIZE or self.meter is None:
            return _string_size(value)
        known = self.meter.sizes.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        size = _string_size(value)
        self.remember(value, size, 0)
        return size

    def _container(self, value: Any, depth: int) -> tuple[int, int, bool]:
        key = id(value)
        hit = self.seen.get(key)
        if hit is not None and hit[0] is value:
            return hit[1], hit[2], hit[3]
        known = self.meter.sizes.get(key) if self.meter is not None else None
        if known is not None and known[0] is value:
            return known[1], known[2], True
        if depth > MAX_DEPTH:
            raise over("the template built a value nested", depth, MAX_DEPTH, "MAX_DEPTH levels")
        pure = not isinstance(value, jinja2.utils.Namespace)
        total, height = 16, 0
        for item in _parts(value):
            size, below, item_pure = self.size(item, depth + 1)
            total += size + 2
            height = max(height, below)
            pure = pure and item_pure
            if total > MAX_SIZE:
                return total, height + 1, pure  # enough to refuse it: not remembered
        height += 1
        if height > MAX_DEPTH:
            raise over("the template built a value nested", height, MAX_DEPTH, "MAX_DEPTH levels")
        self.seen[key] = (value, total, height, pure)
        if pure and total >= _REMEMBER_SIZE:
            self.remember(value, total, height)
        return total, height, pure

    def remember(self, value: Any, size: int, height: int) -> None:
        if self.meter is not None:
            self.meter.charge(_REMEMBER_COST)
            self.meter.sizes[id(value)] = (value, size, height)


def _parts(value: Any) -> Iterable[Any]:
    """What the text of a container is made of."""
    if isinstance(value, jinja2.utils.Namespace):
        value = object.__getattribute__(value, "_Namespace__attrs")
    if isinstance(value, Mapping):
        return itertools.chain.from_iterable(value.items())
    return value


def text_size(value: Any) -> int:
    """At least the length of ``str(value)``, within a small factor (a string's escapes),
    and above :data:`MAX_SIZE` as soon as it is known to be; shared parts count each time
    they would be written."""
    if isinstance(value, str):
        return len(value)
    return _Measure(_METER.get()).size(value, 0)[0]


def size_and_height(value: Any) -> tuple[int, int]:
    """The text size of ``value`` (:func:`text_size`) and how deeply it nests."""
    size, height, _ = _Measure(_METER.get()).size(value, 0)
    return size, height


def sum_size(value: Any, left: Any, right: Any) -> None:
    """Remember the text size of ``value == left + right`` (or ``left * n`` with ``right``
    an int) without walking it; refuse it above :data:`MAX_SIZE` (with ``value`` ``None``,
    before it is built: only the refusal)."""
    meter = _METER.get()
    if meter is None:
        return
    measure = _Measure(meter)
    size, height, pure = measure.size(left, 0)
    if is_int(right):
        size *= right
    else:
        more, other, other_pure = measure.size(right, 0)
        size, height, pure = size + more, max(height, other), pure and other_pure
    check_text(size, "the template would build a value whose text is")
    if size >= _REMEMBER_SIZE and pure and value is not None:
        measure.remember(value, size, height)


def text(value: Any) -> str:
    """``str(value)``, refused before it is built when it would be too long."""
    if isinstance(value, str):
        return value
    check_text(text_size(value), "the template would write a value of")
    result = str(value)
    return built(result)


def join_texts(parts: Iterable[Any]) -> str:
    """The ``~`` of ``parts``, refused before it is built when it would be too long."""
    parts = tuple(parts)
    check_text(sum(text_size(part) for part in parts), "the template would join a string of")
    return built("".join(map(str, parts)))


def concat(pieces: Iterable[str]) -> str:
    """The output of a macro, block or ``{% set %}`` body, refused before it is joined when
    it would be too long."""
    pieces = list(pieces)
    check_text(sum(map(len, pieces)), "the template would write a block of")
    return built("".join(pieces))
