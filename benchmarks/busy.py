"""Busy neighbours for a benchmark: ``N`` processes that each keep one core busy (a Python
loop, at the benchmark's own priority) while a measurement runs, so that "a quiet machine" and
"a machine with one busy process" are the same command with ``--busy 0`` or ``--busy 1``.

    with busy(1):
        measure()
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

# spins until its parent is gone, so a benchmark killed mid-run leaves no neighbour behind
SPIN = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(10**6):
        pass
"""


@contextlib.contextmanager
def busy(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start ``n`` spinning processes, yield them, and kill them (each by its own id) when
    the block ends, however it ends."""
    if n < 0:
        raise ValueError(f"the number of busy neighbours must be >= 0, not {n}")
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def described(n: int) -> str:
    """``n`` neighbours as a report's notes name them."""
    if not n:
        return "no busy neighbour process"
    return f"{n} busy neighbour process(es) (each a Python loop spinning one core)"
