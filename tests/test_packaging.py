"""A non-editable install ships registry.toml and the built-in plugins (as ``zoo_plugins``,
never a top-level ``plugins``) and finds all four named models."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``pip wheel`` builds from this checkout; what the build printed (``-v``: the
    backend's output too) is ``build.log`` beside it."""
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-v",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (out / "build.log").write_text(done.stdout + done.stderr)
    (path,) = out.glob("torch_zoo-*.whl")
    return path


def test_wheel_contents(wheel):
    """The wheel holds the top-level registry.toml as a regular file, byte for byte (in the
    source tree ``zoo/registry.toml`` is only a link to it)."""
    names = zipfile.ZipFile(wheel).namelist()
    assert "zoo/registry.toml" in names
    assert "zoo_plugins/gpt2/__init__.py" in names
    # the model zoo trained, and its data, ship inside the package
    assert "zoo_plugins/shakespeare/weights/model.safetensors" in names
    assert "zoo_plugins/shakespeare/data/tinyshakespeare.txt" in names
    assert not any(n.startswith("plugins/") for n in names)
    assert not any(n.startswith("tests/") for n in names)
    with zipfile.ZipFile(wheel) as zf:
        entry = zf.getinfo("zoo/registry.toml")
        assert not stat.S_ISLNK(entry.external_attr >> 16), "registry.toml shipped as a link"
        assert zf.read(entry) == (ROOT / "registry.toml").read_bytes()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        advertised = zf.read(entry_points).decode()
        assert "gpt2 = zoo_plugins.gpt2\n" in advertised  # a module of hooks
        assert "qwen2 = zoo_plugins.qwen2:family\n" in advertised  # a declared family
    # every package setuptools found (none listed by hand), data folders included
    assert "zoo/checkpoint/hf_rules.py" in names and "zoo_plugins/qwen2/convert.py" in names
    assert "zoo_plugins/gpt2/data/gpt2.tiktoken" in names
    shipped = {
        f"{installed}/{init.relative_to(ROOT / folder).as_posix()}"
        for folder, installed in (("zoo", "zoo"), ("plugins", "zoo_plugins"))
        for init in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in init.parts
    }
    assert shipped <= set(names), f"not in the wheel: {sorted(shipped - set(names))}"


def test_the_source_registry_is_the_top_level_one():
    """``zoo/registry.toml`` (what an editable install reads) is a link to the top-level file,
    never a copy that could drift from it."""
    inner = ROOT / "zoo" / "registry.toml"
    assert inner.is_symlink(), "zoo/registry.toml must stay a link to ../registry.toml"
    assert inner.resolve() == (ROOT / "registry.toml").resolve()


def test_sdist_ships_the_registry_as_a_regular_file(tmp_path):
    """What the index gets: the source archive (from which pip builds the wheel) holds
    ``zoo/registry.toml`` as a regular file, byte for byte the top-level one."""
    code = (
        "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    name = out.stdout.strip().splitlines()[-1]
    assert name.startswith("torch_zoo-"), name
    with tarfile.open(tmp_path / name) as archive:
        (member,) = [m for m in archive.getmembers() if m.name.endswith("/zoo/registry.toml")]
        assert member.isfile(), "registry.toml is in the source archive as a link"
        data = archive.extractfile(member)
        assert data is not None and data.read() == (ROOT / "registry.toml").read_bytes()


def test_the_distribution_is_torch_zoo():
    """``zoo`` on the package index is an unrelated project: this one installs as
    ``torch-zoo`` and its version is the package's."""
    import zoo

    assert zoo.DISTRIBUTION == "torch-zoo"
    assert metadata.metadata(zoo.DISTRIBUTION)["Name"] == "torch-zoo"
    assert metadata.version(zoo.DISTRIBUTION) == zoo.__version__
    assert set(metadata.packages_distributions()["zoo"]) == {"torch-zoo"}  # import name: zoo


def test_installed_wheel_lists_every_model_of_its_registry_file(wheel, tmp_path):
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
    with open(ROOT / "registry.toml", "rb") as file:
        shipped = set(tomllib.load(file)["models"])
    assert {"gpt1", "gpt2-124m", "wiki-gpt-wordpiece", "transformer-encdec"} <= shipped
    assert set(models) == shipped  # zoo's own named models: registry.toml, in the wheel


def test_ci_runs_the_readme_test_command():
    """`.ci/run` runs exactly the README's test command (on a clone with nothing beside it)."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = ci.strip().splitlines()[-1]
    assert command.startswith("python3 -m venv .venv") and "pytest" in command
    assert f"```sh\n{command}\n```" in readme
    assert "git clone" in ci and '"$(ls -A ..)" != "zoo"' in ci  # nothing beside the clone


#: What a test or the package may not reach for: files outside the repository.
_OUTSIDE = re.compile(
    r"\.\./shared|/shared/|/\s*[\"']shared[\"']|[\"']/work/"  # the machine's shared folder
    r"|parents\[[2-9]\]|\.parent\.parent\.parent"  # climbing out of tests/ or zoo/
)


@pytest.mark.parametrize("folder", ["zoo", "plugins", "tests", "benchmarks", ".ci"])
def test_nothing_reads_outside_the_repository(folder):
    """A fresh clone with no folder beside it must pass: no path may leave the repository."""
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / folder).rglob("*"))
        if path.is_file() and path.suffix in {".py", ".toml", ""}
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if _OUTSIDE.search(line) and path.name != "test_packaging.py"
    ]
    assert not offenders, "\n".join(offenders)


def test_vendored_reference_files_match_their_hashes():
    folder = ROOT / "tests" / "data" / "gpt1"
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    assert "MIT License" in (folder / "LICENSE").read_text()


def _extensions() -> list[dict]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        extensions: list[dict] = tomllib.load(file)["tool"]["setuptools"]["ext-modules"]
    return extensions


def test_the_native_kernels_are_an_optional_extension():
    """zoo's C kernels (``zoo/kernels/_native*.c``) are built by ``pip install`` as an optional
    extension, under the name :mod:`zoo.kernels.native` looks for, from sources that exist: a
    failed build must leave an install that runs on PyTorch's kernels."""
    from zoo.kernels import native

    (extension,) = _extensions()
    assert extension["name"] == native._SOURCE
    assert extension["optional"] is True
    assert extension["sources"] and all((ROOT / s).is_file() for s in extension["sources"])


def test_a_failing_compiler_builds_nothing_and_fails_nothing(tmp_path):
    """The extension as pyproject.toml declares it, built by setuptools' ``build_ext`` with a
    compiler that always fails (``CC=/bin/false``, as on a machine without one): the build
    succeeds with a warning and no library (what ``pip install`` of a fresh clone did by hand:
    installed, ``zoo.kernels.native.available()`` False, zoo generating on PyTorch's kernels)."""
    code = (
        "import json, sys; from setuptools import Extension, setup\n"
        "spec = {k.replace('-', '_'): v for k, v in json.loads(sys.argv[1]).items()}\n"
        "setup(name='probe', ext_modules=[Extension(**spec)], script_args=['build_ext',"
        " '--build-lib', sys.argv[2], '--build-temp', sys.argv[2]])\n"
    )
    (extension,) = _extensions()
    env = {**os.environ, "CC": "/bin/false"}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(extension), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert f'building extension "{extension["name"]}" failed' in done.stdout + done.stderr
    assert not list(tmp_path.rglob("*.so"))


def test_the_wheel_ships_the_native_kernels_where_they_build(wheel):
    """Where this checkout's install built the kernels (a C compiler with OpenMP), the wheel
    built here ships them too, built for the stable ABI (``_native.abi3.so``, one library for
    every Python the wheel installs on); where its build could not (setup.py's one line says
    why), the wheel ships none."""
    import importlib.util

    built = importlib.util.find_spec("zoo.kernels._native") is not None
    skipped = "zoo: building without its C kernels (" in (wheel.parent / "build.log").read_text()
    names = zipfile.ZipFile(wheel).namelist()
    shipped = [n for n in names if n.startswith("zoo/kernels/_native.") and not n.endswith(".c")]
    assert bool(shipped) == built, shipped
    assert bool(shipped) != skipped, shipped
    if shipped and not sysconfig.get_config_var("Py_GIL_DISABLED"):
        library = "pyd" if sys.platform == "win32" else "so"
        assert shipped == [f"zoo/kernels/_native.abi3.{library}"], shipped


def test_the_wheel_is_one_for_every_python_from_the_minimum(wheel):
    """abi3: the wheel is tagged ``cp3X-abi3-<platform>``, X being ``requires-python``'s
    minimum, so one wheel installs on that CPython and every later one (a free-threaded
    Python has no stable ABI yet: its wheel is for that interpreter alone)."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        minimum = tomllib.load(file)["project"]["requires-python"]
    found = re.fullmatch(r">=3\.(\d+)", minimum)
    assert found, f"requires-python {minimum!r} is not '>=3.N'"
    name, version, python, abi, platform = wheel.stem.split("-")
    assert (name, version) == ("torch_zoo", metadata.version("torch-zoo").replace("-", "_"))
    assert platform != "any"  # the kernels are for one platform
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        assert abi != "abi3", wheel.name
    else:
        assert (python, abi) == (f"cp3{found.group(1)}", "abi3"), wheel.name


def test_the_wheel_ships_no_module_the_tree_lacks(wheel):
    """Every source file of zoo the wheel ships is one of this checkout's, and every library
    sits next to the C sources it is built from: a ``build/`` folder left from before a module
    moved (setuptools copies into it and never deletes) would ship the old module and the old
    library too, shadowing the new path. Remove ``build/`` if this fails."""
    names = zipfile.ZipFile(wheel).namelist()
    stale = [n for n in names if n.startswith("zoo/") and n.endswith((".py", ".c"))]
    stale = [n for n in stale if not (ROOT / n).is_file()]
    libraries = [n for n in names if n.startswith("zoo/") and n.endswith((".so", ".pyd"))]
    stale += [n for n in libraries if not (ROOT / n).parent.joinpath("_native.c").is_file()]
    assert stale == [], f"the wheel ships files this checkout does not have: {stale}"
