"""How many threads a CPU decoding step uses: the cores other processes leave free.

Why: PyTorch's CPU wheels run each parallel region (a matrix product, a norm, the attention of
one layer: about a hundred per token of gpt2-124m) on a GNU OpenMP team whose threads spin at
the region's end until the whole team is done. When another process holds one of the cores,
one thread of the team waits behind it for a scheduler time slice while the others spin, at
every region. On 2 shared cores a gpt2-124m step with 2 threads took several times as long
as with 1, where on a quiet machine 2 threads are faster than 1 (docs/benchmarks.md,
"Figures behind design choices" and "Why zoo lost more than CTranslate2 on shared cores",
has the figures). oneDNN is not the cause (PyTorch's own kernels lose as much), the wait
is: with ``OMP_WAIT_POLICY=PASSIVE`` 2 threads came close to 1, but libgomp reads it once
when it starts, so zoo cannot set it in a user's process; the team's size it can set per step.
(CTranslate2 and llama.cpp ship GNU OpenMP too; llama.cpp with 2 threads lost as much.)

:class:`DecodeThreads` is the policy: before a decoding step it reads how busy this
process's CPUs were since its last reading (``/proc/stat``, the time of processes that are
not niced, less this process's own time: :class:`CpuClock`), counts a CPU as free when other
processes left at least half of it, and runs the step with ``min(torch's thread count, free
CPUs)`` threads (at least one), putting torch's count back after the step. On a quiet machine
it changes nothing. After an idle spell (no reading for :data:`STALE` seconds, in which this
process used under half a CPU: a server between bursts, not a long training step) the first
step runs torch's count: what others did while this process slept says
nothing of now (a burst's prefill had run on one thread because a client had been busy).
It is opt-in: ``zoo generate``, ``zoo chat`` and ``zoo serve`` use it,
``zoo.generate`` only with ``threads="auto"`` (a library call leaves the process's thread
count alone). ``ZOO_DECODE_THREADS`` (:class:`zoo.settings.Settings`) overrides the command
line's: ``0`` leaves torch's count alone, ``N`` decodes with ``N`` threads. ``zoo train``
runs each optimizer step under the same policy (``zoo.train.train(threads="auto")``;
``ZOO_TRAIN_THREADS`` as ``ZOO_DECODE_THREADS``): a training step's parallel regions wait
behind a busy core as a decoding step's do.

Tokens: the thread count does not change the matrix products (oneDNN's, PyTorch's and the
int8 kernels give the same bits with 1 or 2 threads), but PyTorch's CPU attention kernel for
a single new query splits the keys by thread count, so its output can differ in the last bit
between thread counts, as it does between machines with different core counts.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

__all__ = [
    "Clock",
    "CpuClock",
    "CpuReading",
    "DecodeThreads",
    "free_cpus",
    "idle",
    "read_busy_seconds",
]

#: A CPU counts as free when other processes used at most this much of it.
FREE_SHARE = 0.5
#: Seconds between two readings of ``/proc/stat`` (it counts in ticks of a hundredth of a
#: second: 25 per CPU).
INTERVAL = 0.25
#: Seconds between two readings past which the busy time between them says nothing of the
#: next step (the policy was idle: a server between bursts); the step runs torch's count. A
#: new policy (the next generation) starts from this process's last reading younger than this
#: instead of running its first interval blind.
STALE = 4 * INTERVAL

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuReading:
    """One reading: ``wall`` (monotonic seconds), ``busy`` (seconds the CPUs in question
    spent on processes, summed over them) and ``own`` (this process's CPU seconds)."""

    wall: float
    busy: float
    own: float


def read_busy_seconds(text: str, cpus: Sequence[int], *, niced: bool) -> float | None:
    """Busy seconds of the CPUs ``cpus`` in ``/proc/stat`` text: user, system, irq and
    softirq time (niced processes' time too when ``niced``, i.e. when this process is niced
    and so competes with them); ``None`` when a CPU's line is missing or unreadable."""
    wanted = {f"cpu{c}" for c in cpus}
    total, seen = 0, 0
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] not in wanted:
            continue
        try:
            user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[1:8])
        except ValueError:
            return None
        total += user + system + irq + softirq + (nice if niced else 0)
        seen += 1
    return total / _TICKS if seen == len(wanted) else None


class Clock(Protocol):
    """What :class:`DecodeThreads` reads: the CPUs in question and a reading of them."""

    @property
    def cpus(self) -> tuple[int, ...]: ...

    def wall(self) -> float: ...

    def read(self) -> CpuReading | None: ...


class CpuClock:
    """Reads how busy this process's CPUs are (Linux ``/proc/stat``); :meth:`read` is
    ``None`` elsewhere, and the policy then leaves the thread count alone."""

    def __init__(
        self,
        cpus: Sequence[int] | None = None,
        *,
        stat: Callable[[], str] | None = None,
        wall: Callable[[], float] = time.monotonic,
        own: Callable[[], float] = time.process_time,
    ) -> None:
        affinity = getattr(os, "sched_getaffinity", None)
        self.cpus = tuple(cpus if cpus is not None else sorted(affinity(0)) if affinity else ())
        self._stat = stat if stat is not None else _proc_stat
        self.wall, self._own = wall, own
        getpriority = getattr(os, "getpriority", None)
        self._niced = bool(getpriority and getpriority(os.PRIO_PROCESS, 0) > 0)

    def read(self) -> CpuReading | None:
        """A reading now, or ``None`` when ``/proc/stat`` cannot be read."""
        if not self.cpus:
            return None
        try:
            busy = read_busy_seconds(self._stat(), self.cpus, niced=self._niced)
        except OSError:
            return None
        return None if busy is None else CpuReading(self.wall(), busy, self._own())


def _proc_stat() -> str:
    with open("/proc/stat", encoding="ascii") as file:
        return file.read()


def free_cpus(before: CpuReading, after: CpuReading, n_cpus: int) -> int:
    """How many of ``n_cpus`` CPUs other processes left free between two readings: a CPU
    counts when others used at most :data:`FREE_SHARE` of it (others' use is the CPUs' busy
    time less this process's own, per second of wall time)."""
    wall = after.wall - before.wall
    if wall <= 0:
        return n_cpus
    others = max(0.0, (after.busy - before.busy) - (after.own - before.own)) / wall
    return max(0, min(n_cpus, math.floor(n_cpus - others + FREE_SHARE)))


def idle(before: CpuReading, after: CpuReading) -> bool:
    """Whether this process sat idle between two readings: more than :data:`STALE` seconds
    apart, and less than :data:`FREE_SHARE` of a CPU of its own time per second between them
    (a server between bursts). A step longer than that (a training step of a larger model)
    keeps the process busy, and its reading holds."""
    wall = after.wall - before.wall
    return wall > STALE and after.own - before.own < FREE_SHARE * wall


class DecodeThreads:
    """The thread count of each CPU decoding step: wrap every step in :meth:`step`.

    ``setting`` is ``Settings.decode_threads``: ``None`` chooses (the cores other processes
    leave free, at most torch's thread count when the step starts), ``0`` leaves torch's count
    alone, ``N`` runs steps with ``N`` threads. One object serves a whole generation (or a
    server's steps); it is not for use from two threads at once. :attr:`threads` is the
    count the last step ran with. A new policy starts from this process's last reading and
    decision where it is under :data:`STALE` seconds old, so the next generation does not
    run its first interval blind on torch's count (a short generation beside a busy core
    spent much of itself there).
    """

    def __init__(
        self,
        setting: int | None = None,
        *,
        clock: Clock | None = None,
        get_threads: Callable[[], int] = torch.get_num_threads,
        set_threads: Callable[[int], None] = torch.set_num_threads,
    ) -> None:
        if setting is not None and setting < 0:
            raise ValueError(
                f"decode threads must be None (choose), 0 (off) or >= 1, not {setting}"
            )
        self.setting = setting
        self._clock: Clock | None = clock
        if clock is None and setting is None:
            self._clock = CpuClock()
        self._get, self._set = get_threads, set_threads
        self._last: CpuReading | None = None
        self._free: int | None = None  # CPUs free at the last decision
        self.threads: int | None = None
        latest = DecodeThreads._latest
        if type(self._clock) is CpuClock and latest is not None:
            reading, free, cpus = latest
            if cpus == self._clock.cpus and self._clock.wall() - reading.wall < STALE:
                self._last, self._free = reading, free

    #: The last reading and decision of any policy on this process's CPUs (with the CPUs
    #: read), which the next policy starts from.
    _latest: tuple[CpuReading, int | None, tuple[int, ...]] | None = None

    @classmethod
    def for_device(cls, device: torch.device, setting: int | None) -> DecodeThreads:
        """The policy for steps on ``device``: off (``setting=0``) unless it is the CPU."""
        return cls(setting if device.type == "cpu" else 0)

    def _choose(self, torch_threads: int) -> int:
        """The count for the next step, given torch's count now."""
        if self.setting is not None:
            return self.setting or torch_threads
        clock, last = self._clock, self._last
        if clock is None:
            return torch_threads
        if last is None or clock.wall() - last.wall >= INTERVAL:  # reading /proc/stat is not free
            now = clock.read()
            if now is None:
                return torch_threads
            if last is not None:  # (an idle spell says nothing of now: torch's count)
                self._free = None if idle(last, now) else free_cpus(last, now, len(clock.cpus))
            self._last = now  # the first step starts the first interval
            if type(clock) is CpuClock:
                DecodeThreads._latest = (now, self._free, clock.cpus)
        return torch_threads if self._free is None else max(1, min(torch_threads, self._free))

    @contextlib.contextmanager
    def step(self) -> Iterator[int]:
        """Run the ``with`` body (one decoding step) with the chosen thread count; torch's
        count is put back after it. Yields the count."""
        before = self._get()
        threads = self._choose(before)
        self.threads = threads
        if threads == before:
            yield threads
            return
        self._set(threads)
        try:
            yield threads
        finally:
            self._set(before)
