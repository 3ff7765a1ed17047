"""One typed validator for the fields of zoo's frozen dataclasses (model configs, training
settings, generation settings): each field's value is checked against its annotation when
the instance is created, and a wrong type is a :class:`~zoo.errors.ConfigError` naming the
class, the field, what was expected and what was given.

Annotations understood: ``int``, ``float`` (ints are widened; NaN and infinities refused),
``bool``, ``str``, ``dict``, ``list``, ``tuple`` (``tuple[A, B]`` item by item;
``tuple[A, ...]`` from a tuple or a list), ``Literal[...]`` and ``X | None``. A
``bool`` is never accepted for an ``int`` or ``float`` field.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

from .errors import ConfigError
from .options import SEED_RANGE

__all__ = ["check_fields", "check_seed", "check_value", "describe_type", "short_int"]


def describe_type(tp: Any) -> str:
    """``tp`` as a message shows it: ``'gelu' | 'relu'`` for a Literal, else its name."""
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " | ".join(describe_type(a) for a in typing.get_args(tp))
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _literal(where: str, tp: Any, value: Any) -> Any:
    if value in typing.get_args(tp):
        return value
    raise ConfigError(f"{where} = {value!r} is not valid; choose one of {describe_type(tp)}")


def _union(where: str, tp: Any, value: Any) -> Any:
    options = typing.get_args(tp)
    if value is None and type(None) in options:
        return None
    real = [o for o in options if o is not type(None)]
    if len(real) == 1:
        return check_value(where, real[0], value)
    for option in real:
        try:
            return check_value(where, option, value)
        except ConfigError:
            continue
    raise ConfigError(f"{where} must be {describe_type(tp)}, got {type(value).__name__} {value!r}")


def _number(where: str, tp: Any, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _wrong(where, tp, value)
    if tp is int:
        return value if isinstance(value, int) else _wrong(where, tp, value)
    if not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def _tuple(where: str, tp: Any, value: Any) -> tuple[Any, ...]:
    """A fixed-length ``tuple[A, B]``: that many items, each checked (floats widened)."""
    items = typing.get_args(tp)
    if not isinstance(value, tuple) or len(value) != len(items):
        raise ConfigError(
            f"{where} must be a tuple of {len(items)} ({', '.join(map(describe_type, items))}), "
            f"got {value!r}"
        )
    pairs = enumerate(zip(items, value, strict=True))
    return tuple(check_value(f"{where}[{i}]", t, v) for i, (t, v) in pairs)


def _sequence(where: str, item: Any, value: Any) -> tuple[Any, ...]:
    """A ``tuple[A, ...]``: a tuple or a list (as JSON writes it), each item checked."""
    if not isinstance(value, (tuple, list)):
        raise ConfigError(f"{where} must be a list of {describe_type(item)}, got {value!r}")
    return tuple(check_value(f"{where}[{i}]", item, v) for i, v in enumerate(value))


def _wrong(where: str, tp: Any, value: Any) -> Any:
    raise ConfigError(f"{where} must be {describe_type(tp)}, got {type(value).__name__} {value!r}")


def check_value(where: str, tp: Any, value: Any) -> Any:
    """``value`` checked against the annotation ``tp`` (ints widened to float for float
    fields), or a :class:`~zoo.errors.ConfigError` that names ``where``."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return _literal(where, tp, value)
    if origin in (typing.Union, types.UnionType):
        return _union(where, tp, value)
    if tp in (int, float):
        return _number(where, tp, value)
    if origin is tuple and typing.get_args(tp) and Ellipsis not in typing.get_args(tp):
        return _tuple(where, tp, value)
    if origin is tuple and typing.get_args(tp)[1:] == (Ellipsis,):
        return _sequence(where, typing.get_args(tp)[0], value)
    check = origin or tp
    if isinstance(check, type) and isinstance(value, check):
        return value
    if tp is Any:
        return value
    return _wrong(where, tp, value)


def check_fields(instance: Any) -> None:
    """Check every field of the frozen dataclass ``instance`` against its annotation,
    storing the checked values (floats widened) on it."""
    hints = typing.get_type_hints(type(instance))
    name = type(instance).__name__
    for field in dataclasses.fields(instance):
        value = check_value(
            f"{name}.{field.name}", hints[field.name], getattr(instance, field.name)
        )
        object.__setattr__(instance, field.name, value)


def check_seed(seed: int | None) -> None:
    """Raise :class:`~zoo.errors.ConfigError` (a ``ValueError``) unless ``seed`` is ``None``
    or an integer a ``torch.Generator`` takes (:data:`SEED_RANGE`)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed must be an integer or None, got {seed!r}")
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ConfigError(
            f"seed must be an integer from 0 to 2**64 - 1 ({SEED_RANGE[1]}) (negative ones "
            f"down to -2**63 wrap around modulo 2**64), got {short_int(seed)}"
        )


def short_int(number: int) -> str:
    """``number`` in decimal, or its size when the decimal would be long (or beyond the
    digits Python's ``str`` converts)."""
    return (
        str(number) if number.bit_length() <= 256 else f"an integer of {number.bit_length()} bits"
    )
