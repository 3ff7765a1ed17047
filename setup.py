"""What pyproject.toml cannot declare about zoo's optional C kernels (``zoo.kernels._native``,
declared in its ``[[tool.setuptools.ext-modules]]``).

- One wheel for every CPython from ``requires-python``'s minimum on: the extension is built
  against the stable ABI (``Py_LIMITED_API`` set to that version, so the library is
  ``_native.abi3.so``) and the wheel is tagged ``cp3X-abi3`` (not on a free-threaded Python,
  which has no stable ABI yet: there the library is built for that interpreter alone).
- A build that skips in one line: before compiling, a tiny OpenMP program is compiled and
  linked with the configured compiler and the extension's flags; where that fails (no C
  compiler, Apple's clang without libomp) or the compiler is MSVC (which cannot compile the
  kernels' gcc builtins and attributes), the build prints one line saying why and builds no
  kernels, so ``pip install`` still succeeds and zoo runs PyTorch's kernels.
- No stale library: a library of the extension left under another suffix (the
  ``_native.cpython-311-*.so`` an older checkout built, which importlib prefers over
  ``_native.abi3.so``), or left from a build that failed or was skipped, is removed from the
  build folder and, for an in-place or editable build, from the source tree.

``tests/test_native_build.py`` runs these builds.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import re
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent

#: Compiled and linked with the extension's flags before the extension is.
PROBE = r"""
#include <omp.h>

int zoo_probe(int n) {
    int total = 0;
#pragma omp parallel for reduction(+ : total)
    for (int i = 0; i < n; i++) total += i;
    return total + omp_get_max_threads();
}
"""

#: The start of the one line a build without the kernels prints.
SKIPPED = "zoo: building without its C kernels"


def limited_api() -> tuple[int, int] | None:
    """The oldest CPython the stable-ABI build serves: ``requires-python``'s minimum, or
    ``None`` on a free-threaded Python (no stable ABI before 3.15)."""
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'^requires-python\s*=\s*">=\s*3\.(\d+)\s*"', text, re.MULTILINE)
    if found is None:
        raise SystemExit(
            'setup.py: pyproject.toml\'s requires-python must read ">=3.N": the stable ABI '
            "the kernels are built for is that minimum's"
        )
    return 3, int(found.group(1))


def first_error(output: str, commands: tuple[str, ...], fallback: str) -> str:
    """The line of a compiler's ``output`` that says what failed (not the command lines
    setuptools echoes, which start with one of ``commands``), else ``fallback``."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(commands)]
    pattern = re.compile(r"error|cannot|unsupported|unknown|not found|undefined", re.IGNORECASE)
    return next((line for line in lines if pattern.search(line)), lines[0] if lines else fallback)


@contextlib.contextmanager
def captured() -> Iterator[list[str]]:
    """What this process and its children write on stdout and stderr meanwhile (the file
    descriptors, as the compiler's child process inherits them), in the list it yields."""
    text: list[str] = []
    with tempfile.TemporaryFile() as sink:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield text
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            text.append(sink.read().decode(errors="replace"))


def why_not(compiler: Any, compile_args: list[str], link_args: list[str]) -> str | None:
    """Why ``compiler`` cannot build the kernels with these flags, in a few words; ``None``
    where it compiled and linked :data:`PROBE` with them."""
    if compiler.compiler_type == "msvc":
        return "MSVC cannot compile the kernels' gcc builtins and attributes"
    programs = (getattr(compiler, "compiler_so", None), getattr(compiler, "linker_so", None))
    commands = tuple(words[0] for words in programs if words)
    name = commands[0] if commands else compiler.compiler_type
    with tempfile.TemporaryDirectory() as folder, captured() as output:
        source = os.path.join(folder, "zoo_probe.c")
        Path(source).write_text(PROBE, encoding="utf-8")
        try:
            objects = compiler.compile([source], output_dir=folder, extra_postargs=compile_args)
            library = os.path.join(folder, "zoo_probe" + compiler.shared_lib_extension)
            compiler.link_shared_object(objects, library, extra_postargs=link_args)
        except Exception as error:  # CompileError, LinkError, or a compiler that is not there
            failed: Exception | None = error
        else:
            failed = None
    if failed is None:
        return None
    return f"{name} cannot compile OpenMP C: {first_error(output[0], commands, str(failed))}"


class BuildKernels(build_ext):
    """setuptools' ``build_ext`` with the stable ABI, the probe and the stale-library
    removal described in this file's docstring."""

    def finalize_options(self) -> None:
        super().finalize_options()
        version = limited_api()
        for ext in self.extensions or []:
            if not ext.py_limited_api:
                continue
            if version is None:
                ext.py_limited_api = False
            elif not any(name == "Py_LIMITED_API" for name, *_ in ext.define_macros):
                major, minor = version
                ext.define_macros.append(("Py_LIMITED_API", f"0x{major:02X}{minor:02X}0000"))
        self._declared = list(self.extensions or [])
        self._built: set[str] = set()

    def build_extensions(self) -> None:
        optional = [ext for ext in self.extensions if ext.optional]
        if optional:
            reason = why_not(
                self.compiler, optional[0].extra_compile_args, optional[0].extra_link_args
            )
            if reason is not None:
                print(f"{SKIPPED} ({reason}); zoo will run PyTorch's kernels", file=sys.stderr)
                self.extensions = [ext for ext in self.extensions if not ext.optional]
        super().build_extensions()

    def build_extension(self, ext: Any) -> None:
        super().build_extension(ext)
        self._built.add(ext.name)  # not reached where the build failed

    def run(self) -> None:
        super().run()
        for ext in self._declared:
            self._remove_stale(ext)

    def _remove_stale(self, ext: Any) -> None:
        """Every library of ``ext`` in the build folder (and in the source tree when built in
        place) but the one this build made."""
        filename = self.get_ext_filename(self.get_ext_fullname(ext.name))
        folders = [Path(self.build_lib, filename).parent]
        if self.inplace:
            package = ext.name.rpartition(".")[0]
            folders.append(Path(self.get_finalized_command("build_py").get_package_dir(package)))
        keep = Path(filename).name if ext.name in self._built else None
        base = ext.name.rpartition(".")[2]
        for folder in folders:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                stale = folder / (base + suffix)
                if stale.name != keep and stale.is_file():
                    print(f"zoo: removing {stale}: not this build's library", file=sys.stderr)
                    stale.unlink()


def _options() -> dict[str, dict[str, str]]:
    version = limited_api()
    if version is None:
        return {}
    return {"bdist_wheel": {"py_limited_api": f"cp{version[0]}{version[1]}"}}


if __name__ == "__main__":
    setup(cmdclass={"build_ext": BuildKernels}, options=_options())
