"""Declarative key maps between zoo state dicts and foreign checkpoint layouts.

A plugin declares, per layout (e.g. ``"hf-gpt2"``), how each foreign key maps to a zoo key,
which weights are stored transposed (Hugging Face ``Conv1D``), which foreign keys to ignore
(mask buffers, a tied head) and which prefixes to strip. ``{i}`` in a pattern stands for a
layer index.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

__all__ = ["ConversionReport", "KeyMap", "KeyRule", "linear_rules", "openai_block_rules"]


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)") + "$")


@dataclasses.dataclass(frozen=True)
class KeyRule:
    """``foreign`` key template <-> ``zoo`` key template; ``transpose`` for Conv1D weights."""

    foreign: str
    zoo: str
    transpose: bool = False
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
    """Keys a conversion could not place."""

    unexpected: tuple[str, ...]


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
    """

    rules: tuple[KeyRule, ...]
    ignore_foreign: tuple[str, ...] = ()
    ignore_zoo: tuple[str, ...] = ()
    strip_prefixes: tuple[str, ...] = ()
    config_from_foreign: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    config_to_foreign: Callable[[Any], dict[str, Any]] | None = None

    def _ignored(self, key: str, patterns: tuple[str, ...]) -> bool:
        return any(re.fullmatch(p, key) for p in patterns)

    def _convert(
        self, state: Mapping[str, Tensor], side: str, ignore: tuple[str, ...]
    ) -> tuple[dict[str, Tensor], ConversionReport]:
        out: dict[str, Tensor] = {}
        unexpected: list[str] = []
        for key, tensor in state.items():
            name = key
            if side == "foreign":
                for prefix in self.strip_prefixes:
                    if name.startswith(prefix):
                        name = name[len(prefix) :]
                        break
            if self._ignored(name, ignore):
                continue
            for rule in self.rules:
                target = rule.match(name, side=side)
                if target is not None:
                    out[target] = tensor.t() if rule.transpose else tensor
                    break
            else:
                unexpected.append(key)
        return out, ConversionReport(tuple(unexpected))

    def to_zoo(self, state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], ConversionReport]:
        """Foreign state dict -> zoo state dict, plus the foreign keys no rule matched.

        Transposed tensors are views; call ``.contiguous()`` where a copy is wanted.
        """
        return self._convert(state, "foreign", self.ignore_foreign)

    def from_zoo(self, state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], ConversionReport]:
        """Zoo state dict -> foreign state dict, plus the zoo keys no rule matched."""
        return self._convert(state, "zoo", self.ignore_zoo)


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
