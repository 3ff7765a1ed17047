"""zoo's own named models: declared once, in registry.toml, and resolving exactly as they
did when the family plugins declared some of them in ``zoo_models`` hooks
(tests/data/named_models.json was recorded from that code)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from zoo.errors import PluginContractError
from zoo.plugin.current import BUILTIN_REGISTRY, load_registry
from zoo.plugin.tokenizer_specs import RepoTokenizer

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
    resolved = {
        "architecture": spec.architecture,
        "aliases": spec.aliases,
        "description": spec.description,
        "tokenizer": spec.tokenizer,
        "spec_config": dict(spec.config),
        "weights": dataclasses.asdict(spec.weights) if spec.weights else None,
        "config": _recorded_fields(config, RECORDED[name]["config"]),
        "config_class": type(config).__qualname__,  # its module moved (a plugin's config.py)
    }
    assert _as_json(resolved) == RECORDED[name]


def _recorded_fields(config: Any, recorded: dict[str, Any]) -> dict[str, Any]:
    """``config``'s fields of the recording; a field added since must hold its default (a
    named model that sets it has changed)."""
    values = config.to_dict()
    for field in dataclasses.fields(config):
        if field.name not in recorded:
            assert values.pop(field.name) == field.default, field.name
    return values


def test_zoos_own_named_models_live_in_registry_toml(registry):
    """One home: no plugin of zoo's own declares a named model in code."""
    assert {registry.source("model", name) for name in RECORDED} == {BUILTIN_REGISTRY}


def test_each_declared_model_type_is_the_one_its_layout_reads(registry):
    """``hf_model_types`` says, without importing the layout, what ``KeyMap.model_type`` says."""
    declared = {
        (name, layout): model_type
        for name in registry.architectures()
        for model_type, layout in registry.architecture(name).hf_model_types.items()
    }
    assert len(declared) >= 12
    for (name, layout), model_type in declared.items():
        assert registry.architecture(name).checkpoint_layout(layout).model_type == model_type


def test_a_declared_model_type_the_layout_does_not_read_is_refused_when_it_is_imported(
    registry,
):
    """A plugin whose declaration and layout disagree fails with a clear error where the
    layout is used (a folder matched by the declaration), not with a wrong load."""
    qwen3 = registry.architecture("qwen3")
    wrong = dataclasses.replace(qwen3, hf_model_types={"llama": "hf-qwen3"})
    with pytest.raises(PluginContractError, match="declares that layout 'hf-qwen3' reads"):
        wrong.checkpoint_layout("hf-qwen3")
    assert qwen3.checkpoint_layout("hf-qwen3").model_type == "qwen3"


_LOAD_LLAMA = """
import sys
import zoo
zoo.load(sys.argv[1])
print(sorted(m for m in sys.modules if m.startswith("zoo_plugins.") and m.endswith(".convert")))
"""


def test_loading_a_hugging_face_folder_imports_only_its_layout(tmp_path):
    """The ``model_type`` of a folder's config.json picks its layout from the declarations:
    no other family's ``convert.py`` is imported (a fresh process sees what it imports)."""
    import subprocess
    import sys

    import zoo

    zoo.export(zoo.build("llama-tiny"), tmp_path / "hf")
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_LLAMA, str(tmp_path / "hf")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.strip().splitlines()[-1] == "['zoo_plugins.llama.convert']"


def test_a_named_model_and_its_repo_tokenizer_read_one_repo_at_one_revision(registry):
    """The weights ``registry.toml`` pins and the repo tokenizer the family's plugin declares
    (``declare_family(repo=, revision=)``) are the same repo at the same revision."""
    checked = 0
    for name in RECORDED:
        spec = registry.model(name)
        factory = registry.tokenizer(spec.tokenizer).factory if spec.tokenizer else None
        if spec.weights is not None and isinstance(factory, RepoTokenizer):
            assert (factory.repo, factory.revision) == (spec.weights.repo, spec.weights.revision)
            checked += 1
    assert checked == 10
