"""Declarative key maps between zoo state dicts and foreign checkpoint layouts.

A plugin declares, per layout (e.g. ``"hf-gpt2"``; the name is free), how each foreign key
maps to a zoo key, which weights are stored transposed (Hugging Face ``Conv1D``), which
foreign keys to ignore (mask buffers, a tied head) and which prefixes to strip; ``{i}`` in a
pattern stands for a layer index. What one-key-to-one-key rules cannot say (separate q/k/v
projections that zoo fuses, permuted heads) a layout says with whole-state-dict transforms
run before the rules on import and after them on export (``merge_foreign`` /
``split_foreign``, in the spirit of timm's ``pretrained_filter_fn`` and litgpt's
``copy_weights_*``). A layout also says which Hugging Face ``model_type`` it reads and which
config values it can represent, so that export never writes a different model.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from ..config import meaning_of
from .hf_format import HFConfigFormat

__all__ = [
    "ANY",
    "SIZES",
    "ConversionReport",
    "FusedRule",
    "KeyMap",
    "KeyRule",
    "StateTransform",
    "fused_linear",
    "hf_layout",
    "linear_rules",
    "openai_block_rules",
    "openai_represents",
    "represented",
]

#: A whole-state-dict transform: ``(foreign state, zoo config) -> foreign state``.
StateTransform = Callable[[dict[str, Tensor], Any], dict[str, Tensor]]


def _pattern(template: str) -> re.Pattern[str]:
    """``"h.{i}.experts.{e}.w"`` -> a regex with one named group of digits per placeholder."""
    escaped = re.escape(template)
    return re.compile("^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>\\d+)", escaped) + "$")


def _fill(template: str, groups: Mapping[str, str]) -> str:
    for name, value in groups.items():
        template = template.replace("{" + name + "}", value)
    return template


class _Any:
    """The wildcard of :attr:`KeyMap.represents`: the layout holds any value of the field."""

    def __repr__(self) -> str:
        return "ANY"


#: In :attr:`KeyMap.represents`: the layout holds every value of that field (its config.json
#: says which), e.g. ``{"sliding_window": ANY}``.
ANY: Any = _Any()

#: Named sizes a :class:`FusedRule` splits by, from the model config: query and key/value
#: widths (``n_heads``/``n_kv_heads`` heads of ``head_size``), the feed-forward and model
#: widths.
SIZES: Mapping[str, Callable[[Any], int]] = {
    "q": lambda c: c.n_heads * c.head_size,
    "kv": lambda c: (c.n_kv_heads or c.n_heads) * c.head_size,
    "d_ff": lambda c: c.d_ff,
    "d_model": lambda c: c.d_model,
}


@dataclasses.dataclass(frozen=True)
class KeyRule:
    """``foreign`` key template <-> ``zoo`` key template; ``{i}`` (or any ``{name}``) stands
    for an index. ``transpose`` for Conv1D weights; ``optional`` when a model may lack the
    key (a head tied to the embedding); ``interleave = g`` when the foreign rows are grouped
    per head, ``(n_heads, g, rows, ...)``, where zoo's are ``(g, n_heads, rows, ...)``
    (GPT-NeoX's ``query_key_value`` holds each head's query, key and value together: ``3``);
    ``per_kv_group`` when a fused query/key/value weight is grouped per key/value head, each
    group its queries then its key then its value, ``(n_kv_heads, n_heads / n_kv_heads + 2,
    head_size, ...)``, where zoo's holds every query, then every key, then every value
    (Falcon's grouped ``query_key_value``). Both only move rows, so adapters go through them.
    """

    foreign: str
    zoo: str
    transpose: bool = False
    optional: bool = False
    interleave: int = 0
    per_kv_group: bool = False
    _foreign_re: re.Pattern[str] = dataclasses.field(init=False, repr=False, compare=False)
    _zoo_re: re.Pattern[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_foreign_re", _pattern(self.foreign))
        object.__setattr__(self, "_zoo_re", _pattern(self.zoo))

    def match(self, key: str, *, side: str) -> str | None:
        """The key on the other side when ``key`` (on ``side``) matches this rule."""
        pattern, target = (
            (self._foreign_re, self.zoo) if side == "foreign" else (self._zoo_re, self.foreign)
        )
        m = pattern.match(key)
        return None if m is None else _fill(target, m.groupdict())

    def convert(self, tensor: Tensor, config: Any, *, side: str) -> Tensor:
        """``tensor`` (a key on ``side``) as the other side stores it."""
        if self.transpose:
            tensor = tensor.t()
        if self.interleave:
            if config is None:
                raise ValueError("this layout regroups heads: pass the model config")
            heads, groups = config.n_heads, self.interleave
            first = (heads, groups) if side == "foreign" else (groups, heads)
            # (a, b, rows, ...) -> (b, a, rows, ...), then flat again
            tensor = tensor.reshape(*first, -1, *tensor.shape[1:]).transpose(0, 1)
            tensor = tensor.reshape(-1, *tensor.shape[3:])
        if self.per_kv_group:
            if config is None:
                raise ValueError("this layout groups heads by key/value head: pass the config")
            tensor = tensor[_kv_group_order(config, side)]
        return tensor


def _kv_group_order(config: Any, side: str) -> Tensor:
    """The rows of a fused query/key/value weight in the other side's order: per key/value
    group (its queries, its key, its value) from zoo's (every query, key, value), or back."""
    heads, kv, size = config.n_heads, config.n_kv_heads or config.n_heads, config.head_size
    per = heads // kv
    head = torch.arange(size)
    zoo_rows = []  # the zoo row of each foreign row, in foreign order
    for group in range(kv):
        queries = [(group * per + q) * size + head for q in range(per)]
        key, value = (heads + group) * size + head, (heads + kv + group) * size + head
        zoo_rows += [*queries, key, value]
    order = torch.cat(zoo_rows)  # foreign row i is zoo row order[i]
    return order if side == "zoo" else torch.argsort(order)


@dataclasses.dataclass(frozen=True)
class FusedRule:
    """One zoo tensor that the foreign layout stores as several, concatenated along the first
    dimension in order: q/k/v projections zoo fuses into ``qkv``, gate/up into ``fc``.

    Args:
        zoo: the zoo key template (``"blocks.{i}.attn.qkv.weight"``).
        foreign: the foreign key templates of the pieces, in order.
        sizes: the rows of each piece, by name from :data:`SIZES` (``("q", "kv", "kv")``).
        optional: a model may lack the key.
    """

    zoo: str
    foreign: tuple[str, ...]
    sizes: tuple[str, ...]
    optional: bool = False
    _zoo_re: re.Pattern[str] = dataclasses.field(init=False, repr=False, compare=False)
    _first_re: re.Pattern[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.foreign):
            raise ValueError(f"{self.zoo}: {len(self.foreign)} pieces but {len(self.sizes)} sizes")
        unknown = sorted(set(self.sizes) - set(SIZES))
        if unknown:
            raise ValueError(f"{self.zoo}: unknown sizes {unknown}; choose from {sorted(SIZES)}")
        object.__setattr__(self, "_zoo_re", _pattern(self.zoo))
        object.__setattr__(self, "_first_re", _pattern(self.foreign[0]))

    def fuse(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Pop every complete set of pieces from the foreign ``state`` and return them fused,
        under their zoo keys (pieces of an incomplete set stay, to be reported)."""
        out: dict[str, Tensor] = {}
        for key in [k for k in state if self._first_re.match(k)]:
            groups = self._first_re.match(key).groupdict()  # type: ignore[union-attr]
            names = [_fill(f, groups) for f in self.foreign]
            if all(name in state for name in names):
                out[_fill(self.zoo, groups)] = torch.cat([state.pop(n) for n in names])
        return out

    def split(self, state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
        """Pop each fused tensor from the zoo ``state`` and return its foreign pieces."""
        rows = [SIZES[size](config) for size in self.sizes]
        out: dict[str, Tensor] = {}
        for key in [k for k in state if self._zoo_re.match(k)]:
            groups = self._zoo_re.match(key).groupdict()  # type: ignore[union-attr]
            pieces = state.pop(key).split(rows)
            for template, piece in zip(self.foreign, pieces, strict=True):
                out[_fill(template, groups)] = piece
        return out


def fused_linear(
    zoo: str, foreign: tuple[str, ...], sizes: tuple[str, ...], *, bias: bool = False
) -> tuple[FusedRule, ...]:
    """:class:`FusedRule` s for the ``weight`` (and ``bias``) of one fused linear layer;
    ``zoo`` and ``foreign`` name the layers (``"blocks.{i}.attn.qkv"``)."""
    params = ("weight", "bias") if bias else ("weight",)
    return tuple(FusedRule(f"{zoo}.{p}", tuple(f"{f}.{p}" for f in foreign), sizes) for p in params)


@dataclasses.dataclass(frozen=True)
class ConversionReport:
    """Keys a conversion could not place, and (export) keys of the layout left unwritten."""

    unexpected: tuple[str, ...]
    missing: tuple[str, ...] = ()


#: One index combination of a rule's groups, sorted by name: ``(("e", "3"), ("i", "0"))``.
_Groups = tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class KeyMap:
    """A checkpoint layout: key rules plus keys to ignore on either side.

    Args:
        rules: the key rules.
        ignore_foreign: regexes of foreign keys that carry nothing zoo needs.
        ignore_zoo: regexes of zoo keys not written in this layout (a tied head).
        strip_prefixes: prefixes removed from foreign keys before matching.
        config_from_foreign: foreign config dict -> zoo config values (for checkpoint import).
        config_to_foreign: zoo config -> foreign config dict (for export).
        model_type: the Hugging Face ``config.json`` ``model_type`` this layout reads.
        fused: zoo tensors the layout stores as several (q/k/v, gate/up), concatenated on
            import and split on export.
        merge_foreign: on import, a transform of the foreign state (prefixes stripped) run
            before the rules, for what :class:`FusedRule` and :class:`KeyRule` cannot say.
        split_foreign: on export, its inverse, run after the rules.
        config_from_weights: on import, ``(config, foreign state) -> config``, for a value the
            foreign config.json does not settle and the weights do (transformers 5 ties a
            T5 head by whether the checkpoint holds one); run before the rules.
        represents: config values this layout can represent (``{"norm_first": True}``;
            :data:`ANY` for a field whose every value it holds, :func:`represented` derives
            them from the config class); exporting a model whose config differs is refused.
    """

    rules: tuple[KeyRule, ...]
    ignore_foreign: tuple[str, ...] = ()
    ignore_zoo: tuple[str, ...] = ()
    strip_prefixes: tuple[str, ...] = ()
    config_from_foreign: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    config_to_foreign: Callable[[Any], dict[str, Any]] | None = None
    model_type: str | None = None
    merge_foreign: StateTransform | None = None
    split_foreign: StateTransform | None = None
    represents: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    fused: tuple[FusedRule, ...] = ()
    config_from_weights: Callable[[Any, Mapping[str, Tensor]], Any] | None = None

    def _ignored(self, key: str, patterns: tuple[str, ...]) -> bool:
        return any(re.fullmatch(p, key) for p in patterns)

    def _strip(self, key: str) -> str:
        for prefix in self.strip_prefixes:
            if key.startswith(prefix):
                return key[len(prefix) :]
        return key

    def _convert(
        self, state: Mapping[str, Tensor], side: str, ignore: tuple[str, ...], config: Any
    ) -> tuple[dict[str, Tensor], ConversionReport]:
        out: dict[str, Tensor] = {}
        unexpected: list[str] = []
        for name, tensor in state.items():
            if self._ignored(name, ignore):
                continue
            for rule in self.rules:
                target = rule.match(name, side=side)
                if target is not None:
                    out[target] = rule.convert(tensor, config, side=side)
                    break
            else:
                unexpected.append(name)
        return out, ConversionReport(tuple(unexpected))

    def _transform(self, which: StateTransform | None, state: dict[str, Tensor], config: Any):
        if which is None:
            return state
        if config is None:
            raise ValueError("this layout transforms whole state dicts: pass the model config")
        return which(state, config)

    def to_zoo(
        self, state: Mapping[str, Tensor], config: Any = None
    ) -> tuple[dict[str, Tensor], ConversionReport]:
        """Foreign state dict -> zoo state dict, plus the foreign keys no rule matched.

        ``config`` (the zoo config) is needed by layouts with ``merge_foreign``. Transposed
        tensors are views; call ``.contiguous()`` where a copy is wanted.
        """
        original = {self._strip(key): key for key in state}
        stripped = {self._strip(key): tensor for key, tensor in state.items()}
        merged = dict(self._transform(self.merge_foreign, stripped, config))
        fused = [rule.fuse(merged) for rule in self.fused]
        out, report = self._convert(merged, "foreign", self.ignore_foreign, config)
        for tensors in fused:
            out.update(tensors)
        return out, ConversionReport(tuple(original.get(k, k) for k in report.unexpected))

    def from_zoo(
        self, state: Mapping[str, Tensor], config: Any = None
    ) -> tuple[dict[str, Tensor], ConversionReport]:
        """Zoo state dict -> foreign state dict, plus the zoo keys no rule matched and the
        layout's keys nothing was written to."""
        zoo_keys = list(state)
        state = dict(state)
        if self.fused and config is None:
            raise ValueError("this layout splits fused tensors: pass the model config")
        split = [rule.split(state, config) for rule in self.fused]
        out, report = self._convert(state, "zoo", self.ignore_zoo, config)
        for pieces in split:
            out.update(pieces)
        report = dataclasses.replace(report, missing=self._missing(out, zoo_keys))
        return self._transform(self.split_foreign, out, config), report

    def misrepresented(self, config: Any) -> list[str]:
        """``field: layout value vs model value`` for each config value this layout cannot
        represent (empty when it can)."""
        return [
            f"{name} = {getattr(config, name, None)!r} (the layout holds only {value!r})"
            for name, value in self.represents.items()
            if value is not ANY and meaning_of(config, name) != meaning_of(config, name, value)
        ]

    def _missing(self, foreign: Mapping[str, Any], zoo_keys: Iterable[str]) -> tuple[str, ...]:
        """Foreign keys of non-optional rules absent from ``foreign``; a rule with ``{i}``
        (and ``{e}``...) is wanted for every index (combination) the zoo state has."""
        seen = self._indices(zoo_keys)
        templates = [r.foreign for r in self.rules if not r.optional] + [
            f for r in self.fused if not r.optional for f in r.foreign
        ]
        wanted = [
            _fill(template, dict(groups))
            for template in templates
            for groups in _combinations(template, seen)
        ]
        return tuple(dict.fromkeys(key for key in wanted if key not in foreign))

    def _indices(self, zoo_keys: Iterable[str]) -> dict[frozenset[str], set[_Groups]]:
        """The index combinations the rules find in ``zoo_keys``, by the names of their
        groups: ``{"i"}`` -> ``{(("i", "0"),), (("i", "1"),)}``."""
        patterns = [r._zoo_re for r in self.rules] + [r._zoo_re for r in self.fused]
        seen: dict[frozenset[str], set[_Groups]] = {}
        for key in zoo_keys:
            for pattern in patterns:
                m = pattern.match(key)
                if m is not None:
                    found = m.groupdict()
                    seen.setdefault(frozenset(found), set()).add(tuple(sorted(found.items())))
        return seen


def _combinations(template: str, seen: Mapping[frozenset[str], set[_Groups]]) -> list[_Groups]:
    """The index combinations ``template`` is wanted for: every one the zoo state has for its
    group names, or one empty combination for a template without groups."""
    names = frozenset(re.findall(r"\{(\w+)\}", template))
    return sorted(seen.get(names, set())) if names else [()]


def represented(
    config: type,
    *,
    mapped: Iterable[str],
    inert: Iterable[str] = ("dropout",),
    **overrides: Any,
) -> dict[str, Any]:
    """The :attr:`KeyMap.represents` of a layout whose config.json carries the ``mapped``
    fields (any value: :data:`ANY`) and leaves every other field of the ``config`` class at
    its default (the only value the layout holds). ``inert`` fields change no forward pass
    (training dropout); ``overrides`` name what differs (``sliding_window=ANY``)."""
    values: dict[str, Any] = {}
    mapped, inert = set(mapped), set(inert)
    for field in dataclasses.fields(config):
        if field.name in inert:
            continue
        if field.name in mapped:
            values[field.name] = ANY
        elif field.default is not dataclasses.MISSING:
            values[field.name] = field.default
    return values | overrides


def hf_layout(
    format: HFConfigFormat,
    rules: tuple[KeyRule, ...],
    *,
    fused: tuple[FusedRule, ...] = (),
    ignore_foreign: tuple[str, ...] = (),
    ignore_zoo: tuple[str, ...] = (),
    strip_prefixes: tuple[str, ...] = (),
    merge_foreign: StateTransform | None = None,
    split_foreign: StateTransform | None = None,
    **represents: Any,
) -> KeyMap:
    """The :class:`KeyMap` of a Hugging Face checkpoint whose ``config.json`` is ``format``:
    it reads and writes that config, and represents every value of the fields the config
    carries and the defaults of ``format.config`` for the others (``represents`` overrides:
    ``sliding_window=ANY`` where ``read_extra`` reads it).

    Args:
        format: the family's ``config.json``, both ways.
        rules: the one-key-to-one-key rules.
        fused: zoo tensors stored as several foreign ones (q/k/v, gate/up).
        ignore_foreign: regexes (full match) of foreign keys that carry nothing zoo needs
            (buffers older transformers saved: ``rotary_emb.inv_freq``).
        ignore_zoo: regexes of zoo keys the layout does not write (a weight the foreign
            model recomputes or shares).
        strip_prefixes: prefixes removed from foreign keys before matching.
        merge_foreign: on import, ``(foreign state, config) -> foreign state`` run before the
            rules (prefixes already stripped), for what :class:`KeyRule` and
            :class:`FusedRule` cannot say (a tensor to permute or to rebuild).
        split_foreign: on export, its inverse, run on the foreign state the rules wrote
            (give both, or an export will not load back as the same model).
        **represents: config values the layout holds beyond those derived (:func:`represented`).

    Example (a foreign layout that stores a norm's weight minus one)::

        def plus_one(state, config):
            return {k: v + 1 if k.endswith("norm.weight") else v for k, v in state.items()}

        def minus_one(state, config):
            return {k: v - 1 if k.endswith("norm.weight") else v for k, v in state.items()}

        HF_X = hf_layout(X_CONFIG, rules, merge_foreign=plus_one, split_foreign=minus_one)
    """
    return KeyMap(
        rules=rules,
        fused=fused,
        ignore_foreign=ignore_foreign,
        ignore_zoo=ignore_zoo,
        strip_prefixes=strip_prefixes,
        merge_foreign=merge_foreign,
        split_foreign=split_foreign,
        model_type=format.model_type,
        config_from_foreign=format.read,
        config_to_foreign=format.write,
        represents=represented(format.config, mapped=format.fields, **represents),
    )


def linear_rules(
    foreign: str, zoo: str, *, transpose: bool = False, interleave: int = 0
) -> tuple[KeyRule, KeyRule]:
    """Rules for the ``weight`` and ``bias`` of one linear (or LayerNorm) layer."""
    return (
        KeyRule(f"{foreign}.weight", f"{zoo}.weight", transpose=transpose, interleave=interleave),
        KeyRule(f"{foreign}.bias", f"{zoo}.bias", interleave=interleave),
    )


def openai_block_rules() -> tuple[KeyRule, ...]:
    """The block layout GPT-1 and GPT-2 share in Hugging Face checkpoints (``Conv1D``
    projections stored transposed; ``ln_1`` guards attention and ``ln_2`` the MLP, whether
    before the branch (GPT-2) or after the residual sum (GPT-1))."""
    return (
        *linear_rules("h.{i}.ln_1", "blocks.{i}.attn_norm"),
        *linear_rules("h.{i}.attn.c_attn", "blocks.{i}.attn.qkv", transpose=True),
        *linear_rules("h.{i}.attn.c_proj", "blocks.{i}.attn.proj", transpose=True),
        *linear_rules("h.{i}.ln_2", "blocks.{i}.ffn_norm"),
        *linear_rules("h.{i}.mlp.c_fc", "blocks.{i}.ffn.fc", transpose=True),
        *linear_rules("h.{i}.mlp.c_proj", "blocks.{i}.ffn.proj", transpose=True),
    )


def openai_represents(*, norm_first: bool, final_norm: bool) -> dict[str, Any]:
    """The config values the Hugging Face GPT-1/GPT-2 layouts hold: LayerNorm, learned
    positions, biased MLP and multi-head attention, no window, GPT-2 (``norm_first``,
    ``final_norm``) or GPT-1 placement."""
    return {
        "positions": "learned",
        "norm": "layernorm",
        "ffn": "mlp",
        "attention": "mha",
        "norm_first": norm_first,
        "parallel_residual": False,
        "final_norm": final_norm,
        "bias": True,
        "qkv_bias": None,
        "n_kv_heads": None,
        "sliding_window": None,
        "scale_embeddings": False,
        "head_bias": False,
    }
