"""What each operation of a chat template would build, checked before it runs: the text of
a ``%`` or ``format`` spec, the result of an arithmetic operator, the string a string method
(``ljust``, ``replace``, ``join``...) would write, the text or items a filter would write or
walk; and the filters replaced by bounded equivalents with the same results (``sum``,
``wordcount``, ``tojson``). The budgets themselves, and the meter that counts them, are
:mod:`.chat_limits`'s."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sized
from typing import Any

import jinja2.exceptions
import jinja2.filters
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils
import markupsafe
from jinja2.utils import _PassArg

from . import chat_limits as limits
from .chat_limits import (
    as_int,
    built,
    check_items,
    check_text,
    counted,
    is_int,
    over,
    repr_size,
    size_and_height,
    step,
    sum_size,
    text_size,
)
from .chat_methods import case_size, check_call, escaped_size

# -- formats ---------------------------------------------------------------------------------
_PERCENT = re.compile(r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.?)", re.S)
_DIGITS = re.compile(r"\d+")
#: Characters a number can take, beyond its precision and width.
_NUMBER_SIZE = 400
#: Most characters ``Markup`` writes for one it escapes (``'`` is ``&#39;``).
_ESCAPE_GROWTH = 5


def _spec_number(digits: str) -> int:
    if len(digits) > 18:
        raise over(
            "a format spec asks for a width or precision of", 10**18, limits.MAX_SIZE, "MAX_SIZE"
        )
    return int(digits) if digits else 0


def _field_size(value: Any, kind: str) -> int:
    """Characters one ``%`` or ``format`` field writes for ``value``, width aside."""
    if isinstance(value, int):  # in binary, grouped by 4 (``{:_b}``), at most
        return 2 * value.bit_length() + _NUMBER_SIZE
    if isinstance(value, float) or kind not in "sra":
        return 2 * text_size(value) + _NUMBER_SIZE
    if kind == "s":
        return text_size(value) + _NUMBER_SIZE
    return repr_size(value, ascii=kind == "a") + _NUMBER_SIZE


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
    _growth = 1  # characters written for one of a field's

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
        self._size = len(format_string)
        return super().vformat(format_string, args, kwargs)

    def format_field(self, value: Any, format_spec: str) -> Any:
        self._size += self._growth * format_size(value, format_spec)
        check_text(self._size, "a format would write a string of")
        return super().format_field(value, format_spec)

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion is not None:
            check_text(_field_size(value, conversion), "a format would write a field of")
        return super().convert_field(value, conversion)


class BoundedEscapeFormatter(BoundedFormatter, jinja2.sandbox.SandboxedEscapeFormatter):
    """:class:`BoundedFormatter` for ``Markup.format``, which escapes each field."""

    _growth = _ESCAPE_GROWTH


# -- operators -------------------------------------------------------------------------------
def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse ``left operator right`` before it is computed when its result would be too
    large."""
    if is_int(left) and is_int(right) and operator in ("+", "-", "*", "**"):
        _check_bits(operator, left, right)
    elif operator in "-/" or operator == "//":
        return  # no result is longer than its operands
    elif operator == "*":
        _check_product(left, right)
    elif operator == "+":
        _check_sum(left, right)
    elif operator == "%" and isinstance(left, (str, bytes)):
        escaping = _ESCAPE_GROWTH if isinstance(left, markupsafe.Markup) else 1
        check_text(escaping * percent_size(left, right), "a % format would write a string of")


def _check_bits(operator: str, left: int, right: int) -> None:
    """Refuse an integer ``left operator right`` (``+``, ``-``, ``*``, ``**``) of more than
    :data:`.chat_limits.MAX_POWER_BITS` bits."""
    bits = limits.MAX_POWER_BITS
    if operator == "**":
        if right > 0 and abs(left) > 1 and left.bit_length() * right > bits:
            raise over(f"{left} ** {right} has more bits than", bits, bits, "MAX_POWER_BITS")
    elif operator == "*":
        if left.bit_length() + right.bit_length() > bits + 1:
            raise over("a product would have a number of bits above", bits, bits, "MAX_POWER_BITS")
    elif max(left.bit_length(), right.bit_length()) >= bits:
        what = f"a {operator} would build an integer of more bits than"
        raise over(what, bits, bits, "MAX_POWER_BITS")


def _check_sum(left: Any, right: Any) -> None:
    _check_length(_length(left) + _length(right), left, right)
    if isinstance(left, markupsafe.Markup) or isinstance(right, markupsafe.Markup):
        check_text(escaped_size(left) + escaped_size(right), "+ would build a string of")
    elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        sum_size(None, left, right)  # the text of the list it would build


def _check_product(left: Any, right: Any) -> None:
    sequence, times = (right, left) if is_int(left) else (left, right)
    if is_int(times):
        _check_length(_length(sequence) * times, sequence)
        if isinstance(sequence, (list, tuple)):
            sum_size(None, sequence, times)


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


# -- calls: the methods of values, and the template's globals ------------------------------
#: Keywords Jinja adds to a call inside a loop or block (``Context.call`` drops them).
_CONTEXT_ARGUMENTS = frozenset({"_loop_vars", "_block_vars"})


def prepare_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The arguments of a call from a template, refused before it runs when it calls a
    method that is not sized (:func:`.chat_methods.check_call`) or when its result would be
    too large (the lazy iterable of a string's ``join`` is drawn first, one step per item, to
    be measured)."""
    owner = getattr(obj, "__self__", None)
    kwargs = {k: v for k, v in kwargs.items() if k not in _CONTEXT_ARGUMENTS}
    if isinstance(owner, (str, bytes)):
        name = getattr(obj, "__name__", "")
        if name == "join" and args and not isinstance(args[0], Collection):
            args = (list(counted(args[0])), *args[1:])
        for value in (*args, *kwargs.values()):
            if is_int(value) and abs(value) > limits.MAX_SIZE:
                raise over(
                    "a string method was given the number", value, limits.MAX_SIZE, "MAX_SIZE"
                )
    if obj is jinja2.utils.generate_lorem_ipsum:
        bound = inspect.signature(obj).bind(*args, **kwargs)
        bound.apply_defaults()
        size = as_int(bound.arguments["n"]) * (as_int(bound.arguments["max"]) + 2) * 16
        check_text(size, "lipsum() would write a string of")
    check_call(obj, args, kwargs)
    return args


# -- filters ---------------------------------------------------------------------------------
def _string_of(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _case_filter(name: str) -> Callable[..., int]:
    def size(value: Any, *_: Any, **__: Any) -> int:
        s = _string_of(value)
        return 3 * text_size(value) if s is None else case_size(name, s)

    return size


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
    old, new = str(old), str(new)
    times = s.count(old) if old else len(s) + 1
    if is_int(count) and count >= 0:
        times = min(times, count)
    return len(s) + times * max(0, len(new) - len(old))


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
    size, height = size_and_height(value)
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
    "escape": escaped_size,
    "e": escaped_size,
    "forceescape": escaped_size,
    **{name: _case_filter(name) for name in ("capitalize", "lower", "title", "upper")},
    "format": lambda value, *args, **kwargs: (
        percent_size(str(value), kwargs or args)
        * (_ESCAPE_GROWTH if isinstance(value, markupsafe.Markup) else 1)
    ),
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
    size, height = size_and_height(value)
    size *= 12 if ensure_ascii else 1  # \\ud83d\\ude00 for one character
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
