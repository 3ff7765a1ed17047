"""A non-editable install ships registry.toml and the built-in plugins (as ``zoo_plugins``,
never a top-level ``plugins``) and finds all four named models."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("zoo-*.whl")
    return path


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "zoo/registry.toml" in names
    assert "zoo_plugins/gpt2/__init__.py" in names
    assert not any(n.startswith("plugins/") for n in names)
    assert not any(n.startswith("tests/") for n in names)
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("zoo/registry.toml") == (ROOT / "registry.toml").read_bytes()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "gpt2 = zoo_plugins.gpt2" in zf.read(entry_points).decode()


def test_installed_wheel_lists_the_four_models(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--quiet",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import zoo, zoo_plugins, sys;"
        f"assert zoo.__file__.startswith({str(target)!r}), zoo.__file__;"
        f"assert zoo_plugins.__file__.startswith({str(target)!r});"
        "print(' '.join(zoo.list_models()));"
        "print(zoo.build('transformer-encdec', device='meta').config.n_encoder_layers)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    models = out.stdout.split("\n")[0].split()
    assert {"gpt1", "gpt2-124m", "wiki-gpt-wordpiece", "transformer-encdec"} <= set(models)
