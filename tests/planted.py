"""Planted bugs for the conformance kit: a family's layout with one thing wrong, registered as
a test plugin beside the real family, so a test can show that ``zoo check``'s ``reference``
check fails the bug while the ``checkpoint_layouts`` round trip (zoo -> foreign -> zoo)
passes it.

Usage::

    plugin = Planted("gemma-2-2b-it", {"gemma2-swapped": ("hf-gemma2", layout)})
    use_registry(load_registry(plugins={"planted": plugin}))
    run_check("gemma2-swapped-tiny", "reference")  # fails
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import zoo
from zoo.checkpoint.hf_layout import KeyMap, KeyRule


def swap_foreign(rules: tuple[KeyRule, ...], one: str, other: str) -> tuple[KeyRule, ...]:
    """``rules`` with the foreign names ``one`` and ``other`` exchanged in every key: a bug
    that is its own inverse (export writes each tensor where import reads the other)."""

    def swapped(rule: KeyRule) -> KeyRule:
        if one in rule.foreign:
            return dataclasses.replace(rule, foreign=rule.foreign.replace(one, other))
        if other in rule.foreign:
            return dataclasses.replace(rule, foreign=rule.foreign.replace(other, one))
        return rule

    return tuple(swapped(rule) for rule in rules)


def renamed(config: type, architecture: str, **defaults: Any) -> type:
    """``config`` under another architecture name (a registry refuses two architectures
    sharing one config class), with other ``defaults`` for some fields."""
    fields = [(k, type(v), dataclasses.field(default=v)) for k, v in defaults.items()]
    return dataclasses.make_dataclass(
        f"{config.__name__}_{architecture.replace('-', '_')}",
        [("architecture", ClassVar[str], architecture), *fields],
        bases=(config,),
        frozen=True,
        kw_only=True,
    )


#: A planted architecture: its layout's name, the layout, and config defaults that differ.
Variant = tuple[str, KeyMap] | tuple[str, KeyMap, Mapping[str, Any]]


class Planted:
    """Architectures ``name`` with ``(layout name, layout[, config defaults])`` each, on the
    config class of the named model ``base`` (renamed), and a model ``<name>-tiny`` of each
    with ``base``'s sizes (the kit shrinks them)."""

    def __init__(self, base: str, variants: Mapping[str, Variant]) -> None:
        self.base = base
        self.variants = dict(variants)

    @zoo.hookimpl
    def zoo_architectures(self) -> list[zoo.ArchitectureSpec]:
        arch, _, _ = zoo.get_registry().resolve(self.base)
        specs = []
        for name, (layout_name, layout, *defaults) in self.variants.items():
            config = renamed(arch.config_class, name, **(defaults[0] if defaults else {}))
            specs.append(
                zoo.ArchitectureSpec(
                    name=name,
                    config=config,
                    model="zoo.nn.decoder:DecoderLM",
                    checkpoint_layouts={layout_name: layout},
                )
            )
        return specs

    @zoo.hookimpl
    def zoo_models(self) -> list[zoo.ModelSpec]:
        config: dict[str, Any] = dict(zoo.get_registry().model(self.base).config)
        return [
            zoo.ModelSpec(name=f"{name}-tiny", architecture=name, tokenizer="byte", config=config)
            for name in self.variants
        ]
