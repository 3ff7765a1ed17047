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

from torch import Tensor

__all__ = [
    "ConversionReport",
    "KeyMap",
    "KeyRule",
    "StateTransform",
    "linear_rules",
    "openai_block_rules",
    "openai_represents",
]

#: A whole-state-dict transform: ``(foreign state, zoo config) -> foreign state``.
StateTransform = Callable[[dict[str, Tensor], Any], dict[str, Tensor]]


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)") + "$")


@dataclasses.dataclass(frozen=True)
class KeyRule:
    """``foreign`` key template <-> ``zoo`` key template; ``transpose`` for Conv1D weights;
    ``optional`` when a model may lack the key (a head tied to the embedding)."""

    foreign: str
    zoo: str
    transpose: bool = False
    optional: bool = False
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
        if m is None:
            return None
        return target.replace("{i}", m["i"]) if "i" in m.groupdict() else target


@dataclasses.dataclass(frozen=True)
class ConversionReport:
    """Keys a conversion could not place, and (export) keys of the layout left unwritten."""

    unexpected: tuple[str, ...]
    missing: tuple[str, ...] = ()


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
        merge_foreign: on import, a transform of the foreign state (prefixes stripped) run
            before the rules, e.g. concatenating q/k/v into one key a rule then maps.
        split_foreign: on export, its inverse, run after the rules.
        represents: config values this layout can represent (``{"norm_first": True}``);
            exporting a model whose config differs is refused.
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

    def _ignored(self, key: str, patterns: tuple[str, ...]) -> bool:
        return any(re.fullmatch(p, key) for p in patterns)

    def _strip(self, key: str) -> str:
        for prefix in self.strip_prefixes:
            if key.startswith(prefix):
                return key[len(prefix) :]
        return key

    def _convert(
        self, state: Mapping[str, Tensor], side: str, ignore: tuple[str, ...]
    ) -> tuple[dict[str, Tensor], ConversionReport]:
        out: dict[str, Tensor] = {}
        unexpected: list[str] = []
        for name, tensor in state.items():
            if self._ignored(name, ignore):
                continue
            for rule in self.rules:
                target = rule.match(name, side=side)
                if target is not None:
                    out[target] = tensor.t() if rule.transpose else tensor
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
        merged = self._transform(self.merge_foreign, stripped, config)
        out, report = self._convert(merged, "foreign", self.ignore_foreign)
        return out, ConversionReport(tuple(original.get(k, k) for k in report.unexpected))

    def from_zoo(
        self, state: Mapping[str, Tensor], config: Any = None
    ) -> tuple[dict[str, Tensor], ConversionReport]:
        """Zoo state dict -> foreign state dict, plus the zoo keys no rule matched and the
        layout's keys nothing was written to."""
        out, report = self._convert(state, "zoo", self.ignore_zoo)
        report = dataclasses.replace(report, missing=self._missing(out, state))
        return self._transform(self.split_foreign, out, config), report

    def misrepresented(self, config: Any) -> list[str]:
        """``field: layout value vs model value`` for each config value this layout cannot
        represent (empty when it can)."""
        return [
            f"{name} = {getattr(config, name, None)!r} (the layout holds only {value!r})"
            for name, value in self.represents.items()
            if getattr(config, name, None) != value
        ]

    def _missing(self, foreign: Mapping[str, Any], zoo_keys: Iterable[str]) -> tuple[str, ...]:
        """Foreign keys of non-optional rules absent from ``foreign``; a rule with ``{i}`` is
        wanted for every layer index the zoo state has."""
        layers: set[str] = set()
        for key in zoo_keys:
            for rule in self.rules:
                m = rule._zoo_re.match(key)
                if m is not None and "i" in m.groupdict():
                    layers.add(m["i"])
        wanted = [
            rule.foreign.replace("{i}", i)
            for rule in self.rules
            if not rule.optional
            for i in (sorted(layers, key=int) if "{i}" in rule.foreign else [""])
        ]
        return tuple(key for key in wanted if key not in foreign)


def linear_rules(foreign: str, zoo: str, *, transpose: bool = False) -> tuple[KeyRule, KeyRule]:
    """Rules for the ``weight`` and ``bias`` of one linear (or LayerNorm) layer."""
    return (
        KeyRule(f"{foreign}.weight", f"{zoo}.weight", transpose=transpose),
        KeyRule(f"{foreign}.bias", f"{zoo}.bias"),
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
