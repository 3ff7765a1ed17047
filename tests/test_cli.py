"""The ``zoo`` command line."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from zoo.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_console_script_lists_without_torch():
    exe = shutil.which("zoo")
    assert exe, "the `zoo` console script is not installed"
    out = subprocess.run(
        [exe, "list"], capture_output=True, text=True, check=True
    )
    assert "gpt2-124m" in out.stdout and "wiki-gpt-wordpiece" in out.stdout


def test_list(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    for name in ("gpt1", "gpt2-124m", "wiki-gpt-wordpiece", "transformer-encdec", "toy-gpt-tiny"):
        assert name in out


def test_info(capsys):
    code, out, _ = run(capsys, "info", "gpt2")
    assert code == 0
    assert "gpt2-124m" in out and "124,439,808" in out and "plugin gpt2" in out
    assert "n_layers = 12" in out and "learned" in out


def test_plugins(capsys):
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert "toy" in out and "zoo-toy 0.1" in out and "architectures: toy-gpt" in out


def test_check_runs_the_conformance_kit(capsys):
    code, out, _ = run(capsys, "check", "toy-gpt-tiny", "--device", "cpu")
    assert code == 0 and "all checks passed" in out and "meta" in out


def test_errors_are_one_line_without_traceback(capsys):
    code, out, err = run(capsys, "info", "gpt3")
    assert code == 2 and out == ""
    assert err.startswith("zoo: error: unknown model 'gpt3'") and err.count("\n") == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("command", [[], ["list"], ["info"], ["plugins"], ["check"]])
def test_every_command_has_help(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    assert "usage: zoo" in capsys.readouterr().out
