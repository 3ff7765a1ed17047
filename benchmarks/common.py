"""What the benchmark scripts share: machine facts and publishing the report."""

from __future__ import annotations

import importlib
import os
import platform
import shlex
import sys
import time
from pathlib import Path


def _proc_line(path: str, key: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The CPU model, e.g. ``AMD EPYC``."""
    return _proc_line("/proc/cpuinfo", "model name") or platform.processor() or "unknown"


def machine_facts(*packages: str) -> str:
    """CPU, core count, memory, OS and Python, then ``name version`` of each package."""
    mem_kib = _proc_line("/proc/meminfo", "MemTotal")
    memory = f", {int(mem_kib.split()[0]) / 1024**2:.0f} GiB RAM" if mem_kib else ""
    versions = ", ".join(f"{name} {importlib.import_module(name).__version__}" for name in packages)
    return (
        f"{cpu_name()}, {os.cpu_count()} logical CPUs ({cpu_flags()}){memory}; Linux "
        f"{platform.release()}; Python {platform.python_version()}"
        + (f", {versions}" if versions else "")
    )


def cpu_flags() -> str:
    """The CPU features that move CPU engines' ranking: AVX2, AVX-512, bfloat16, AMX."""
    flags = set((_proc_line("/proc/cpuinfo", "flags") or "").split())
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
    return " ".join(f for f in wanted if f in flags) or "flags unknown"


def busy_cpus(seconds: float = 0.25) -> float:
    """How many CPUs the whole machine kept busy over the next ``seconds``, as zoo's thread
    policy reads them (:func:`zoo.kernels.threads.read_busy_seconds`: every process's time,
    niced ones included); 0.0 where ``/proc/stat`` cannot be read."""
    from zoo.kernels.threads import read_busy_seconds

    cpus = range(os.cpu_count() or 1)

    def busy() -> float | None:
        try:
            return read_busy_seconds(Path("/proc/stat").read_text(), cpus, niced=True)
        except OSError:
            return None

    before = busy()
    time.sleep(seconds)
    after = busy()
    return 0.0 if before is None or after is None else (after - before) / seconds


def settle(*, under: float = 0.15, timeout: float = 10.0) -> float:
    """Wait until the machine keeps fewer than ``under`` CPUs busy (what ran before has gone
    idle: vLLM's worker, for one, spins on its queue for a second after its last step), at
    most ``timeout`` seconds; return the seconds waited."""
    start = time.monotonic()
    while busy_cpus() >= under and time.monotonic() - start < timeout:
        pass
    return time.monotonic() - start


def publish(report: str, *, title: str, markdown: Path | None) -> None:
    """Print ``report`` and, when asked, write it to ``markdown`` under ``title`` with the
    command line that produced it."""
    print(report)
    if markdown is not None:
        command = shlex.join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
        markdown.write_text(f"# {title}\n\nCommand: `{command}`\n\n{report}\n")
