"""Reading a Hugging Face ``config.json`` key by key: :class:`HFConfigReader` records every
key a layout reads and refuses, at the end, every key nobody read that is not known to leave
the arithmetic alone (see :mod:`zoo.checkpoint.hf_config`)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .hf_keys import INERT_KEYS, KEY_TYPES, KeyType

__all__ = ["MISSING", "HFConfigError", "HFConfigReader", "show"]

#: The default of a key that is required (no default given).
MISSING: Any = object()


class HFConfigError(ValueError):
    """A Hugging Face config holds a key zoo cannot honour, or a value of the wrong type."""


def show(value: Any) -> str:
    """``repr(value)``, cut to 80 characters, for messages."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class HFConfigReader:
    """Reads a transformers ``config.json`` for one family, recording every key it reads.

    Args:
        data: the parsed ``config.json``.
        family: the family's name, for error messages (``"Llama"``).
        inert: keys of this family known to leave the arithmetic alone, beyond
            :data:`INERT_KEYS`.
        types: this family's types of keys, over :data:`KEY_TYPES` (a key it narrows, or
            one of its own).

    Raises:
        HFConfigError: naming each key of :data:`KEY_TYPES` (or ``types``) whose value is
            of the wrong type, whether or not anything reads it.
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        *,
        family: str,
        inert: frozenset[str] = frozenset(),
        types: Mapping[str, KeyType] | None = None,
    ):
        self.data = data
        self.family = family
        self.inert = INERT_KEYS | inert
        self.read: set[str] = set()
        self.keys: dict[str, str] = {}  # zoo field -> the key it was read from, as written
        self._check_types({**KEY_TYPES, **(types or {})})

    def _check_types(self, types: Mapping[str, KeyType]) -> None:
        wrong = [
            f"{key} = {show(value)} must be {types[key]}"
            for key, value in self.data.items()
            if key in types and not types[key].accepts(value)
        ]
        if wrong:
            raise self._error(f"{'; '.join(wrong)} (fix config.json)")

    def _error(self, message: str) -> HFConfigError:
        """The error to raise for ``message``, naming the family."""
        return HFConfigError(f"{self.family} config: {message}")

    def get(self, key: str, default: Any = MISSING, *, field: str | None = None) -> Any:
        """The value of ``key`` (``default`` when absent or null; an error when required);
        ``field``: the zoo config field it becomes (:meth:`finish` names ``key`` in that
        field's errors)."""
        self.read.add(key)
        if field is not None:
            self.keys[field] = key
        value = self._value(key)
        if value is None:
            if default is MISSING:
                raise self._error(f"{key!r} is missing")
            return default
        return value

    def _value(self, key: str) -> Any:
        """``data[key]``; a dotted key that the file does not hold as such names a key of a
        nested sub-config (``"attn_config.alibi"``: MPT's), whose parent must be an object."""
        if key in self.data or "." not in key:
            return self.data.get(key)
        parent, _, child = key.partition(".")
        nested = self.data.get(parent)
        if nested is None:
            return None
        if not isinstance(nested, Mapping):
            raise self._error(f"{parent} = {show(nested)} must be an object (it holds {child})")
        return nested.get(child)

    def integer(self, key: str, default: Any = MISSING, *, field: str | None = None) -> int:
        """``key`` as an int (not a bool, a float or a string)."""
        value = self.get(key, default, field=field)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._error(f"{key} = {show(value)} must be an integer")
        return value

    def number(self, key: str, default: Any = MISSING, *, field: str | None = None) -> float:
        """``key`` as a finite float."""
        value = self.get(key, default, field=field)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._error(f"{key} = {show(value)} must be a number")
        if not math.isfinite(value):
            raise self._error(f"{key} = {show(value)} must be finite")
        return float(value)

    def flag(self, key: str, default: Any = MISSING, *, field: str | None = None) -> bool:
        """``key`` as a JSON boolean."""
        value = self.get(key, default, field=field)
        if not isinstance(value, bool):
            raise self._error(f"{key} = {show(value)} must be true or false")
        return value

    def expect(self, key: str, *allowed: Any) -> None:
        """Refuse ``key`` unless it is absent, null, or one of ``allowed`` (the values zoo's
        model computes with)."""
        value = self.get(key, None)
        if value is not None and not any(value == a and type(value) is type(a) for a in allowed):
            wants = " or ".join(show(a) for a in allowed)
            raise self._error(
                f"{key} = {show(value)} changes the model's arithmetic in a way zoo's "
                f"{self.family} layout does not implement (it computes with {wants})"
            )

    def rope_theta(
        self, default: float = 10000.0, *, theta_key: str = "rope_theta", partial: bool = False
    ) -> float:
        """The rotary base, from ``rope_parameters`` (transformers 5) or the top-level
        ``rope_theta`` (4.x; ``theta_key`` where a family spells it otherwise); any scaling
        (``rope_type`` other than ``"default"``, ``rope_scaling``, extra rotary parameters)
        is refused, as is a file whose two spellings disagree. ``partial``: the family reads
        ``partial_rotary_factor`` too (:meth:`rotary_fraction`)."""
        params = self._rope_parameters()
        scaling = self.get("rope_scaling", None)
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise self._error(
                f"rope_parameters.rope_type = {show(rope_type)}: zoo implements only the "
                "default rotary embedding (no scaled or extended variants)"
            )
        known = {"rope_theta", "rope_type", "type"} | (
            {"partial_rotary_factor"} if partial else set()
        )
        extra = sorted(set(params) - known)
        if extra:
            raise self._error(
                f"rope_parameters has {', '.join(f'{k} = {show(params[k])}' for k in extra)}, "
                "which zoo's rotary embedding does not implement"
            )
        if scaling is not None:
            kind = (
                scaling.get("rope_type", scaling.get("type"))
                if isinstance(scaling, Mapping)
                else scaling
            )
            if kind != "default" or set(scaling) - {"rope_type", "type"}:
                raise self._error(
                    f"rope_scaling = {show(scaling)}: zoo implements only the default rotary "
                    "embedding (no scaled or extended variants)"
                )
        theta = self._both(theta_key, params, "rope_theta", field="rope_theta")
        if theta is None:
            return default
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
            raise self._error(f"rope_theta = {show(theta)} must be a positive number")
        if not math.isfinite(theta):
            raise self._error(f"rope_theta = {show(theta)} must be finite")
        return float(theta)

    def rotary_fraction(self, key: str = "partial_rotary_factor", default: float = 1.0) -> float:
        """The share of each head that rotary positions turn: ``rope_parameters.
        partial_rotary_factor`` (transformers 5) or the top-level ``key`` (4.x spells it
        ``partial_rotary_factor``, or ``rotary_pct`` for GPT-NeoX)."""
        params = self._rope_parameters()
        value = self._both(key, params, "partial_rotary_factor", field="rotary_fraction")
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            name = (
                "rope_parameters.partial_rotary_factor"
                if "partial_rotary_factor" in params
                else key
            )
            raise self._error(f"{name} = {show(value)} must be a number in (0, 1]")
        return float(value)

    def _rope_parameters(self) -> Mapping[str, Any]:
        params = self.get("rope_parameters", {})
        if not isinstance(params, Mapping):
            raise self._error(f"rope_parameters = {show(params)} must be an object")
        return params

    def _both(self, top_key: str, params: Mapping[str, Any], nested_key: str, *, field: str) -> Any:
        """A rotary value spelled at the top level (4.x) and/or in ``rope_parameters`` (5):
        either, or both when they agree; ``field``: the zoo field it becomes."""
        top = self.get(top_key, None, field=field)
        nested = params.get(nested_key)
        if nested is not None:
            self.keys[field] = f"rope_parameters.{nested_key}"
        if top is not None and nested is not None and top != nested:
            raise self._error(
                f"{top_key} = {show(top)} and rope_parameters.{nested_key} = {show(nested)} "
                "disagree; fix the file so that one value remains"
            )
        return nested if nested is not None else top

    def finish(self, values: dict[str, Any], config: type | None = None) -> dict[str, Any]:
        """``values``, once every key of the file was read or is known to be inert, and
        (given the family's ``config`` class) once they make a valid config.

        Raises:
            HFConfigError: naming each key (and value) nothing read; zoo refuses rather
                than ignores a key that may change the arithmetic. Or the config's own
                error, each field it names spelled as the key it was read from.
        """
        unknown = sorted(
            unread
            for key, value in self.data.items()
            if key not in self.read and key not in self.inert
            for unread in self._unread(key, value)
        )
        if unknown:
            shown = ", ".join(f"{k} = {show(self._value(k))}" for k in unknown)
            raise self._error(
                f"zoo does not know what {shown} means for this model and refuses rather than "
                "ignores it (it may change the arithmetic). If it does not, remove it from "
                "config.json; otherwise this checkpoint needs a layout that implements it."
            )
        if config is not None:
            try:
                config.from_dict(values)  # type: ignore[attr-defined]
            except ConfigError as exc:
                raise self._error(self._as_written(str(exc), config.__name__)) from None
        return values

    def _unread(self, key: str, value: Any) -> list[str]:
        """``[key]`` for a key nothing read, or for a nested sub-config the keys in it that
        nothing read (as ``parent.child``: a sub-config some keys of which were read is
        checked key by key)."""
        inside = any(r.startswith(f"{key}.") for r in self.read)
        if not inside or not isinstance(value, Mapping):
            return [key]
        return [f"{key}.{k}" for k in value if f"{key}.{k}" not in self.read]

    def _as_written(self, message: str, config_name: str) -> str:
        """A config error's ``message`` with each field read from the file spelled as its
        key there (``Qwen2Config.n_layers = 0`` -> ``num_hidden_layers = 0``)."""
        message = message.replace(f"{config_name}.", "")
        if not self.keys:
            return message
        words = "|".join(re.escape(field) for field in sorted(self.keys, key=len, reverse=True))
        return re.sub(rf"\b(?:{words})\b", lambda m: self.keys[m[0]], message)
