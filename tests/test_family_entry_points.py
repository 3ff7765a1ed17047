"""Adding a family touches few places: the family's folder under ``plugins/``, one entry point
naming its declaration (``qwen2 = "zoo_plugins.qwen2:family"``) and, for named models,
``registry.toml``. Its package is found, not listed; the Hugging Face key rules it shares
with its relatives are zoo's (:mod:`zoo.checkpoint.hf_rules`), not another plugin's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import pytest
from conftest import install_distribution

from zoo.plugin.current import load_registry
from zoo.plugin.host import PluginHost

ROOT = Path(__file__).parents[1]
PLUGINS = ROOT / "plugins"

#: The built-in plugins that declare a family with ``declare_family``.
FAMILIES = sorted(
    p.parent.name
    for p in PLUGINS.glob("*/__init__.py")
    if re.search(r"^family = declare_family\(", p.read_text(), flags=re.M)
)


def _entry_points() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["entry-points"]["zoo"])


def test_each_declared_family_is_one_entry_point_naming_its_declaration() -> None:
    """Ten families declare themselves with ``declare_family``; the entry point names that
    object, and no plugin binds its hooks to module names by hand."""
    assert len(FAMILIES) == 10, FAMILIES
    points = _entry_points()
    for name in FAMILIES:
        assert points[name] == f"zoo_plugins.{name}:family", name
        text = (PLUGINS / name / "__init__.py").read_text()
        assert "zoo_architectures" not in text and "zoo_tokenizers" not in text, name
    loaded = {p.name: p for p in load_registry(entry_points=True).plugins}
    for name in FAMILIES:
        assert (loaded[name].status, loaded[name].module) == ("ok", f"zoo_plugins.{name}:family")


#: A third-party family: Llama's composition under another name, declared in one call.
_FAMILY = """
import dataclasses
from typing import ClassVar

from zoo.plugin.family import declare_family
from zoo_plugins.llama.config import LlamaConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class FamConfig(LlamaConfig):
    architecture: ClassVar[str] = "fam-test"


family = declare_family(
    FamConfig,
    layout=("fam_test", "zoo_plugins.llama.convert:HF_LLAMA"),
    description="a family declared by a third-party package",
)
"""


def _install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry_point: str) -> None:
    package = tmp_path / "src" / "zoo_fam"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(_FAMILY)
    site = tmp_path / "site"
    site.mkdir()
    install_distribution(site, package, name="zoo-fam", entry_points=f"[zoo]\n{entry_point}\n")
    monkeypatch.syspath_prepend(str(site))


def test_a_third_party_family_object_loads_from_its_entry_point(tmp_path, monkeypatch) -> None:
    _install(tmp_path, monkeypatch, "fam = zoo_fam:family")
    registry = load_registry()
    fam = {p.name: p for p in registry.plugins}["fam"]
    assert (fam.status, fam.module, fam.distribution) == ("ok", "zoo_fam:family", "zoo-fam 0.1")
    assert registry.architecture("fam-test").hf_model_types == {"fam_test": "hf-fam-test"}
    assert registry.source("architecture", "fam-test") == "plugin fam"


def test_an_entry_point_to_an_object_without_hooks_fails_saying_what_to_name(
    tmp_path, monkeypatch
) -> None:
    """The module of a declared family (the entry point an older install wrote) implements no
    hook itself: it used to load as "ok" and supply nothing; now it fails, naming the object
    the entry point should name."""
    _install(tmp_path, monkeypatch, "fam = zoo_fam")
    fam = {p.name: p for p in load_registry().plugins}["fam"]
    assert fam.status == "failed"
    assert "implements none of zoo's hooks" in fam.error
    assert "'zoo_fam:family'" in fam.error and "reinstall" in fam.error
    host = PluginHost()
    host.register(object(), name="bare")
    (bare,) = host.plugins
    assert bare.status == "failed" and "zoo_architectures" in bare.error
    assert "declare_family" in bare.error and "@zoo.hookimpl" in bare.error


def test_no_plugin_takes_key_rules_from_another_plugin() -> None:
    """The Hugging Face key rules many families share live in zoo.checkpoint, and give the
    Llama layout's keys exactly."""
    from zoo.checkpoint import hf_rules

    borrowed = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted(PLUGINS.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\s*from (\.\.|zoo_plugins\.)\w+\.convert import", line)
        and not re.match(r"\s*from \.\.(mistral|gemma2)\.convert import", line)  # relatives'
    ]
    assert not borrowed, borrowed
    from zoo_plugins.llama.convert import HF_LLAMA

    assert HF_LLAMA.rules == (*hf_rules.llama_rules(), hf_rules.DOWN)
    assert HF_LLAMA.fused == (*hf_rules.llama_qkv(), *hf_rules.GATE_UP)


_DISCOVER = """
import json
from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

dist = Distribution()
apply_configuration(dist, "pyproject.toml")
dist.set_defaults()
print(json.dumps(sorted(dist.packages)))
"""


def test_a_new_plugin_folder_ships_with_no_list_to_update(tmp_path: Path) -> None:
    """setuptools finds the packages (``zoo`` and ``plugins`` as ``zoo_plugins``): a new
    family's folder ships as it is, and ``plugins`` never becomes a top-level package."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "README.md").write_text("")
    (tmp_path / "zoo").symlink_to(ROOT / "zoo")
    (tmp_path / "plugins").mkdir()
    for child in PLUGINS.iterdir():
        if child.name != "__pycache__":
            (tmp_path / "plugins" / child.name).symlink_to(child)
    (tmp_path / "plugins" / "newfam").mkdir()
    (tmp_path / "plugins" / "newfam" / "__init__.py").write_text("")
    run = subprocess.run(
        [sys.executable, "-c", _DISCOVER], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found = set(json.loads(run.stdout.splitlines()[-1]))
    folders = {
        prefix + ".".join(p.relative_to(top).parts)
        for top, prefix in ((ROOT / "zoo", "zoo."), (PLUGINS, "zoo_plugins."))
        for p in top.rglob("*")
        if p.is_dir() and "__pycache__" not in p.parts
    }
    assert found == {"zoo", "zoo_plugins", "zoo_plugins.newfam", *folders}
    assert not any(name == "plugins" or name.startswith("plugins.") for name in found)
