"""Command-line flags made from a dataclass's fields, so that a settings class is written once
and its flags follow it (``zoo train``'s from :class:`~zoo.train.TrainConfig`).

Each field ``name`` becomes ``--name`` (underscores as dashes) with the field's default, a
type from its annotation (``int``, ``float``, ``str``; ``X | None``, where ``none`` gives
``None``; ``bool``: a switch; ``Literal[...]``: choices; ``tuple[X, X]``: that many values,
``tuple[X, ...]``: one or more) and help from the class docstring's ``Args:`` section,
followed by the default. A field with
no ``Args:`` entry, or of a type with no flag, is an error when the flags are made.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Derived", "add_dataclass_flags", "dataclass_values", "field_docs", "flag"]


@dataclasses.dataclass(frozen=True)
class Derived:
    """A field whose command-line default is computed from the other values.

    Args:
        text: the default as ``--help`` shows it (``--lr / 10``).
        value: the default from the values of every field.
    """

    text: str
    value: Callable[[Mapping[str, Any]], Any]


def flag(name: str) -> str:
    """The flag of field ``name`` (``batch_size`` -> ``--batch-size``)."""
    return "--" + name.replace("_", "-")


def field_docs(cls: type) -> dict[str, str]:
    """``{field: text}`` from the ``Args:`` section of ``cls``'s docstring (Google style:
    ``name: text`` lines, continued on more indented ones), each text on one line."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    docs: dict[str, list[str]] = {}
    inside, current = False, None
    for line in lines:
        if line.strip() == "Args:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):  # the next section, or the end of this one
            break
        entry = re.fullmatch(r" {4}(\w+): (.*)", line)
        if entry:
            current = entry[1]
            docs[current] = [entry[2]]
        elif current is not None and line.strip():
            docs[current].append(line.strip())
    return {name: " ".join(parts) for name, parts in docs.items()}


def _help(text: str, names: Mapping[str, str]) -> str:
    """A docstring's text as ``--help`` shows it: reST roles and literals as plain text, a
    field's name as its flag."""
    text = re.sub(r":\w+:`(~?)([\w.]+)`", lambda m: m[2].rpartition(".")[2] if m[1] else m[2], text)
    text = re.sub(r"``None``", "none", text)
    text = re.sub(r"``(\w+)``", lambda m: names.get(m[1], m[1]), text)
    return text.replace("``", "").rstrip(".").replace("%", "%%")


def _shown(value: Any) -> str:
    """A default as ``--help`` shows it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return " ".join(_shown(v) for v in value)
    return str(value)


def _or_none(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, and ``none`` for ``None`` (the default ``--help`` shows)."""

    def parse_or_none(text: str) -> Any:
        return None if text == "none" else parse(text)

    parse_or_none.__name__ = parse.__name__  # argparse's "invalid int value: 'x'"
    return parse_or_none


def _kind(hint: Any, default: Any) -> dict[str, Any]:
    """``add_argument``'s type, choices, nargs or action for a field annotated ``hint``;
    ``{}`` for a type no flag is made for."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _optional(args, default)
    if hint is bool:
        return {"action": "store_true" if default is False else argparse.BooleanOptionalAction}
    if origin is typing.Literal and len({type(a) for a in args}) == 1:
        return {"choices": args, "type": type(args[0])}
    if origin is tuple:
        return _sequence(args)
    return {"type": hint} if hint in (int, float, str) else {}


def _optional(members: tuple[Any, ...], default: Any) -> dict[str, Any]:
    """:func:`_kind` of ``X | None`` (not ``bool | None``): ``X``'s, and ``none`` for ``None``."""
    inner = [m for m in members if m is not type(None)]
    if len(members) != 2 or len(inner) != 1 or inner[0] is bool:
        return {}
    kind = _kind(inner[0], default)
    return {**kind, "type": _or_none(kind["type"])} if "type" in kind else {}


def _sequence(items: tuple[Any, ...]) -> dict[str, Any]:
    """:func:`_kind` of ``tuple[X, ...]`` (one or more values) or ``tuple[X, X]`` (two)."""
    nargs: int | str
    if len(items) == 2 and items[1] is Ellipsis:
        nargs = "+"
    elif items and len(set(items)) == 1:
        nargs = len(items)
    else:
        return {}
    kind = _kind(items[0], None)
    return {**kind, "nargs": nargs} if "type" in kind else {}


def add_dataclass_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    derived: Mapping[str, Derived] | None = None,
) -> None:
    """A flag on ``parser`` for each field of the dataclass ``cls`` (see the module's
    docstring); a field in ``derived`` defaults to ``None``, computed by
    :func:`dataclass_values`."""
    derived = derived or {}
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    names = {f.name: flag(f.name) for f in fields}
    for field in fields:
        if field.name not in docs:
            raise TypeError(f"{cls.__name__}.{field.name} has no entry in its Args: section")
        default = field.default
        if default is dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{field.name} has no default")
        kind = _kind(hints[field.name], default)
        if not kind:
            raise TypeError(f"{cls.__name__}.{field.name}: no flag for {hints[field.name]}")
        shown = derived[field.name].text if field.name in derived else _shown(default)
        parser.add_argument(
            names[field.name],
            dest=field.name,
            default=None if field.name in derived else default,
            help=f"{_help(docs[field.name], names)} (default: {shown})",
            **kind,
        )


def dataclass_values(
    args: argparse.Namespace, cls: type, derived: Mapping[str, Derived] | None = None
) -> dict[str, Any]:
    """The values of ``cls``'s fields that the flags of :func:`add_dataclass_flags` parsed
    into ``args``: a list as a tuple, a derived default computed."""
    values = {
        f.name: tuple(v) if isinstance(v := getattr(args, f.name), list) else v
        for f in dataclasses.fields(cls)
    }
    for name, rule in (derived or {}).items():
        if values[name] is None:
            values[name] = rule.value(values)
    return values
