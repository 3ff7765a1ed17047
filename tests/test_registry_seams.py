"""Hostile registry files and plugins whose architecture fails on first import: each is that
file's or that plugin's problem, reported by name, and everything else keeps working."""

from __future__ import annotations

import os
import re
import sys

import pytest

import zoo
import zoo.plugin.current
from zoo.cli import main
from zoo.errors import PluginError, ZooError
from zoo.plugin.current import load_registry

GOOD = "[models.mine]\narchitecture = 'gpt2'\nconfig = { n_layers = 1 }\n"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- A: registry files ----------------------------------------------------------------------
HOSTILE = {
    "deep-array.toml": (
        b"[models.x]\narchitecture = 'gpt2'\ndescription = " + b"[" * 100_000 + b"]" * 100_000,
        "nested too deeply",
    ),
    "deep-table.toml": (
        b"[models.x]\narchitecture = 'gpt2'\nconfig = " + b"{a=" * 5000 + b"1" + b"}" * 5000,
        "nested too deeply",
    ),
    "latin1.toml": (
        b"[models.x]\narchitecture = 'gpt2'\ndescription = 'caf\xe9'\n",
        r"not UTF-8 text \(byte 0xe9 on line 3\)",
    ),
    "traversal.toml": (
        b"[models.x]\narchitecture = 'gpt2'\n"
        b"weights = { repo = 'a/b', sha256 = '../../etc/passwd' }\n",
        "weights.sha256 = '../../etc/passwd' is not a sha256: it must be 64 hexadecimal digits",
    ),
}


@pytest.mark.parametrize("filename", sorted(HOSTILE))
def test_a_hostile_registry_file_is_that_files_problem(
    capsys, monkeypatch, tmp_path, filename, use_registry
):
    content, message = HOSTILE[filename]
    bad = tmp_path / filename
    bad.write_bytes(content)
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    monkeypatch.setenv("ZOO_REGISTRY_PATH", os.pathsep.join([str(bad), str(good)]))
    registry = use_registry(load_registry())
    ((where, reason),) = registry.problems
    assert where == str(bad)
    assert str(bad) in reason
    assert re.search(message, reason), reason
    code, out, err = run(capsys, "list")
    assert code == 0
    assert "gpt2-124m" in out and "mine" in out  # the built-ins and the good file still load
    assert f"skipped registry file {bad}" in err
    with pytest.raises(ZooError, match="registry file"):
        load_registry(strict=True)


def test_a_pinned_sha256_must_be_64_hex_digits():
    ok = zoo.WeightsSource(repo="a/b", sha256="AB" * 32)
    assert ok.sha256 == "AB" * 32
    for bad in ("../../etc/passwd", "ab" * 31, "ab" * 32 + "\n", "g" * 64, 123):
        with pytest.raises(ValueError, match="64 hexadecimal digits"):
            zoo.WeightsSource(repo="a/b", sha256=bad)


def test_registry_text_is_printed_without_terminal_escapes(
    capsys, monkeypatch, tmp_path, use_registry
):
    path = tmp_path / "esc.toml"
    path.write_text(
        '[models.esc]\narchitecture = "gpt2"\nconfig = { n_layers = 1 }\n'
        'description = "\\u001b]0;pwned\\u0007\\u001b[31mred\\u202e\\nfake line"\n'
    )
    use_registry(load_registry(registry_files=[path]))
    assert "\x1b" in zoo.get_registry().model("esc").description  # stored as written
    for argv in (["list"], ["info", "esc"]):
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        assert "\x1b" not in out + err and "\x07" not in out and "\u202e" not in out
        assert "\\x1b[31mred\\u202e\\x0afake line" in out


# -- B: an architecture whose module raises at import ----------------------------------------
class BrokenArchitecture:
    """A plugin that loads fine: its architecture's module raises only when imported."""

    @zoo.hookimpl
    def zoo_architectures(self):
        return [
            zoo.ArchitectureSpec(
                name="boom-arch", config="zoo_boom_arch:Config", model="zoo_boom_arch:Model"
            )
        ]

    @zoo.hookimpl
    def zoo_models(self):
        return [zoo.ModelSpec(name="boom", architecture="boom-arch", description="explodes")]


@pytest.fixture
def broken_architecture(monkeypatch, tmp_path, use_registry):
    (tmp_path / "zoo_boom_arch.py").write_text("raise RuntimeError('bad plugin module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "zoo_boom_arch", raising=False)
    return use_registry(load_registry(plugins={"boom": BrokenArchitecture()}))


def test_info_on_a_broken_architecture_is_one_clear_error(capsys, broken_architecture):
    with pytest.raises(PluginError, match=r"architecture 'boom-arch'.*RuntimeError: bad plugin"):
        zoo.build("boom", device="meta")
    code, out, err = run(capsys, "info", "boom")
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert "importing its config class 'zoo_boom_arch:Config' failed" in line
    assert "RuntimeError: bad plugin module" in line and "zoo plugins" in line


def test_plugins_shows_a_broken_architecture_as_failed(capsys, broken_architecture):
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    (row,) = [line for line in out.splitlines() if line.startswith("boom ")]
    assert "failed" in row and "RuntimeError: bad plugin module" in row
    assert "gpt2  " in out and "ok" in out.split("gpt2  ", 1)[1].splitlines()[0]
    registry = zoo.get_registry()
    assert {p.name: p.status for p in registry.plugins}["boom"] == "failed"
    assert "boom" not in registry.models(include_unavailable=True)  # withdrawn with its plugin
    zoo.build("gpt2-124m", device="meta")  # everything else still works


def test_strict_mode_turns_a_broken_architecture_into_an_error(broken_architecture):
    registry = load_registry(strict=True, plugins={"boom": BrokenArchitecture()})
    with pytest.raises(PluginError, match=r"plugin 'boom' failed.*ZOO_STRICT_PLUGINS"):
        registry.verify_architectures()


def test_tour_reports_a_broken_model_and_goes_on(capsys, monkeypatch, broken_architecture):
    from zoo import api

    monkeypatch.setattr(api, "list_models", lambda: ["boom", "gpt1"])
    build = api.build
    monkeypatch.setattr(api, "build", lambda name, **kw: build(name, n_layers=1, **kw))
    code, out, err = run(capsys, "tour")
    assert code == 1
    assert "boom: FAILED: architecture 'boom-arch'" in out
    assert "gpt1: " in out and "logits 1x16x" in out  # the tour went on
    assert "1 model(s) failed: boom" in err


def test_a_registry_in_use_is_scoped_to_its_block_and_context():
    import threading

    default = zoo.get_registry()
    mine = load_registry(entry_points=False)
    seen_elsewhere = []
    with zoo.use_registry(mine) as registry:
        assert registry is mine and zoo.get_registry() is mine
        assert "toy-gpt-tiny" not in zoo.list_models()  # the toy plugin is an entry point
        thread = threading.Thread(target=lambda: seen_elsewhere.append(zoo.get_registry()))
        thread.start()
        thread.join()
    assert seen_elsewhere == [default]  # another thread keeps the process-wide one
    assert zoo.get_registry() is default and "toy-gpt-tiny" in zoo.list_models()
