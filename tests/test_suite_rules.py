"""The suite's own rules hold: a skip for a reason outside ``ALLOWED_SKIPS`` (a missing file,
a missing test dependency, an expected failure) fails the run, wherever pytest reports it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

_CASES = {
    "a test skipped for a missing file": """
import pytest
def test_reference():
    pytest.skip("reference file not found")
""",
    "a module skipped at import": """
import pytest
pytest.importorskip("zoo_no_such_module")
def test_never_collected():
    pass
""",
    "a fixture that skips": """
import pytest
@pytest.fixture
def data():
    pytest.skip("data folder missing")
def test_uses(data):
    pass
""",
    "an expected failure": """
import pytest
@pytest.mark.xfail(reason="known gap")
def test_gap():
    assert False
""",
}


def _run_with_our_conftest(
    folder: Path, *bodies: str, options: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run pytest on ``bodies`` (a file each) plus one passing test, under this suite's conftest
    as a plugin, with ``options`` added to the command."""
    (folder / "pytest.ini").write_text("[pytest]\n")  # the folder is its own rootdir
    for number, body in enumerate(bodies):
        (folder / f"test_case{number}.py").write_text(body)
    (folder / "test_ok.py").write_text("def test_ok():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "conftest",
            *options,
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("case", sorted(_CASES))
def test_a_skip_outside_the_allow_list_fails_the_run(tmp_path, case):
    run = _run_with_our_conftest(tmp_path, _CASES[case])
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "skips that are not allowed" in run.stdout
    assert "1 passed" in run.stdout  # the run itself went through: only the skip failed it


def test_an_allowed_skip_passes(tmp_path):
    body = "import pytest\ndef test_gpu():\n    pytest.skip('needs CUDA')\n"
    run = _run_with_our_conftest(tmp_path, body)
    assert run.returncode == pytest.ExitCode.OK, run.stdout + run.stderr
    assert "1 passed, 1 skipped" in run.stdout


def test_the_rule_holds_with_the_readmes_worker_processes(tmp_path):
    """The README runs the suite in pytest-xdist workers (``-n``): a skip reported by a worker
    still fails the run, each one named."""
    run = _run_with_our_conftest(tmp_path, *_CASES.values(), options=("-n", "2"))
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    summary = run.stdout.split("skips that are not allowed")[-1]
    assert summary.count("test_case") == len(_CASES), run.stdout
    assert "1 passed" in run.stdout


def test_under_xdist_the_longest_files_start_first(tmp_path):
    """``--dist loadfile`` hands the files of ``HEAVY_FILES`` out first, longest first, whatever
    their number of tests (xdist's own order), so that none starts last; a file's tests keep
    their order."""
    (tmp_path / "test_readme.py").write_text("def test_a():\n    pass\ndef test_b():\n    pass\n")
    many = "".join(f"def test_{n}():\n    pass\n" for n in range(5))
    run = _run_with_our_conftest(tmp_path, many, options=("-n", "1", "--dist", "loadfile", "-vv"))
    assert run.returncode == pytest.ExitCode.OK, run.stdout + run.stderr
    order = re.findall(r"PASSED (test_\w+\.py::test_\w+)", run.stdout)
    assert order[:2] == ["test_readme.py::test_a", "test_readme.py::test_b"], run.stdout
    assert len(order) == 8
