"""Reading a Hugging Face ``config.json`` without guessing.

A layout's ``config_from_foreign`` turns a transformers config into zoo config values. Every
key of that file either changes the arithmetic (and is then honoured or refused) or does not
(dropouts, token ids, bookkeeping). :class:`HFConfigReader` makes that explicit: a layout
reads each key it honours, states the value each key it cannot honour must have, and
:meth:`HFConfigReader.finish` refuses every key nobody read that is not known to leave the
math alone, so a key a newer transformers adds is an error naming it, never silently dropped.

Both transformers generations are read: 4.x writes ``rope_theta`` and ``rope_scaling`` at the
top level, 5.x writes ``rope_parameters: {"rope_theta": ..., "rope_type": ...}``.

Example (a layout's ``config_from_foreign``)::

    def config_from_hf(hf):
        r = HFConfigReader(hf, family="Llama")
        r.expect("hidden_act", "silu")
        d_model = r.integer("hidden_size")
        values = {"d_model": d_model, "rope_theta": r.rope_theta()}
        return r.finish(values)
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigError

__all__ = [
    "INERT_KEYS",
    "KEY_TYPES",
    "LLAMA_FIELDS",
    "POSITIVE_INT",
    "HFConfigError",
    "HFConfigFormat",
    "HFConfigReader",
    "HFField",
    "KeyType",
    "full_attention_only",
]

#: Keys of transformers' ``PretrainedConfig`` and of the families zoo reads that never change
#: a forward pass: bookkeeping, token ids, generation defaults, dropouts (zoo reads the one
#: it uses), initialisation, output switches, classification labels, and pure re-orderings
#: of the same arithmetic (``chunk_size_feed_forward``, ``pretraining_tp``).
INERT_KEYS = frozenset(
    {
        "_name_or_path", "architectures", "model_type", "transformers_version", "dtype",
        "torch_dtype", "use_bfloat16", "_attn_implementation", "_commit_hash",
        "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
        "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id",
        "use_cache", "return_dict", "output_attentions", "output_hidden_states",
        "torchscript", "tf_legacy_loss", "pruned_heads", "chunk_size_feed_forward",
        "id2label", "label2id", "num_labels", "problem_type", "finetuning_task",
        "tokenizer_class", "prefix", "task_specific_params", "initializer_range",
        "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
        "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
        "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
        "output_scores", "return_dict_in_generate", "remove_invalid_values",
        "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
        "attn_pdrop", "embd_pdrop", "resid_pdrop", "attention_dropout", "hidden_dropout",
        "summary_activation", "summary_first_dropout", "summary_proj_to_labels",
        "summary_type", "summary_use_proj", "pretraining_tp", "n_ctx", "gradient_checkpointing",
    }
)  # fmt: skip

_MISSING = object()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A JSON number: an int (JSON does not tell 1 from 1.0; JavaScript writers drop the
    ``.0``) or a finite float; never a bool."""
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


@dataclasses.dataclass(frozen=True)
class KeyType:
    """What one ``config.json`` key may hold: a non-null value passes ``test``; null passes
    only when ``null`` (transformers' annotation of the key allows None). ``what`` names the
    type in messages (``"an integer"``)."""

    what: str
    test: Callable[[Any], bool]
    null: bool = False

    @property
    def or_null(self) -> KeyType:
        """The same type, null allowed."""
        return dataclasses.replace(self, null=True)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (parsed JSON) is of this type."""
        return self.null if value is None else self.test(value)

    def __str__(self) -> str:
        return f"{self.what} or null" if self.null else self.what


INT = KeyType("an integer", _is_int)
POSITIVE_INT = KeyType("a positive integer", lambda v: _is_int(v) and v > 0)
NUMBER = KeyType("a number", _is_number)
POSITIVE_NUMBER = KeyType("a positive number", lambda v: _is_number(v) and v > 0)
BOOL = KeyType("true or false", lambda v: isinstance(v, bool))
STRING = KeyType("a string", lambda v: isinstance(v, str))
STRINGS = KeyType(
    "a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)
)
LIST = KeyType("a list", lambda v: isinstance(v, list))
OBJECT = KeyType("an object", lambda v: isinstance(v, Mapping))
TOKEN_IDS = KeyType(
    "an integer or a list of integers",
    lambda v: _is_int(v) or (isinstance(v, list) and all(_is_int(x) for x in v)),
)
FLAG_OR_STRING = KeyType("true, false or a string", lambda v: isinstance(v, (bool, str)))

#: The type of every ``config.json`` key zoo knows (read, checked or inert), for every family:
#: :class:`HFConfigReader` checks each key present against it before reading anything, so a
#: value of the wrong type is refused naming the key as written even where another key makes
#: it moot (``sliding_window: "x"`` with ``use_sliding_window: false``). The types are
#: transformers' annotations (the union over the families; a layout narrows one with
#: ``types``), except that an integer is a number (JSON does not tell 1 from 1.0). Sizes are
#: positive, as zoo's configs require.
KEY_TYPES: Mapping[str, KeyType] = {
    # sizes, and the keys that change the arithmetic
    **dict.fromkeys(
        ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
         "num_attention_heads", "max_position_embeddings", "n_positions", "n_embd", "n_layer",
         "n_head", "num_local_experts", "num_experts_per_tok"),
        POSITIVE_INT,
    ),
    **dict.fromkeys(("num_key_value_heads", "head_dim", "n_inner"), POSITIVE_INT.or_null),
    "sliding_window": INT.or_null, "max_window_layers": INT, "n_special": INT, "n_ctx": INT,
    **dict.fromkeys(("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"), POSITIVE_NUMBER),
    **dict.fromkeys(("rope_theta", "rotary_emb_base"), POSITIVE_NUMBER.or_null),
    **dict.fromkeys(("rotary_pct", "partial_rotary_factor"), NUMBER.or_null),
    "rotary_dim": INT.or_null,
    "rope_parameters": OBJECT.or_null, "rope_scaling": OBJECT.or_null,
    "layer_types": STRINGS.or_null,
    **dict.fromkeys(("hidden_act", "hidden_activation", "activation_function", "afn"), STRING),
    "original_max_position_embeddings": POSITIVE_INT,
    **dict.fromkeys(
        ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window",
         "use_parallel_residual", "rope_interleaved", "scale_attn_weights",
         "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention",
         "is_encoder_decoder", "is_decoder", "is_llama_config", "predict_special_tokens",
         "output_router_logits", "use_cache", "use_bfloat16", "torchscript", "tf_legacy_loss",
         "summary_use_proj", "summary_proj_to_labels", "gradient_checkpointing"),
        BOOL,
    ),
    # inert keys: bookkeeping, token ids, generation defaults, dropouts, labels
    "_name_or_path": STRING, "model_type": STRING, "summary_type": STRING,
    **dict.fromkeys(
        ("transformers_version", "dtype", "torch_dtype", "_attn_implementation",
         "_commit_hash", "problem_type", "finetuning_task", "tokenizer_class", "prefix",
         "summary_activation"),
        STRING.or_null,
    ),
    "architectures": STRINGS.or_null,
    **dict.fromkeys(
        ("bos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
         "forced_bos_token_id", "forced_eos_token_id", "max_length", "min_length",
         "num_beams", "num_beam_groups", "top_k", "no_repeat_ngram_size",
         "encoder_no_repeat_ngram_size", "num_return_sequences", "pretraining_tp"),
        INT.or_null,
    ),
    "eos_token_id": TOKEN_IDS.or_null, "chunk_size_feed_forward": INT, "num_labels": INT,
    **dict.fromkeys(
        ("return_dict", "output_attentions", "output_hidden_states", "do_sample",
         "output_scores", "return_dict_in_generate", "remove_invalid_values"),
        BOOL.or_null,
    ),
    "early_stopping": FLAG_OR_STRING.or_null,
    **dict.fromkeys(
        ("diversity_penalty", "temperature", "top_p", "typical_p", "repetition_penalty",
         "length_penalty"),
        NUMBER.or_null,
    ),
    **dict.fromkeys(
        ("bad_words_ids", "suppress_tokens", "begin_suppress_tokens",
         "exponential_decay_length_penalty"),
        LIST.or_null,
    ),
    **dict.fromkeys(
        ("initializer_range", "attn_pdrop", "embd_pdrop", "resid_pdrop", "attention_dropout",
         "hidden_dropout", "summary_first_dropout", "router_aux_loss_coef",
         "router_jitter_noise"),
        NUMBER,
    ),
    "classifier_dropout": NUMBER.or_null,
    **dict.fromkeys(("id2label", "label2id", "task_specific_params"), OBJECT.or_null),
    "pruned_heads": OBJECT, "transformers.js_config": OBJECT, "auto_map": OBJECT.or_null,
    "cache_implementation": STRING.or_null, "use_bidirectional_attention": BOOL.or_null,
}  # fmt: skip


class HFConfigError(ValueError):
    """A Hugging Face config holds a key zoo cannot honour, or a value of the wrong type."""


def _show(value: Any) -> str:
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
            f"{key} = {_show(value)} must be {types[key]}"
            for key, value in self.data.items()
            if key in types and not types[key].accepts(value)
        ]
        if wrong:
            raise self._error(f"{'; '.join(wrong)} (fix config.json)")

    def _error(self, message: str) -> HFConfigError:
        return HFConfigError(f"{self.family} config: {message}")

    def get(self, key: str, default: Any = _MISSING, *, field: str | None = None) -> Any:
        """The value of ``key`` (``default`` when absent or null; an error when required);
        ``field``: the zoo config field it becomes (:meth:`finish` names ``key`` in that
        field's errors)."""
        self.read.add(key)
        if field is not None:
            self.keys[field] = key
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self._error(f"{key!r} is missing")
            return default
        return value

    def integer(self, key: str, default: Any = _MISSING, *, field: str | None = None) -> int:
        """``key`` as an int (not a bool, a float or a string)."""
        value = self.get(key, default, field=field)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._error(f"{key} = {_show(value)} must be an integer")
        return value

    def number(self, key: str, default: Any = _MISSING, *, field: str | None = None) -> float:
        """``key`` as a finite float."""
        value = self.get(key, default, field=field)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._error(f"{key} = {_show(value)} must be a number")
        if not math.isfinite(value):
            raise self._error(f"{key} = {_show(value)} must be finite")
        return float(value)

    def flag(self, key: str, default: Any = _MISSING, *, field: str | None = None) -> bool:
        """``key`` as a JSON boolean."""
        value = self.get(key, default, field=field)
        if not isinstance(value, bool):
            raise self._error(f"{key} = {_show(value)} must be true or false")
        return value

    def expect(self, key: str, *allowed: Any) -> None:
        """Refuse ``key`` unless it is absent, null, or one of ``allowed`` (the values zoo's
        model computes with)."""
        value = self.get(key, None)
        if value is not None and not any(value == a and type(value) is type(a) for a in allowed):
            wants = " or ".join(_show(a) for a in allowed)
            raise self._error(
                f"{key} = {_show(value)} changes the model's arithmetic in a way zoo's "
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
                f"rope_parameters.rope_type = {_show(rope_type)}: zoo implements only the "
                "default rotary embedding (no scaled or extended variants)"
            )
        known = {"rope_theta", "rope_type", "type"} | (
            {"partial_rotary_factor"} if partial else set()
        )
        extra = sorted(set(params) - known)
        if extra:
            raise self._error(
                f"rope_parameters has {', '.join(f'{k} = {_show(params[k])}' for k in extra)}, "
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
                    f"rope_scaling = {_show(scaling)}: zoo implements only the default rotary "
                    "embedding (no scaled or extended variants)"
                )
        theta = self._both(theta_key, params, "rope_theta", field="rope_theta")
        if theta is None:
            return default
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
            raise self._error(f"rope_theta = {_show(theta)} must be a positive number")
        if not math.isfinite(theta):
            raise self._error(f"rope_theta = {_show(theta)} must be finite")
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
            raise self._error(f"{name} = {_show(value)} must be a number in (0, 1]")
        return float(value)

    def _rope_parameters(self) -> Mapping[str, Any]:
        params = self.get("rope_parameters", {})
        if not isinstance(params, Mapping):
            raise self._error(f"rope_parameters = {_show(params)} must be an object")
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
                f"{top_key} = {_show(top)} and rope_parameters.{nested_key} = {_show(nested)} "
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
        unknown = sorted(k for k in self.data if k not in self.read and k not in self.inert)
        if unknown:
            shown = ", ".join(f"{k} = {_show(self.data[k])}" for k in unknown)
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

    def _as_written(self, message: str, config_name: str) -> str:
        """A config error's ``message`` with each field read from the file spelled as its
        key there (``Qwen2Config.n_layers = 0`` -> ``num_hidden_layers = 0``)."""
        message = message.replace(f"{config_name}.", "")
        if not self.keys:
            return message
        words = "|".join(re.escape(field) for field in sorted(self.keys, key=len, reverse=True))
        return re.sub(rf"\b(?:{words})\b", lambda m: self.keys[m[0]], message)


@dataclasses.dataclass(frozen=True)
class HFField:
    """How one zoo config field is spelled in a transformers ``config.json``.

    Args:
        key: the key in ``config.json``.
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
    default: Any = _MISSING
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
    load; ``HFField(read=, write=)`` converts a field spelled otherwise. ``read_extra`` reads
    what a table cannot say (Qwen2's window switches) and returns more zoo values;
    ``write_extra`` adds keys on export. Every key present is first type-checked against
    :data:`KEY_TYPES`, narrowed by ``types`` (the family's own annotation, where it allows
    less) and extended by it (the types of keys only this family has: a plugin declares
    them there); a value the config class refuses is reported under the key it was read from.

    Example (a Llama-like family)::

        QWEN2 = HFConfigFormat(
            family="Qwen2", model_type="qwen2", architecture="Qwen2ForCausalLM",
            config=Qwen2Config, fields=LLAMA_FIELDS, fixed={"hidden_act": "silu"},
        )
        values = QWEN2.read(json.load(open("config.json")))
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
        fields = [field for field in self.fields if field != "rotary_dim"]
        values = {field: self._read(r, field, hints[field]) for field in fields}
        if "rotary_dim" in self.fields:
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
        if field == "rope_theta":
            default = 10000.0 if spec.default is _MISSING else spec.default
            partial = "rotary_dim" in self.fields and self._spec("rotary_dim").key != "rotary_dim"
            return r.rope_theta(default, theta_key=spec.key, partial=partial)
        kind, optional = _field_kind(annotation)
        default = None if optional and spec.default is _MISSING else spec.default
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
            raise r._error(f"{spec.key} = {_show(value)} cannot be read: {exc}") from None

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
            default = None if spec.default is _MISSING else spec.default
            count = r.get(spec.key, default, field="rotary_dim")
            if count is None:
                return None  # null (GPT-J): every feature turns
            if isinstance(count, bool) or not isinstance(count, int):
                raise r._error(f"rotary_dim = {_show(count)} must be an integer")
            how = f"rotary_dim = {count} asks for {count}"
        else:
            default = 1.0 if spec.default is _MISSING else spec.default
            fraction = r.rotary_fraction(spec.key, default)
            count = int(head * fraction)
            key = r.keys.get("rotary_fraction", spec.key)
            how = f"{key} = {_show(fraction)} gives int({head} * {_show(fraction)}) = {count}"
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
                out[spec.key] = self._write_rotary(config)
                continue
            out[spec.key] = spec.write(config) if spec.write else getattr(config, field)
        out.update(self.fixed)
        if self.write_extra is not None:
            out.update(self.write_extra(config))
        return out


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
