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
    """How many CPUs the whole machine kept busy over the next ``seconds`` (``/proc/stat``;
    0.0 where it cannot be read)."""

    def ticks() -> tuple[int, int]:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)

    busy0, all0 = ticks()
    time.sleep(seconds)
    busy1, all1 = ticks()
    return (os.cpu_count() or 1) * (busy1 - busy0) / max(all1 - all0, 1)


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
