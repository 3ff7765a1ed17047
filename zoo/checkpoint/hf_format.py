"""One family's transformers ``config.json``, both ways, declared once:
:class:`HFConfigFormat` (a table of :class:`HFField` per zoo config field, read through
:class:`~zoo.checkpoint.hf_reader.HFConfigReader`), and the tables families share
(:data:`LLAMA_FIELDS`, :func:`full_attention_only`)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from .hf_keys import KeyType
from .hf_reader import MISSING, HFConfigReader, show

__all__ = ["LLAMA_FIELDS", "HFConfigFormat", "HFField", "full_attention_only"]


@dataclasses.dataclass(frozen=True)
class HFField:
    """How one zoo config field is spelled in a transformers ``config.json``.

    Args:
        key: the key in ``config.json``; ``"parent.child"`` for a key of a nested sub-config
            (MPT's ``attn_config``): read from, and written into, the object ``parent``.
        default: the value when the file lacks the key or holds null (transformers' own
            default for that family, as the file would spell it); absent: the key is
            required (for fields zoo requires).
        write: ``config -> value`` written on export (default: the field's value).
        read: ``value -> zoo value``, a conversion of the key's value (or of ``default``)
            when read, for a key that spells the field otherwise (Gemma's
            ``query_pre_attn_scalar`` is ``attn_scale ** -2``); needs ``write``, its
            inverse. The key's type is checked before (:data:`KEY_TYPES`), the result by the
            config class after; an error it raises (``ValueError``, ``TypeError``,
            ``ArithmeticError``) is refused naming the key. Absent or null, with no default
            (an optional field): ``None``, unconverted.

    Example::

        "attn_scale": HFField(
            "query_pre_attn_scalar", 256,
            read=lambda scalar: scalar**-0.5, write=lambda c: round(c.attn_scale**-2),
        )
    """

    key: str
    default: Any = MISSING
    write: Callable[[Any], Any] | None = None
    read: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        if self.read is not None and self.write is None:
            raise ValueError(
                f"HFField({self.key!r}): read= converts the key's value, so write= must give "
                "it back (config -> value) or an export would write the zoo value under it"
            )


def full_attention_only(r: HFConfigReader) -> dict[str, Any]:
    """Qwen2/Qwen3's sliding-window switches (``use_sliding_window``, ``max_window_layers``,
    ``layer_types``), which their released models leave off: refused unless every layer
    attends to the whole context, which is what zoo computes."""
    r.expect("use_sliding_window", False)
    r.get("max_window_layers", None)  # which layers would slide: moot with the switch off
    if not r.flag("use_sliding_window", False):
        r.get("sliding_window", None)  # the window size: moot with the switch off
    r.expect("layer_types", ["full_attention"] * r.integer("num_hidden_layers"))
    return {}


def _field_kind(annotation: Any) -> tuple[type, bool]:
    """``int``/``float``/``bool``/``str`` of a field's annotation, and whether it is optional."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner, True
    return annotation, False


@dataclasses.dataclass(frozen=True)
class HFConfigFormat:
    """One family's transformers ``config.json``, both ways, declared once.

    Each zoo field of ``fields`` is read from its key (type-checked by the field's own
    annotation in ``config``); ``fixed`` keys must hold the one value zoo computes with (or
    be absent) and are written on export; ``checked`` keys likewise, but are not written
    (flags some writers add); ``inert`` keys change no forward pass; every other
    key is refused (:meth:`HFConfigReader.finish`). ``rope_theta`` is read through
    :meth:`HFConfigReader.rope_theta`, ``rotary_dim`` as transformers computes the count
    (a ``rotary_dim`` key is the count; a fraction key, ``rotary_pct`` or
    ``partial_rotary_factor``, gives ``int(head_size * fraction)``, through
    :meth:`~HFConfigReader.rotary_fraction`), so both transformers generations' spellings
    load; ``HFField(read=, write=)`` converts a field spelled otherwise (for any field,
    ``rope_theta`` and ``rotary_dim`` included: the conversion then replaces their reading).
    ``read_extra`` reads what a table cannot say (Qwen2's window switches) and returns more
    zoo values; ``write_extra`` adds keys on export. Every key present is first type-checked against
    :data:`KEY_TYPES`, narrowed by ``types`` (the family's own annotation, where it allows
    less) and extended by it (the types of keys only this family has: a plugin declares
    them there); a value the config class refuses is reported under the key it was read from.

    Example (a Llama-like family)::

        QWEN2 = HFConfigFormat(
            family="Qwen2", model_type="qwen2", architecture="Qwen2ForCausalLM",
            config=Qwen2Config, fields=LLAMA_FIELDS, fixed={"hidden_act": "silu"},
        )
        values = QWEN2.read(zoo.jsonfile.read("config.json"))
    """

    family: str
    model_type: str
    architecture: str
    config: type
    fields: Mapping[str, str | HFField]
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    checked: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    inert: frozenset[str] = frozenset()
    types: Mapping[str, KeyType] = dataclasses.field(default_factory=dict)
    read_extra: Callable[[HFConfigReader], Mapping[str, Any]] | None = None
    write_extra: Callable[[Any], Mapping[str, Any]] | None = None

    def _spec(self, field: str) -> HFField:
        spec = self.fields[field]
        return spec if isinstance(spec, HFField) else HFField(spec)

    def read(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """zoo config values of a transformers ``config.json`` (refusing what zoo lacks)."""
        r = HFConfigReader(data, family=self.family, inert=self.inert, types=self.types)
        for key, value in (*self.fixed.items(), *self.checked.items()):
            r.expect(key, value)
        hints = typing.get_type_hints(self.config)
        counted = "rotary_dim" in self.fields and self._spec("rotary_dim").read is None
        fields = [field for field in self.fields if field != "rotary_dim" or not counted]
        values = {field: self._read(r, field, hints[field]) for field in fields}
        if counted:
            values["rotary_dim"] = self._rotary_dim(r, values)
        if self.read_extra is not None:
            values.update(self.read_extra(r))
        if values.get("head_dim") is not None and values["head_dim"] * values.get(
            "n_heads", 0
        ) == values.get("d_model"):
            values["head_dim"] = None  # d_model / n_heads, zoo's default: one spelling
        return r.finish(values, self.config)

    def _read(self, r: HFConfigReader, field: str, annotation: Any) -> Any:
        spec = self._spec(field)
        if field == "rope_theta" and spec.read is None:
            default = 10000.0 if spec.default is MISSING else spec.default
            partial = "rotary_dim" in self.fields and self._spec("rotary_dim").key != "rotary_dim"
            return r.rope_theta(default, theta_key=spec.key, partial=partial)
        kind, optional = _field_kind(annotation)
        default = None if optional and spec.default is MISSING else spec.default
        if spec.read is not None:
            return self._convert(r, field, spec, default)
        absent_or_null = optional and (spec.key in r.data or default is None)
        if absent_or_null and r.get(spec.key, None, field=field) is None:
            return None  # null in the file (or absent, defaulting to null): "none" in zoo
        read = {int: r.integer, float: r.number, bool: r.flag}.get(kind, r.get)
        return read(spec.key, default, field=field)

    @staticmethod
    def _convert(r: HFConfigReader, field: str, spec: HFField, default: Any) -> Any:
        """The value of a field with a read-time conversion (:attr:`HFField.read`)."""
        value = r.get(spec.key, default, field=field)
        if value is None:
            return None
        assert spec.read is not None
        try:
            return spec.read(value)
        except (ValueError, TypeError, ArithmeticError) as exc:
            raise r._error(f"{spec.key} = {show(value)} cannot be read: {exc}") from None

    def _rotary_dim(self, r: HFConfigReader, values: Mapping[str, Any]) -> int | None:
        """``rotary_dim`` as transformers computes it: the count itself (key ``rotary_dim``,
        GPT-J), or ``int(head_size * fraction)`` of a fraction key (``rotary_pct``,
        ``partial_rotary_factor``, top level or in ``rope_parameters``: transformers' rope
        initialisation and GPT-NeoX's attention both truncate so); ``None`` when every
        feature turns. A count zoo cannot turn (odd: rotate-half pairs features ``i`` and
        ``i + n/2``; zero; more than the head) is refused, naming the key."""
        spec = self._spec("rotary_dim")
        heads, width = values.get("n_heads"), values.get("d_model")
        if not (isinstance(heads, int) and isinstance(width, int) and heads > 0):
            return None  # the config's own check names the bad size
        head = values.get("head_dim") or width // heads
        if spec.key == "rotary_dim":
            default = None if spec.default is MISSING else spec.default
            count = r.get(spec.key, default, field="rotary_dim")
            if count is None:
                return None  # null (GPT-J): every feature turns
            if isinstance(count, bool) or not isinstance(count, int):
                raise r._error(f"rotary_dim = {show(count)} must be an integer")
            how = f"rotary_dim = {count} asks for {count}"
        else:
            default = 1.0 if spec.default is MISSING else spec.default
            fraction = r.rotary_fraction(spec.key, default)
            count = int(head * fraction)
            key = r.keys.get("rotary_fraction", spec.key)
            how = f"{key} = {show(fraction)} gives int({head} * {show(fraction)}) = {count}"
        if count == head:
            return None
        if count % 2 or not 0 < count <= head:
            raise r._error(
                f"{how} rotary features of a {head}-feature head; zoo turns an even count in "
                "[2, head size] (rotate-half pairs features i and i + n/2), so it refuses "
                "rather than load a different model"
            )
        return int(count)

    def _write_rotary(self, config: Any) -> float | int:
        """``rotary_dim`` as the file spells it: the count, or the fraction ``f`` that gives
        it back under transformers' ``int(head_size * f)`` (the nearest float to
        ``count / head_size``, or the next one up where that rounds below the count)."""
        head = config.head_size
        count = head if config.rotary_dim is None else config.rotary_dim
        if self._spec("rotary_dim").key == "rotary_dim":
            return int(count)
        fraction = count / head
        while int(head * fraction) < count:  # float rounding: the next float up
            fraction = math.nextafter(fraction, 2.0)
        return fraction

    def write(self, config: Any) -> dict[str, Any]:
        """The transformers ``config.json`` of a zoo config."""
        out: dict[str, Any] = {"model_type": self.model_type, "architectures": [self.architecture]}
        for field in self.fields:
            spec = self._spec(field)
            if field == "rotary_dim" and spec.write is None:
                value = self._write_rotary(config)
            else:
                value = spec.write(config) if spec.write else getattr(config, field)
            _put(out, spec.key, value)
        out.update(self.fixed)
        if self.write_extra is not None:
            out.update(self.write_extra(config))
        return out


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    """``out[key] = value``; a dotted key (``"attn_config.alibi"``) into a nested object."""
    if "." not in key:
        out[key] = value
        return
    parent, _, child = key.partition(".")
    nested = out.setdefault(parent, {})
    if not isinstance(nested, dict):
        raise ValueError(f"{parent!r} is written both as a value and as a sub-config ({key})")
    nested[child] = value


#: The config.json of Llama and the families that copy it (Qwen2/3, Mistral, Mixtral).
LLAMA_FIELDS: Mapping[str, str | HFField] = {
    "vocab_size": "vocab_size",
    "context_length": "max_position_embeddings",
    "d_model": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": HFField("num_key_value_heads", write=lambda c: c.n_kv_heads or c.n_heads),
    "n_layers": "num_hidden_layers",
    "d_ff": "intermediate_size",
    "head_dim": HFField("head_dim", write=lambda c: c.head_size),
    "layer_norm_eps": HFField("rms_norm_eps", 1e-6),
    "rope_theta": HFField("rope_theta", 10000.0),
    "tie_embeddings": HFField("tie_word_embeddings", False),
}
