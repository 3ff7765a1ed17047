"""zoo's own named models: declared once, in registry.toml, and resolving exactly as they
did when the family plugins declared some of them in ``zoo_models`` hooks
(tests/data/named_models.json was recorded from that code)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from zoo.plugin.registry import BUILTIN_REGISTRY, load_registry

RECORDED = json.loads((Path(__file__).parent / "data" / "named_models.json").read_text())


def _as_json(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples become lists)."""
    return json.loads(json.dumps(value, default=list))


@pytest.fixture(scope="module")
def registry():
    return load_registry(registry_files=())


def test_every_named_model_is_still_there(registry):
    assert set(RECORDED) <= set(registry.models(include_unavailable=True))


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_a_named_model_resolves_as_before(registry, name):
    _, spec, config = registry.resolve(name)
    assert _as_json(
        {
            "architecture": spec.architecture,
            "aliases": spec.aliases,
            "description": spec.description,
            "tokenizer": spec.tokenizer,
            "spec_config": dict(spec.config),
            "weights": dataclasses.asdict(spec.weights) if spec.weights else None,
            "config": config.to_dict(),
            "config_class": f"{type(config).__module__}:{type(config).__qualname__}",
        }
    ) == RECORDED[name]


def test_zoos_own_named_models_live_in_registry_toml(registry):
    """One home: no plugin of zoo's own declares a named model in code."""
    assert {registry.source("model", name) for name in RECORDED} == {BUILTIN_REGISTRY}
