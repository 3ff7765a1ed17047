"""How zoo's C kernels are built (``setup.py`` beside pyproject.toml's ext-modules) and what a
build guarantees.

- A compiler that cannot compile OpenMP C (Apple's clang without libomp, here a script that
  rejects ``-fopenmp`` as it does) or no compiler at all: the build succeeds, prints exactly
  one line saying why, and makes no library. The normal build's library is checked in
  ``tests/test_packaging.py`` (the wheel it builds: ``_native.abi3.so``, tagged abi3).
- The floating-point contract: the sources are compiled with ``-ffp-contract=off`` and write
  every fused multiply-add themselves, so gcc left to fuse on its own (its default) gives the
  same bits, clang gives the same bits as gcc, for every kernel on inputs of awkward sizes
  (``tests/native_bits.py``, run in a child process per library: a crash fails one case),
  and no ``fmaf`` is a call into the C library.

The builds go to temporary folders (``build_ext --build-lib``), never to the checkout.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).parents[1]
BITS = Path(__file__).with_name("native_bits.py")
SKIPPED = "zoo: building without its C kernels"
#: Where a C build's skip must start (tests/conftest.py's ALLOWED_SKIPS).
NEEDS = "needs zoo's native kernels"
#: What tests/native_bits.py runs: the kernels zoo.kernels.native calls, and the step.
KERNELS = (
    "gemv_f32",
    "gemm_f32",
    "layer_norm",
    "rms_norm",
    "attend_rows",
    "gemv_int8",
    "linear_int8",
    "decode_step",
)


@functools.cache
def setup_py() -> ModuleType:
    """``setup.py`` imported as a module (its ``setup()`` runs only as ``__main__``)."""
    spec = importlib.util.spec_from_file_location("zoo_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(out: Path, cc: str) -> tuple[subprocess.CompletedProcess[str], list[Path]]:
    """``setup.py build_ext`` with ``CC=cc`` into ``out``: the finished process and the
    libraries it made."""
    folders = ["--build-lib", str(out / "lib"), "--build-temp", str(out / "temp")]
    done = subprocess.run(
        [sys.executable, "setup.py", "build_ext", *folders],
        cwd=ROOT,
        env={**os.environ, "CC": cc},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, sorted(p for p in out.rglob("_native.*") if p.suffix in {".so", ".pyd"})


def skip_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if SKIPPED in line]


def test_a_compiler_without_openmp_skips_in_one_line(tmp_path: Path) -> None:
    """Apple's clang without libomp rejects ``-fopenmp``: one line names the compiler and its
    error, nothing is compiled, and the build succeeds."""
    fake = tmp_path / "cc"
    fake.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do\n'
        '  if [ "$a" = -fopenmp ]; then\n'
        "    echo \"clang: error: unsupported option '-fopenmp'\" >&2; exit 1\n"
        "  fi\n"
        "done\n"
        "echo 'cc: error: the probe must not compile without -fopenmp' >&2; exit 1\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    done, libraries = build(tmp_path / "out", str(fake))
    assert done.returncode == 0, done.stderr
    assert skip_lines(done) == [
        f"{SKIPPED} ({fake} cannot compile OpenMP C: clang: error: unsupported option "
        "'-fopenmp'); zoo will run PyTorch's kernels"
    ], done.stdout + done.stderr
    assert "building 'zoo.kernels._native' extension" not in done.stdout + done.stderr
    assert libraries == []


def test_no_compiler_skips_in_one_line(tmp_path: Path) -> None:
    done, libraries = build(tmp_path / "out", "/nonexistent")
    assert done.returncode == 0, done.stderr
    (line,) = skip_lines(done)
    assert line.startswith(f"{SKIPPED} (/nonexistent cannot compile OpenMP C: "), line
    assert "No such file" in line and line.endswith("); zoo will run PyTorch's kernels"), line
    assert libraries == []


def test_a_skipped_build_leaves_no_stale_library(tmp_path: Path) -> None:
    """A library of the extension under another suffix (what an older checkout built, which
    importlib prefers over ``_native.abi3.so``) is removed, not shipped beside nothing."""
    folder = tmp_path / "out" / "lib" / "zoo" / "kernels"
    folder.mkdir(parents=True)
    stale = [folder / f"_native{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    for path in stale:
        path.write_bytes(b"an old build")
    done, libraries = build(tmp_path / "out", "/nonexistent")
    assert done.returncode == 0, done.stderr
    assert libraries == [], libraries


def test_msvc_is_not_tried() -> None:
    """MSVC cannot compile the kernels' gcc builtins and ``__attribute__``s: not probed."""
    reason = setup_py().why_not(SimpleNamespace(compiler_type="msvc"), [], [])
    assert reason is not None and reason.startswith("MSVC cannot compile")


def test_the_first_error_line_is_the_compilers_not_the_echoed_command() -> None:
    output = (
        "gcc -Werror=implicit-function-declaration -fPIC -c zoo_probe.c -o zoo_probe.o -fopenmp\n"
        "zoo_probe.c:2:10: fatal error: omp.h: No such file or directory\n"
        "compilation terminated.\n"
    )
    line = setup_py().first_error(output, ("gcc",), "fallback")
    assert line == "zoo_probe.c:2:10: fatal error: omp.h: No such file or directory"
    assert setup_py().first_error("gcc -c x.c\n", ("gcc",), "fallback") == "fallback"


def test_the_stable_abi_is_requires_pythons_minimum() -> None:
    """``Py_LIMITED_API`` and the wheel's ``cp3X`` tag come from ``requires-python``."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        project = tomllib.load(file)
    minimum = re.fullmatch(r">=3\.(\d+)", project["project"]["requires-python"])
    assert minimum is not None
    (extension,) = project["tool"]["setuptools"]["ext-modules"]
    assert extension["py-limited-api"] is True
    assert "-ffp-contract=off" in extension["extra-compile-args"]
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip(f"{NEEDS}: a free-threaded Python has no stable ABI to build for")
    assert setup_py().limited_api() == (3, int(minimum.group(1)))


# --- the floating-point contract: the same bits from gcc, gcc fusing on its own, and clang


def _compiler(name: str) -> str:
    if not shutil.which(name):
        pytest.skip(f"{NEEDS} built by {name}: no {name} on the PATH")
    if not {"avx2", "fma"} <= set(Path("/proc/cpuinfo").read_text().split()):
        pytest.skip(f"{NEEDS}: a CPU without AVX2 and FMA")
    return name


def _shipped_build(out: Path, cc: str) -> Path:
    """The library ``setup.py`` builds with ``cc``; a skip where ``cc`` cannot compile
    OpenMP C here."""
    done, libraries = build(out, cc)
    assert done.returncode == 0, done.stderr
    if skip_lines(done):
        pytest.skip(f"{NEEDS} built by {cc}: {skip_lines(done)[0]}")
    (library,) = libraries
    assert library.name == "_native.abi3.so"
    return library


def _direct_build(out: Path, cc: str, contract: str) -> Path:
    """The three sources compiled and linked in one ``cc`` command with the shipped flags but
    ``-ffp-contract=<contract>``."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        (extension,) = tomllib.load(file)["tool"]["setuptools"]["ext-modules"]
    flags = [f for f in extension["extra-compile-args"] if not f.startswith("-ffp-contract")]
    library = out / f"_native_{contract}.so"
    subprocess.run(
        [cc, "-fPIC", "-shared", *flags, f"-ffp-contract={contract}"]
        + ["-I", sysconfig.get_paths()["include"], "-o", str(library)]
        + [str(ROOT / source) for source in extension["sources"]]
        + extension["extra-link-args"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return library


def bits(library: Path, isa: str | None = None) -> dict[str, str]:
    """Case name -> digest of its outputs, from ``tests/native_bits.py`` in a child (its
    kernels' variant forced to ``isa``, else the widest this CPU has)."""
    env = {k: v for k, v in os.environ.items() if k != "ZOO_NATIVE_ISA"}
    done = subprocess.run(
        [sys.executable, str(BITS), str(library)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env if isa is None else {**env, "ZOO_NATIVE_ISA": isa},
    )
    assert done.returncode == 0, f"{library} crashed or failed ({done.returncode}): {done.stderr}"
    lines = done.stdout.splitlines()
    if lines == ["unsupported"]:
        pytest.skip(f"{NEEDS}: a CPU without AVX2 and FMA" + (f" or {isa}" if isa else ""))
    cases = dict(line.rsplit(": ", 1) for line in lines)
    assert len(cases) == len(lines) > 90, lines  # every case ran, each under its own name
    kernels = {name.split()[0] for name in cases}
    assert kernels == set(KERNELS), kernels
    return cases


def differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    assert a.keys() == b.keys()
    return [name for name in a if a[name] != b[name]]


@pytest.fixture(scope="module")
def gcc_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _shipped_build(tmp_path_factory.mktemp("gcc"), _compiler("gcc"))


@pytest.fixture(scope="module")
def clang_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _shipped_build(tmp_path_factory.mktemp("clang"), _compiler("clang"))


def test_gcc_fusing_on_its_own_changes_no_bit(tmp_path: Path) -> None:
    """gcc's default, ``-ffp-contract=fast``, fuses any multiply and add it can, where
    vectorising happened to leave them side by side: with every fused multiply-add the
    kernels mean written out, what it may still fuse changes no bit of any kernel."""
    cc = _compiler("gcc")
    with ThreadPoolExecutor(2) as pool:  # the two builds side by side
        off, fast = pool.map(functools.partial(_direct_build, tmp_path, cc), ["off", "fast"])
    assert differing(bits(off), bits(fast)) == []


def test_clang_gives_gccs_bits(gcc_library: Path, clang_library: Path) -> None:
    """The library clang builds (``setup.py`` with ``CC=clang``; clang links LLVM's libomp
    where gcc links libgomp) computes every kernel to the same bits as gcc's."""
    assert differing(bits(gcc_library), bits(clang_library)) == []


def test_every_instruction_set_gives_the_same_bits(gcc_library: Path) -> None:
    """Each variant of the kernels (``ZOO_NATIVE_ISA``: AVX2, AVX-512), forced in a child,
    computes every kernel to the same bits: a wider set runs larger tiles of the same sums."""
    assert differing(bits(gcc_library, "avx2"), bits(gcc_library, "avx512")) == []


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_fma_is_an_instruction_not_a_call(cc: str, request: pytest.FixtureRequest) -> None:
    """Every ``fmaf`` and ``fma`` sits in an ``avx2,fma`` function, where it is one
    instruction: the library imports no ``fma`` from the C library."""
    if not shutil.which("nm"):
        pytest.skip(f"{NEEDS}: no nm (binutils) to list the library's imports")
    library = request.getfixturevalue(f"{cc}_library")
    imported = subprocess.run(
        ["nm", "-D", "--undefined-only", str(library)], check=True, capture_output=True, text=True
    ).stdout.split()
    assert not {"fma", "fmaf"} & {name.split("@")[0] for name in imported}, imported
    assert "expf" in {name.split("@")[0] for name in imported}  # nm did list the imports
