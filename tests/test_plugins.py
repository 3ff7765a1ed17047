"""Plugin discovery, isolation of broken plugins, conflicts, and the registry as data."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import pytest
from conftest import install_distribution

import zoo
import zoo.plugin.current
from zoo.errors import (
    PluginError,
    RegistryConflictError,
    UnknownArchitectureError,
    ZooError,
)
from zoo.plugin.current import load_registry

BUILTINS = {"gpt1", "gpt2-124m", "wiki-gpt-wordpiece", "transformer-encdec"}


class Throwaway:
    """A plugin object whose hooks return what it is given."""

    def __init__(self, architectures=(), models=()):
        self._architectures = list(architectures)
        self._models = list(models)

    @zoo.hookimpl
    def zoo_architectures(self):
        return self._architectures

    @zoo.hookimpl
    def zoo_models(self):
        return self._models


def test_builtins_load_through_entry_points():
    plugins = {p.name: p for p in zoo.plugins()}
    for name in ("gpt1", "gpt2", "wiki_gpt", "transformer_encdec"):
        assert plugins[name].status == "ok"
        assert plugins[name].distribution.startswith("torch-zoo ")
    assert set(zoo.list_models()) >= BUILTINS


def test_third_party_plugin_is_discovered_with_no_change_to_zoo():
    """tests/toy_plugin is installed as a distribution (see conftest) with a `zoo` entry point."""
    toy = {p.name: p for p in zoo.plugins()}["toy"]
    assert (toy.status, toy.module, toy.distribution) == ("ok", "zoo_toy", "zoo-toy 0.1")
    info = zoo.info("toy-gpt-tiny")
    assert info.architecture == "toy-gpt"
    assert info.plugin == "plugin toy" and info.model_source == "plugin toy"
    model = zoo.build("toy-gpt-tiny")
    assert type(model).__module__ == "zoo_toy.model"


def test_info_reports_where_everything_comes_from():
    info = zoo.info("gpt2-124m")
    assert info.plugin == "plugin gpt2" and info.model_source == "registry.toml"
    assert info.parameters == 124_439_808 and info.positions == "learned"
    assert info.blocks and info.tokenizer and "gpt2" in info.aliases


def test_listing_imports_no_torch_and_builds_nothing():
    code = "import sys, zoo; print(zoo.list_models()); assert 'torch' not in sys.modules, 'torch'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "gpt2-124m" in out.stdout


def test_duplicate_architecture_names_both_plugins_and_spares_the_rest(monkeypatch, use_registry):
    dup = Throwaway([zoo.ArchitectureSpec(name="gpt2", config="x:y", model="x:z")])
    use_registry(load_registry(plugins={"impostor": dup}))
    with pytest.raises(RegistryConflictError) as err:
        zoo.build("gpt2-124m")
    assert "plugin gpt2" in str(err.value) and "plugin impostor" in str(err.value)
    zoo.build("gpt1", device="meta")  # everything else still works


def test_duplicate_model_name_is_a_conflict(monkeypatch, use_registry):
    dup = Throwaway(models=[zoo.ModelSpec(name="gpt1", architecture="gpt2")])
    use_registry(load_registry(plugins={"dup": dup}))
    with pytest.raises(RegistryConflictError, match=r"registry\.toml and plugin dup"):
        zoo.info("gpt1")
    assert zoo.get_registry().conflicts == {"model gpt1": ["registry.toml", "plugin dup"]}


def test_strict_mode_fails_only_the_conflicting_names_use(monkeypatch, use_registry):
    dup = Throwaway([zoo.ArchitectureSpec(name="gpt1", config="x:y", model="x:z")])
    use_registry(load_registry(strict=True, plugins={"dup": dup}))
    with pytest.raises(RegistryConflictError, match="plugin gpt1 and plugin dup"):
        zoo.build("gpt1")
    zoo.build("gpt2-124m", device="meta")


def _shadowing_plugin() -> Throwaway:
    """A third-party plugin that also registers the built-in name gpt2-124m."""
    return Throwaway(
        models=[zoo.ModelSpec(name="gpt2-124m", architecture="gpt2", config={"n_layers": 2})]
    )


def test_a_shadowing_plugin_is_loud_everywhere(monkeypatch, use_registry):
    """A plugin registering a built-in name must not make it vanish silently."""
    use_registry(load_registry(plugins={"dup": _shadowing_plugin()}))
    expected = r"gpt2-124m.*registry\.toml and plugin dup.*ZOO_PREFER"
    with pytest.raises(RegistryConflictError, match=expected):
        zoo.build("gpt2-124m")
    with pytest.raises(RegistryConflictError, match=expected):  # the alias leads there too
        zoo.info("gpt2")
    assert zoo.get_registry().conflicts_of("plugin dup") == ["model gpt2-124m"]
    assert zoo.get_registry().conflicts_of("registry.toml") == ["model gpt2-124m"]


def test_zoo_prefer_picks_the_winner(monkeypatch, use_registry):
    monkeypatch.setenv("ZOO_PREFER", "dup")
    use_registry(load_registry(plugins={"dup": _shadowing_plugin()}))
    assert zoo.build("gpt2-124m", device="meta").config.n_layers == 2
    assert zoo.build("gpt2", device="meta").config.n_layers == 2  # alias follows the pick
    assert zoo.get_registry().source("model", "gpt2-124m") == "plugin dup"
    assert "gpt2-124m" in zoo.list_models() and not zoo.get_registry().conflicts
    monkeypatch.setenv("ZOO_PREFER", "registry.toml")
    use_registry(load_registry(plugins={"dup": _shadowing_plugin()}))
    assert zoo.build("gpt2-124m", device="meta").config.n_layers == 12


def test_an_alias_claimed_twice_is_a_conflict(monkeypatch, use_registry):
    other = Throwaway(models=[zoo.ModelSpec(name="other", architecture="gpt2", aliases=["gpt2"])])
    use_registry(load_registry(plugins={"other": other}))
    with pytest.raises(RegistryConflictError, match=r"registry\.toml and plugin other"):
        zoo.build("gpt2")
    zoo.build("gpt2-124m", device="meta")
    zoo.build("other", device="meta")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"aliases": ["self"], "name": "self"}, "cannot be the model's own name"),
        ({"aliases": "abc"}, "aliases must be a list"),
        ({"name": "nl\n"}, "is not valid"),
        ({"aliases": ["ok\n"]}, "is not valid"),
    ],
)
def test_bad_names_and_aliases_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        zoo.ModelSpec(**{"name": "m", "architecture": "gpt2", **kwargs})


def test_a_broken_user_registry_file_is_reported_not_fatal(monkeypatch, tmp_path, use_registry):
    good = tmp_path / "good.toml"
    good.write_text("[models.mine]\narchitecture = 'gpt2'\nconfig = { n_layers = 1 }\n")
    bad = tmp_path / "bad.toml"
    bad.write_text("[models.x\n")
    missing = tmp_path / "missing.toml"
    monkeypatch.setenv("ZOO_REGISTRY_PATH", os.pathsep.join(map(str, [bad, missing, good])))
    registry = use_registry(load_registry())
    assert "mine" in zoo.list_models() and "gpt2-124m" in zoo.list_models()
    assert [path for path, _ in registry.problems] == [str(bad), str(missing)]
    with pytest.raises(zoo.ZooError, match="cannot read registry file"):
        load_registry(strict=True)


class ExitingHook:
    @zoo.hookimpl
    def zoo_models(self):
        sys.exit(3)


class RaisingHook:
    @zoo.hookimpl
    def zoo_architectures(self):
        raise RuntimeError("boom")


class MisspelledHook:
    @zoo.hookimpl
    def zoo_architecture(self):  # not a zoo hook
        return []


class WrongReturn:
    @zoo.hookimpl
    def zoo_models(self):
        return ["gpt9"]


@pytest.mark.parametrize(
    ("plugin", "reason"),
    [
        (RaisingHook(), "zoo_architectures: RuntimeError: boom"),
        (MisspelledHook(), "invalid hooks: unknown hook 'zoo_architecture'"),
        (WrongReturn(), "must return ModelSpec objects, got str"),
        (ExitingHook(), "zoo_models: SystemExit: 3"),
    ],
)
def test_a_broken_plugin_is_isolated_and_reported(monkeypatch, plugin, reason, use_registry):
    use_registry(load_registry(plugins={"broken": plugin}))
    status = {p.name: p for p in zoo.plugins()}["broken"]
    assert status.status == "failed" and reason in status.error
    assert set(zoo.list_models()) >= BUILTINS
    zoo.build("gpt2-124m", device="meta")


def test_a_broken_plugin_fails_loudly_in_strict_mode(monkeypatch):
    with pytest.raises(PluginError, match="boom"):
        load_registry(strict=True, plugins={"broken": RaisingHook()})
    monkeypatch.setenv("ZOO_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="ZOO_STRICT_PLUGINS"):
        load_registry(plugins={"broken": RaisingHook()})


def test_a_plugin_that_fails_to_import(monkeypatch, tmp_path, use_registry):
    package = tmp_path / "src" / "zoo_broken"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("import a_module_that_does_not_exist\n")
    site = tmp_path / "site"
    site.mkdir()
    install_distribution(
        site, package, name="zoo-broken", entry_points="[zoo]\nbroken = zoo_broken\n"
    )
    monkeypatch.syspath_prepend(str(site))
    use_registry(load_registry())
    status = {p.name: p for p in zoo.plugins()}["broken"]
    assert status.status == "failed" and "import failed" in status.error
    assert "a_module_that_does_not_exist" in status.error
    assert set(zoo.list_models()) >= BUILTINS
    with pytest.raises(PluginError, match="broken"):
        load_registry(strict=True)


def test_model_of_a_missing_architecture_says_what_failed(monkeypatch, use_registry):
    orphan = Throwaway(models=[zoo.ModelSpec(name="orphan", architecture="nowhere")])
    use_registry(load_registry(plugins={"orphan": orphan, "broken": RaisingHook()}))
    assert "orphan" not in zoo.list_models()
    assert "orphan" in zoo.get_registry().models(include_unavailable=True)
    with pytest.raises(UnknownArchitectureError, match=r"'nowhere'.*failed to load: broken"):
        zoo.build("orphan")


def test_user_registry_file_adds_models(monkeypatch, tmp_path, use_registry):
    extra = tmp_path / "mine.toml"
    extra.write_text(
        textwrap.dedent(
            """
            [models.gpt2-tiny]
            architecture = "gpt2"
            aliases = ["tiny"]
            tokenizer = "gpt2-bpe"
            [models.gpt2-tiny.config]
            n_layers = 2
            d_model = 128
            n_heads = 4
            """
        )
    )
    monkeypatch.setenv("ZOO_REGISTRY_PATH", str(extra))
    use_registry(load_registry())
    assert zoo.build("tiny", device="meta").config.n_layers == 2
    assert zoo.info("gpt2-tiny").model_source == str(extra)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[models.x]\nconfig = {}\n", "'architecture' is required"),
        ("[models.x]\narchitecture = 'gpt2'\nweigths = {}\n", "unknown key(s) weigths"),
        ("[model.x]\n", "unknown top-level key"),
        ("[models.x\n", "cannot read registry file"),
        ("[models.Bad_Name]\narchitecture = 'gpt2'\n", "not valid"),
    ],
)
def test_bad_registry_files_are_clear_errors(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    expected = message.replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ZooError, match=expected):
        load_registry(registry_files=[path], strict=True)
    ((where, reason),) = load_registry(registry_files=[path]).problems  # reported, not fatal
    assert where == str(path) and re.search(expected, reason)


#: The plugin guide (the README's "Writing a plugin" links to it).
PLUGIN_GUIDE = Path(__file__).parents[1] / "docs" / "plugins.md"


def test_the_readme_plugin_is_the_tested_plugin():
    """The copy-pasteable plugin in the plugin guide is, file for file, the one installed here."""
    readme = PLUGIN_GUIDE.read_text()
    files = ("__init__.py", "model.py", "layout.py", "reference.py", "alibi.py")
    for name in ("pyproject.toml", *(f"zoo_toy/{file}" for file in files)):
        source = (Path(__file__).parent / "toy_plugin" / name).read_text()
        assert source.rstrip() in readme, f"docs/plugins.md is out of date with toy_plugin/{name}"


def _readme_block(heading: str) -> str:
    """The first ```python block after ``heading`` in the plugin guide."""
    readme = PLUGIN_GUIDE.read_text()
    after = readme[readme.index(heading) :]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_bring_your_own_model_runs_as_written(tmp_path):
    """The README's wrapped transformers model builds, generates and passes the kit."""
    code = _readme_block("## Bring your own model") + textwrap.dedent(
        """
        from zoo.testing import run_conformance
        failed = [r for r in run_conformance("hf-gpt2-tiny", devices=["cpu"]) if r.failed]
        assert not failed, failed
        print("kit ok")
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[[1, 2, 3, " in run.stdout and "kit ok" in run.stdout


def test_a_model_missing_what_the_contract_asks_is_refused_by_name(monkeypatch, use_registry):
    from zoo.nn import ZooModel

    class NoExamples(ZooModel):
        def forward(self, input_ids, attention_mask=None):
            return input_ids

    arch = zoo.ArchitectureSpec(name="toy-gpt", config="zoo_toy.model:ToyConfig", model=NoExamples)
    model = zoo.ModelSpec(name="bare", architecture="toy-gpt", config={})
    plugin = Throwaway(architectures=[arch], models=[model])
    use_registry(load_registry(entry_points=False, plugins={"bare": plugin}))
    with pytest.raises(zoo.PluginContractError, match=r"NoExamples lacks example_inputs\(\)"):
        zoo.build("bare")


def test_the_readme_composition_example_builds():
    model = zoo.build("gpt2-124m", positions="rotary", norm="rmsnorm", ffn="swiglu")
    assert type(model.blocks[0].ffn).__name__ == "GatedFeedForward"


def test_the_readme_plugin_depends_on_this_distribution():
    """A plugin's dependency must name zoo's distribution, not the unrelated `zoo` on PyPI."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    toy = tomllib.loads((Path(__file__).parent / "toy_plugin" / "pyproject.toml").read_text())
    assert project["name"] == zoo.DISTRIBUTION == "torch-zoo"
    assert toy["project"]["dependencies"] == [zoo.DISTRIBUTION]
    assert toy["project"]["entry-points"]["zoo"] == {"toy": "zoo_toy"}


def test_a_registry_entry_with_absurd_sizes_is_refused_not_built(
    monkeypatch, tmp_path, use_registry
):
    """n_layers = 10**9 in a registry entry made `zoo info` grow memory without end."""
    path = tmp_path / "huge.toml"
    path.write_text("[models.huge]\narchitecture = 'gpt2'\nconfig = { n_layers = 1000000000 }\n")
    use_registry(load_registry(registry_files=[path]))
    with pytest.raises(zoo.ConfigError, match="n_layers = 1000000000: must be at most 4,096"):
        zoo.info("huge")
    assert "huge" in zoo.list_models()  # listing reads no config: still fine
