"""Tests of zoo's C kernels run their code in a child process and assert on it, so a crash
in the C code fails the test instead of killing the test run.

:func:`run_native` runs the code in a fresh interpreter with the kernels turned on
(``ZOO_NATIVE_KERNELS`` unset), skips the test where they are not available (not built, or a
CPU without AVX2 and FMA), fails it on any exit but 0 (a crash, a failed ``assert``), and
returns the lines the code printed that start with ``ok`` (the cases it finished), for the
test to compare with the cases it expects.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: Run before the test's code: a child where the kernels do not run says so and ends.
PREAMBLE = """
import sys
from zoo.kernels import native
if not native.available():
    print("unavailable")
    sys.exit(0)
"""


def run_native(code: str, timeout: float = 600, **variables: str) -> list[str]:
    """``code`` (after :data:`PREAMBLE`) in a child interpreter, with ``variables`` set in
    its environment: the ``ok`` lines it printed; the test fails on a non-zero exit and is
    skipped where the kernels do not run."""
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_NATIVE_KERNELS", "ZOO_NATIVE_ISA")}
    env.update(variables)
    run = subprocess.run(
        [sys.executable, "-c", PREAMBLE + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    if run.stdout.split() == ["unavailable"]:
        pytest.skip("needs zoo's native kernels: not built, or a CPU without AVX2 and FMA")
    return [line for line in run.stdout.splitlines() if line.startswith("ok")]
