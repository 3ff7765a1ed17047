"""``zoo``'s public facade: every name is there, each imported on first use.

``import zoo`` runs none of zoo's modules (only the lazy-name table, the moved-module finder
and the version), so importing any ``zoo.x.y`` never drags the rest of zoo in with it.
"""

from __future__ import annotations

import doctest
import importlib
import json
import subprocess
import sys

import zoo


def test_importing_zoo_imports_none_of_its_modules_nor_torch():
    code = "import json, sys, zoo; print(json.dumps(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    loaded = json.loads(run.stdout)
    assert [m for m in loaded if m.startswith("zoo")] == [
        "zoo",
        "zoo._lazy",
        "zoo._moved",
        "zoo._version",
    ]
    assert "torch" not in loaded


def test_every_public_name_is_its_home_modules_object():
    lazy = {name for name in zoo._LAZY if name not in zoo._SUBMODULES}
    assert set(zoo.__all__) == lazy | {"DISTRIBUTION", "__version__"}
    for name in lazy:
        module, _, attribute = zoo._LAZY[name].partition(":")
        assert getattr(zoo, name) is getattr(importlib.import_module(module), attribute), name
    namespace: dict[str, object] = {}
    exec("from zoo import *", namespace)
    assert set(zoo.__all__) <= set(namespace)
    assert set(zoo.__all__) <= set(dir(zoo))


def test_the_submodules_import_zoo_made_attributes_still_are():
    code = "import zoo; print(zoo.errors.ZooError.__name__, zoo.settings.__name__)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.stdout.split() == ["ZooError", "zoo.settings"], run.stderr
    assert not hasattr(zoo, "no_such_name")


def test_the_moved_module_paths_still_import():
    code = "import warnings; warnings.simplefilter('error'); import zoo.specs"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "zoo.specs moved to zoo.plugin.specs" in run.stderr


def test_the_docstring_example_runs():
    test = doctest.DocTestParser().get_doctest(zoo.__doc__ or "", {}, "zoo", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(test)
    assert test.examples and runner.failures == 0
