"""Test-suite set-up: a real third-party plugin distribution is "installed" for the session.

``tests/toy_plugin`` is copied into a temporary site directory next to a ``.dist-info`` whose
``entry_points.txt`` advertises it in the ``zoo`` group, and that directory is put on
``sys.path``: zoo discovers it exactly as it would a pip-installed plugin, so every
registry-driven test also runs on its ``toy-gpt-tiny`` model.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# CI explores the same examples on every run (a property failure found locally is then
# reproducible there, and CI never goes red on a new random draw); locally each run draws anew.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

pytest_plugins = ["hub_fixtures"]  # the `local_hub` fixture: a Hub-compatible server on 127.0.0.1

TESTS = Path(__file__).parent

#: The only reasons a test may skip for. Any other skip (a missing file, a missing test
#: dependency) fails the run: a skip must never hide something the suite should have.
ALLOWED_SKIPS = (
    "needs CUDA",
    "needs /proc/self/maps",
    "needs a C++ compiler",
    "needs zoo's native kernels",  # tests/test_native.py fails where they could be built
    "needs llama-cpp-python",  # llama.cpp itself on zoo's GGUF files: the bench extra builds it
)

_site: Path | None = None
_compile_cache: Path | None = None


def install_distribution(site: Path, package: Path, *, name: str, entry_points: str) -> None:
    """Lay out ``package`` plus a minimal ``.dist-info`` in ``site`` like pip would."""
    shutil.copytree(package, site / package.name)
    dist_info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(entry_points)


_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_real_getaddrinfo = socket.getaddrinfo


def _loopback_only(host, *args, **kwargs):  # type: ignore[no-untyped-def]
    """Tests never use the network: any name but the loopback is refused before a lookup."""
    if host not in _LOOPBACK and host is not None:
        raise OSError(f"tests may reach only 127.0.0.1, not {host!r}")
    return _real_getaddrinfo(host, *args, **kwargs)


def _share_the_cores() -> None:
    """Under pytest-xdist (the README's ``-n``), give torch in each worker process its share of
    the cores, not all of them: N workers each running a thread per core only spin against one
    another. Set before torch is imported, so processes a test starts inherit the share too; an
    ``OMP_NUM_THREADS`` the caller set wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (cores or 1) // workers)))


#: The files that take longest: seconds of one worker under ``-n 2 --dist loadfile``,
#: measured with ``--durations`` on the 2-core machine while it was loaded (several times an
#: idle run's: only their order matters). Each worker takes the next file when it is almost
#: done, in the order the workers collected them. xdist's own order (the files with most
#: tests first) starts long files with few tests (the guides' runs, training, the compiled
#: steps) wherever their count puts them: in that run the guides' runs (1,141 s) started
#: 1,594 s in; a long file that starts last keeps one worker running after the other has
#: finished. Longest first (the longest-processing-time rule) leaves only short files for the
#: end, whatever their counts. Over that run's complete per-test durations both orders
#: balance within seconds (3,525 s and 3,521 s simulated for the slower worker, 3,521 s
#: ideal), so this is insurance against a new long file, not a saving measured today. Only
#: the balance depends on these figures: a stale or missing one makes a run slower, never a
#: result different. The figures are those of the README's command at 0b87417 with
#: ``--durations=0`` (825 s of pytest at load 2-3.7, another engineer's runs beside it; the
#: guides' runs with a batch of 2 and zoo train's imports paid once, one family's compile
#: fewer), test_cli's after its seeded --random case moved to shakespeare-byte (39 -> 25 s).
HEAVY_FILES = {
    "test_readme.py": 250,
    "test_families.py": 150,
    "test_train.py": 125,
    "test_static_decoding.py": 80,
    "test_quantize_seams.py": 60,
    "test_suite_rules.py": 45,
    "test_train_tasks.py": 45,
    "test_train_seams.py": 35,
    "test_train_lora.py": 35,
    "test_serve.py": 35,
    "test_layering.py": 30,
    "test_tokenizer_memory.py": 30,
    "test_quantize.py": 30,
    "test_chat_cli.py": 30,
    "test_tokenizer_provenance.py": 30,
    "test_cli_ux.py": 30,
    "test_cli.py": 25,
    "test_conformance.py": 25,
    "test_slot_step.py": 25,
    "test_plugins.py": 20,
    "test_save_atomic.py": 20,
}


def _heaviest_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` (in place) so that the files of :data:`HEAVY_FILES` come first, longest
    first, and the rest follow in collection order; a file's tests keep their order."""
    first_seen: dict[Path, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.path, index)
    items.sort(key=lambda item: (-HEAVY_FILES.get(item.path.name, 0), first_seen[item.path]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one process runs them all in any order
        _heaviest_first(items)


def pytest_configure(config: pytest.Config) -> None:
    global _site, _compile_cache
    if hasattr(config.option, "loadscopereorder"):  # xdist: keep the order conftest gives
        config.option.loadscopereorder = False
    _share_the_cores()
    socket.getaddrinfo = _loopback_only
    # torch.compile's on-disk cache: a fresh one, never what an earlier run left in /tmp
    _compile_cache = Path(tempfile.mkdtemp(prefix="zoo-test-inductor-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(_compile_cache)
    _site = Path(tempfile.mkdtemp(prefix="zoo-test-site-"))
    install_distribution(
        _site,
        TESTS / "toy_plugin" / "zoo_toy",
        name="zoo-toy",
        entry_points="[zoo]\ntoy = zoo_toy\n",
    )
    sys.path.insert(0, str(_site))
    import zoo

    zoo.reset_registry()


def site_dir() -> Path:
    """The folder holding the toy plugin this session installs (child processes that should
    see it put it on ``PYTHONPATH``)."""
    assert _site is not None, "pytest_configure has not run"
    return _site


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in (_site, _compile_cache):
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


_unexpected_skips: list[str] = []


def _note_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Record a skip whose reason is not in ``ALLOWED_SKIPS`` (an expected failure counts too:
    it hides a failure as a skip hides a test)."""
    if not report.skipped:
        return
    if wasxfail := getattr(report, "wasxfail", None):
        _unexpected_skips.append(f"{report.nodeid}: xfail {wasxfail}".rstrip())
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
    reason = reason.removeprefix("Skipped: ")
    if not reason.startswith(ALLOWED_SKIPS):
        _unexpected_skips.append(f"{report.nodeid}: {reason}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A whole module skipped at import (``pytest.importorskip`` at its top) is a skip too."""
    _note_skip(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unexpected_skips and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _unexpected_skips:
        terminalreporter.section("skips that are not allowed (see ALLOWED_SKIPS in conftest.py)")
        for line in _unexpected_skips:
            terminalreporter.write_line(line)


@pytest.fixture
def use_registry() -> Iterator[Callable[[Any], Any]]:
    """``use_registry(registry)``: every zoo call in this test uses ``registry`` (through the
    public ``zoo.use_registry``, undone when the test ends)."""
    import zoo

    with contextlib.ExitStack() as stack:
        yield lambda registry: stack.enter_context(zoo.use_registry(registry))


@pytest.fixture
def fresh_dynamo() -> Iterator[Any]:
    """``torch.compile`` starts afresh: dynamo's caches and counters are reset, and the
    counters (``torch._dynamo.utils.counters``) are yielded. A process that has compiled one
    function for ``recompile_limit`` (8) models runs it eagerly from then on, with a warning
    only: a compile test that runs after the others in its worker would compare eager with
    eager and pass. Each test asserts what it compiled (``counters["stats"]["unique_graphs"]``).
    """
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
