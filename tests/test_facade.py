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


def test_every_moved_module_path_is_the_new_module_with_a_warning():
    # one child for the whole table: each old path (zoo.nn.native, zoo.nn.quant, ...) is the
    # very module of its new one, and the warning names it; the modules zoo.nn gave up are in it
    code = (
        "import importlib, json, warnings\n"
        "from zoo._moved import MOVED, REMOVAL\n"
        "wrong = []\n"
        "for old, new in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    said = ' '.join(str(w.message) for w in seen if w.category is DeprecationWarning)\n"
        "    if module is not importlib.import_module(new) or f'moved to {new}' not in said:\n"
        "        wrong.append(old)\n"
        "    elif f'{REMOVAL} removes the old path' not in said:  # the date to plan for\n"
        "        wrong.append(old)\n"
        "print(json.dumps(wrong))\n"
    )
    from zoo._moved import MOVED

    # zoo.nn keeps the model code: the kernels, quantization, LoRA and serving state moved out
    out_of_nn = ["native", "native_abi", "native_facts", "native_int8", "threads", "quant"]
    out_of_nn += ["quant_grad", "lora", "lora_bank", "lora_check", "lora_config", "slots"]
    out_of_nn += ["slot_step", "prefix_cache"]
    assert [m for m in out_of_nn if f"zoo.nn.{m}" not in MOVED] == []
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


def test_the_docstring_example_runs():
    test = doctest.DocTestParser().get_doctest(zoo.__doc__ or "", {}, "zoo", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(test)
    assert test.examples and runner.failures == 0
