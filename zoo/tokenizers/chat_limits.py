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
- :data:`MAX_POWER_BITS` bits in an integer built with ``*`` or ``**``;
- and, before a template compiles, :data:`MAX_SOURCE` characters and :data:`MAX_NODES`
  syntax nodes (:func:`check_source`, :func:`check_nodes`).

A template past any of them gets a :class:`LimitError` (a Jinja ``SecurityError``) that names
the limit and its value; :func:`zoo.tokenizers.chat._render` turns it into a
:class:`~zoo.tokenizers.ChatTemplateError`. Nothing here imports outside the standard library
and Jinja.
"""

from __future__ import annotations

import contextvars
import inspect
import itertools
import json
import re
import sys
import time
from collections.abc import (
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    MappingView,
    Sized,
)
from typing import Any

import jinja2.exceptions
import jinja2.filters
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils
from jinja2.utils import _PassArg

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
#: Largest integer result of ``*`` or ``**``, in bits.
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


def _over(what: str, value: int, limit: int, name: str) -> LimitError:
    return LimitError(
        f"{what} {value:,}, above the limit of {limit:,} ({name}); the chat template is refused"
    )


def check_text(size: int, what: str = "the template would build a string of") -> None:
    """Refuse a string of ``size`` characters above :data:`MAX_SIZE`."""
    if size > MAX_SIZE:
        raise _over(what, size, MAX_SIZE, "MAX_SIZE characters")


def check_items(count: int, what: str = "the template would build a list of") -> None:
    """Refuse a list, tuple or dict of ``count`` items above :data:`MAX_ITEMS`."""
    if count > MAX_ITEMS:
        raise _over(what, count, MAX_ITEMS, "MAX_ITEMS items")


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
        raise _over("the template's source is", len(source), MAX_SOURCE, "MAX_SOURCE characters")


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
            raise _over(
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
            raise _over(
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
            raise _over("the template nested calls", meter.depth, MAX_CALL_DEPTH,
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
def _string_size(text: str | bytes) -> int:
    """Characters of ``repr(text)`` inside a container (escapes counted twice, at least)."""
    printable = text.isprintable() if isinstance(text, str) else text.isascii()
    return len(text) + 3 if printable else 2 * len(text) + 3


class _Measure:
    """One measurement: a value's text size and nesting, each container walked once."""

    def __init__(self, meter: Meter | None) -> None:
        self.meter = meter
        self.seen: dict[int, tuple[Any, int, int, bool]] = {}  # id -> (value, size, height, pure)

    def size(self, value: Any, depth: int) -> tuple[int, int, bool]:
        """(text size, nesting height, whether it can be remembered: no namespace inside)."""
        if isinstance(value, (str, bytes)):
            return self._string(value), 0, True
        if value is None or isinstance(value, (bool, float)):
            return 32, 0, True
        if isinstance(value, int):
            return value.bit_length() // 3 + 3, 0, True
        if isinstance(value, jinja2.Undefined):
            return 16, 0, True
        if not isinstance(value, (list, tuple, dict, MappingView, jinja2.utils.Namespace)):
            return _OTHER_SIZE, 0, True
        return self._container(value, depth)

    def _string(self, value: str | bytes) -> int:
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
            raise _over("the template built a value nested", depth, MAX_DEPTH, "MAX_DEPTH levels")
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
            raise _over("the template built a value nested", height, MAX_DEPTH, "MAX_DEPTH levels")
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


def _size_and_height(value: Any) -> tuple[int, int]:
    """The text size of ``value`` (:func:`text_size`) and how deeply it nests."""
    size, height, _ = _Measure(_METER.get()).size(value, 0)
    return size, height


def sum_size(value: Any, left: Any, right: Any) -> None:
    """Remember the text size of ``value == left + right`` (or ``left * n`` with ``right``
    an int) without walking it; refuse it above :data:`MAX_SIZE`."""
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
    if size >= _REMEMBER_SIZE and pure:
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


# -- formats ---------------------------------------------------------------------------------
_PERCENT = re.compile(r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.?)", re.S)
_DIGITS = re.compile(r"\d+")
#: Characters a number can take, beyond its precision and width.
_NUMBER_SIZE = 400


def _spec_number(digits: str) -> int:
    if len(digits) > 18:
        raise _over("a format spec asks for a width or precision of", 10**18, MAX_SIZE, "MAX_SIZE")
    return int(digits) if digits else 0


def _field_size(value: Any, kind: str) -> int:
    """Characters one ``%`` or ``format`` field writes for ``value``, width aside."""
    if isinstance(value, (int, float)) or kind not in "sra":
        return 2 * text_size(value) + _NUMBER_SIZE
    return text_size(value) * (10 if kind == "a" else 1) + _NUMBER_SIZE


def percent_size(fmt: str | bytes, args: Any) -> int:
    """At least the length of ``fmt % args``, from the fields' widths, precisions and
    values."""
    if isinstance(fmt, bytes):
        fmt = fmt.decode("latin-1")
    values = list(args) if isinstance(args, tuple) else [args]
    given = iter(values)
    total = len(fmt)
    for match in _PERCENT.finditer(fmt):
        key, width, precision, kind = match.groups()
        if kind == "%":
            continue
        sizes = [
            abs(as_int(next(given, 0))) if spec == "*" else _spec_number(spec or "")
            for spec in (width, precision)
        ]
        if key is not None and isinstance(args, Mapping):
            value = args.get(key)
        else:
            value = next(given, None)
        total += sum(sizes) + _field_size(value, kind)
    return total


def format_size(value: Any, spec: str) -> int:
    """At least the length of ``format(value, spec)``."""
    numbers = sum(_spec_number(digits) for digits in _DIGITS.findall(spec))
    return numbers + _field_size(value, spec[-1:] if spec[-1:].isalpha() else "s")


class BoundedFormatter(jinja2.sandbox.SandboxedFormatter):
    """The sandbox's formatter for ``str.format``, which refuses a field or a result that
    would be too long before it is built."""

    _size = 0

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
        self._size = len(format_string)
        return super().vformat(format_string, args, kwargs)

    def format_field(self, value: Any, format_spec: str) -> Any:
        self._size += format_size(value, format_spec)
        check_text(self._size, "a format would write a string of")
        return super().format_field(value, format_spec)

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion is not None:
            check_text(_field_size(value, conversion), "a format would write a field of")
        return super().convert_field(value, conversion)


class BoundedEscapeFormatter(BoundedFormatter, jinja2.sandbox.SandboxedEscapeFormatter):
    """:class:`BoundedFormatter` for ``Markup.format``."""


# -- operators -------------------------------------------------------------------------------
def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse ``left operator right`` before it is computed when its result would be too
    large."""
    if operator in "-/" or operator == "//":
        return  # no result is longer than its operands
    if operator == "**" and is_int(left) and is_int(right):
        if right > 0 and abs(left) > 1 and left.bit_length() * right > MAX_POWER_BITS:
            raise _over(f"{left} ** {right} has more bits than", MAX_POWER_BITS, MAX_POWER_BITS,
                        "MAX_POWER_BITS")  # fmt: skip
    elif operator == "*":
        _check_product(left, right)
    elif operator == "+":
        _check_length(_length(left) + _length(right), left, right)
    elif operator == "%" and isinstance(left, (str, bytes)):
        check_text(percent_size(left, right), "a % format would write a string of")


def _check_product(left: Any, right: Any) -> None:
    if is_int(left) and is_int(right):
        if left.bit_length() + right.bit_length() > MAX_POWER_BITS + 1:
            raise _over("a product would have a number of bits above", MAX_POWER_BITS,
                        MAX_POWER_BITS, "MAX_POWER_BITS")  # fmt: skip
        return
    sequence, times = (right, left) if is_int(left) else (left, right)
    if is_int(times):
        _check_length(_length(sequence) * times, sequence)


def _length(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else 0


def _check_length(length: int, *operands: Any) -> None:
    if any(isinstance(x, (str, bytes)) for x in operands):
        check_text(length)
    else:
        check_items(length)


def after_binop(operator: str, left: Any, right: Any, result: Any) -> Any:
    """``result`` of ``left operator right``: a list or tuple's text size is the sum (or
    multiple) of its operands', so it is remembered without walking the result."""
    if isinstance(result, (list, tuple)) and operator in "+*":
        sequence, times = (right, left) if is_int(left) else (left, right)
        if operator == "*":
            sum_size(result, sequence, times)
        else:
            sum_size(result, left, right)
    return built(result)


# -- calls: the methods of strings, and the template's globals --------------------------------
def _method_replace(s: Any, old: Any = "", new: Any = "", count: Any = -1, *_: Any) -> int:
    if not isinstance(old, type(s)) or not isinstance(new, type(s)):
        return len(s)
    times = s.count(old) if old else len(s) + 1
    if is_int(count) and count >= 0:
        times = min(times, count)
    return len(s) + times * max(0, len(new) - len(old))


def _method_join(s: Any, items: Any = (), *_: Any) -> int:
    if not isinstance(items, Collection):
        return 0  # a lazy iterable: its items are steps
    check_items(len(items), "a join over")
    return sum(text_size(item) for item in items) + max(0, len(items) - 1) * len(s)


def _method_translate(s: Any, table: Any = None, *_: Any) -> int:
    if isinstance(table, Mapping):
        check_items(len(table), "a translation table of")
        longest = max((_length(v) for v in table.values()), default=1)
        return len(s) * max(1, longest)
    return len(s)


def _method_split(s: Any, sep: Any = None, maxsplit: Any = -1, *_: Any) -> None:
    if is_int(maxsplit) and 0 <= maxsplit < MAX_ITEMS:
        return
    if isinstance(sep, type(s)) and sep:
        pieces = s.count(sep) + 1
    else:
        pieces = len(s) // 2 + 1 if sep is None else len(s) + 1
    check_items(pieces, "a split into")


def _method_splitlines(s: Any, *_: Any) -> None:
    breaks = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029" if isinstance(s, str) else "\n\r"
    check_items(1 + sum(s.count(c if isinstance(s, str) else c.encode()) for c in breaks),
                "a split into")  # fmt: skip


def _method_expandtabs(s: Any, tabsize: Any = 8, *_: Any) -> int:
    tab = "\t" if isinstance(s, str) else b"\t"
    return len(s) + s.count(tab) * max(0, as_int(tabsize))


#: Characters a string method can write, from the string and its arguments (before it runs).
_METHOD_SIZES: dict[str, Callable[..., int | None]] = {
    "center": lambda s, width=0, *_: max(len(s), as_int(width)),
    "ljust": lambda s, width=0, *_: max(len(s), as_int(width)),
    "rjust": lambda s, width=0, *_: max(len(s), as_int(width)),
    "zfill": lambda s, width=0, *_: max(len(s), as_int(width)),
    "expandtabs": _method_expandtabs,
    "replace": _method_replace,
    "join": _method_join,
    "translate": _method_translate,
    "split": _method_split,
    "rsplit": _method_split,
    "splitlines": _method_splitlines,
}


#: Keywords Jinja adds to a call inside a loop or block (``Context.call`` drops them).
_CONTEXT_ARGUMENTS = frozenset({"_loop_vars", "_block_vars"})


def prepare_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The arguments of a call of a string's method or of ``lipsum``, refused when its
    result would be too large, before it runs (the lazy iterable of a ``join`` is drawn
    first, one step per item, to be measured)."""
    owner = getattr(obj, "__self__", None)
    kwargs = {k: v for k, v in kwargs.items() if k not in _CONTEXT_ARGUMENTS}
    if isinstance(owner, (str, bytes)):
        name = getattr(obj, "__name__", "")
        if name == "join" and args and not isinstance(args[0], Collection):
            args = (list(counted(args[0])), *args[1:])
        for value in (*args, *kwargs.values()):
            if is_int(value) and abs(value) > MAX_SIZE:
                raise _over("a string method was given the number", value, MAX_SIZE, "MAX_SIZE")
        estimate = _METHOD_SIZES.get(name)
        if estimate is not None:
            size = estimate(owner, *args, **kwargs)
            if size is not None:
                check_text(size, f"{name}() would build a string of")
    elif obj is jinja2.utils.generate_lorem_ipsum:
        bound = inspect.signature(obj).bind(*args, **kwargs)
        bound.apply_defaults()
        size = as_int(bound.arguments["n"]) * (as_int(bound.arguments["max"]) + 2) * 16
        check_text(size, "lipsum() would write a string of")
    return args


# -- filters ---------------------------------------------------------------------------------
def _string_of(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _escaped_size(value: Any) -> int:
    s = _string_of(value)
    if s is None:
        return 5 * text_size(value)
    return len(s) + 4 * sum(s.count(c) for c in "&<>'\"")


def _indent_size(value: Any, width: Any = 4, *_: Any, **__: Any) -> int:
    s = _string_of(value)
    lines = s.count("\n") + 1 if s is not None else text_size(value) + 1
    check_items(lines, "indent would split the text into")
    step_width = len(width) if isinstance(width, str) else abs(as_int(width))
    return text_size(value) + lines * step_width


def _replace_size(value: Any, old: Any = "", new: Any = "", count: Any = None) -> int:
    s = _string_of(value)
    if s is None:
        return (text_size(value) + 1) * (text_size(new) + 1)
    return _method_replace(s, str(old), str(new), -1 if count is None else count)


def _join_size(value: Any, d: Any = "", attribute: Any = None) -> int:
    if isinstance(value, str):
        return len(value) + max(0, len(value) - 1) * text_size(d)
    if not isinstance(value, Collection):
        return 0
    return sum(text_size(item) for item in value) + max(0, len(value) - 1) * text_size(d)


def _wordwrap_size(value: Any, width: Any = 79, break_long_words: Any = True,
                   wrapstring: Any = None, *_: Any, **__: Any) -> int:  # fmt: skip
    size = text_size(value)
    return size + (size + 1) * (1 + text_size(wrapstring or ""))


def _urlize_size(value: Any, trim_url_limit: Any = None, nofollow: Any = False,
                 target: Any = None, rel: Any = None, *_: Any, **__: Any) -> int:  # fmt: skip
    size = text_size(value)
    s = _string_of(value)
    urls = sum(s.count(c) for c in ".:@") if s is not None else size
    return 5 * size + urls * (64 + text_size(target) + text_size(rel))


def _pprint_size(value: Any) -> int:
    size, height = _size_and_height(value)
    return size * (2 + height)  # each line indented by its depth


def _batch_items(value: Any, linecount: Any = 1, fill_with: Any = None) -> int:
    n = len(value) if isinstance(value, Sized) else 0
    size = max(1, as_int(linecount, 1))
    fill = size if fill_with is not None else 0
    check_items(n + n // size + 1 + fill, "batch would build lists of")
    return 0


def _slice_items(value: Any, slices: Any = 1, fill_with: Any = None) -> int:
    n = len(value) if isinstance(value, Sized) else 0
    check_items(n + abs(as_int(slices)), "slice would build lists of")
    return 0


#: Characters (at least) that a filter can write, from its value and arguments (before it
#: runs). Every filter not named here, but for :data:`_FREE_FILTERS`, has its value's text
#: size bounded first.
_FILTER_SIZES: dict[str, Callable[..., int]] = {
    "center": lambda value, width=80: max(text_size(value), as_int(width)),
    "escape": _escaped_size,
    "e": _escaped_size,
    "forceescape": _escaped_size,
    "format": lambda value, *args, **kwargs: percent_size(str(value), kwargs or args),
    "indent": _indent_size,
    "join": _join_size,
    "pprint": _pprint_size,
    "replace": _replace_size,
    "urlencode": lambda value: 12 * text_size(value),
    "urlize": _urlize_size,
    "wordwrap": _wordwrap_size,
    "xmlattr": lambda value, autospace=True: 5 * text_size(value) + 8,
    "batch": _batch_items,
    "slice": _slice_items,
}
#: Filters that neither write their value's text nor walk all of it.
_FREE_FILTERS = frozenset(
    {"abs", "attr", "count", "d", "default", "first", "float", "int", "last", "length",
     "random", "reverse", "round", "filesizeformat", "tojson"}
)  # fmt: skip
#: Filters that split their value's text into a list of words, characters or bytes.
_SPLIT_FILTERS = frozenset({"striptags", "title", "urlencode", "urlize", "wordwrap"})
#: Filters that walk their value item by item: at most :data:`MAX_ITEMS` of them.
_ITEM_FILTERS = frozenset(
    {"batch", "dictsort", "groupby", "items", "join", "list", "map", "max", "min", "reject",
     "rejectattr", "select", "selectattr", "slice", "sort", "sum", "unique"}
)  # fmt: skip


def check_filter(name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse filter ``name`` on ``value`` before it runs when what it would build is too
    large."""
    if name in _ITEM_FILTERS and isinstance(value, Sized):
        check_items(len(value), f"the {name} filter would walk")
    elif name in _SPLIT_FILTERS:
        check_items(text_size(value), f"the {name} filter would split a text of")
    elif name not in _FREE_FILTERS:
        check_text(text_size(value), f"the {name} filter would read a text of")
    estimate = _FILTER_SIZES.get(name)
    if estimate is not None:
        size = estimate(value, *args, **kwargs)  # a TypeError: arguments the filter refuses too
        check_text(size, f"the {name} filter would write a string of")


def _run(pass_arg: Any, func: Callable[..., Any], context: Any, *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)``, given first what it asks for (Jinja's ``pass_context``,
    ``pass_eval_context``, ``pass_environment``)."""
    if pass_arg is _PassArg.context:
        return func(context, *args, **kwargs)
    if pass_arg is _PassArg.eval_context:
        return func(context.eval_ctx, *args, **kwargs)
    if pass_arg is _PassArg.environment:
        return func(context.environment, *args, **kwargs)
    return func(*args, **kwargs)


def bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """Filter ``func`` as the sandbox calls it: one step, checked before it runs, its result
    checked and charged, and a lazy result drawn one step per item. Takes the context, so
    that no filter runs while a template compiles (Jinja folds constants)."""
    pass_arg = _PassArg.from_obj(func)

    @jinja2.pass_context
    def run(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        step()
        if name in _ITEM_FILTERS and isinstance(value, Iterator):
            value = counted(value)
            if name == "join":  # to be measured before it is joined
                value = list(value)
        check_filter(name, value, args, kwargs)
        result = _run(pass_arg, func, context, value, *args, **kwargs)
        if isinstance(result, Iterator) and not isinstance(result, (str, bytes)):
            return counted(result)
        return built(result)

    run.__name__ = run.__qualname__ = f"bounded_{name}"
    run.__doc__ = func.__doc__
    return run


def bounded_test(func: Any) -> Callable[..., Any]:
    """Test ``func`` as the sandbox calls it: one step (and never run at compile time)."""
    pass_arg = _PassArg.from_obj(func)

    @jinja2.pass_context
    def run(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        step()
        return _run(pass_arg, func, context, value, *args, **kwargs)

    return run


# -- filters replaced by bounded equivalents ---------------------------------------------------
def do_sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    """Jinja's ``sum``, in linear time: lists and tuples are extended instead of added
    again and again (the result is the same), and refused before they grow too long."""
    if attribute is not None:
        iterable = map(jinja2.filters.make_attrgetter(environment, attribute), iterable)
    if not isinstance(start, (list, tuple)):
        return sum(iterable, start)
    kind = type(start)
    total: list[Any] = list(start)
    for item in iterable:
        if type(item) is not kind:
            return sum(iterable, kind(total) + item)  # the TypeError sum() raises
        check_items(len(total) + len(item), "sum would build a list of")
        total.extend(item)
    return kind(total)


do_sum = jinja2.pass_environment(do_sum)


def do_wordcount(s: Any) -> int:
    """Jinja's ``wordcount``, counting without a list of the words."""
    return sum(1 for _ in jinja2.filters._word_re.finditer(jinja2.filters.soft_str(s)))


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """``transformers``' ``tojson`` (Jinja's escapes HTML characters), refused before it
    writes more than :data:`MAX_SIZE` characters."""
    size, height = _size_and_height(value)
    size *= 6 if ensure_ascii else 1
    if isinstance(separators, (tuple, list)) and all(isinstance(x, str) for x in separators):
        size += (size // 2 + 1) * max(0, sum(map(len, separators)) - 4)
    step = len(indent) if isinstance(indent, str) else abs(as_int(indent))
    check_text(size + step * (height + 1), "tojson would write a string of")
    encoder = json.JSONEncoder(
        ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    if indent is None:
        return encoder.encode(value)
    pieces, size = [], 0
    for piece in encoder.iterencode(value):  # indentation can multiply the text: stream it
        size += len(piece)
        check_text(size, "tojson would write a string of")
        pieces.append(piece)
    return "".join(pieces)


def strftime_size(format: str) -> int:
    """At least the length of ``strftime(format)``: each directive's width, and 64
    characters for any other character."""
    widths = sum(_spec_number(w) for w in re.findall(r"%[-_0^#]*(\d+)", format))
    return widths + 64 * len(format)
