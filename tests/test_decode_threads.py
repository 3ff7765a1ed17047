"""The CPU decoding thread policy (zoo.kernels.threads): its decisions from fake ``/proc/stat``
readings and fake thread setters (no timing), the ``ZOO_DECODE_THREADS`` setting, and
``zoo.generate`` running its steps with the policy's count and the same tokens."""

from __future__ import annotations

import pytest
import torch

from zoo.errors import ConfigError
from zoo.kernels import threads as policy
from zoo.kernels.threads import CpuClock, CpuReading, DecodeThreads, free_cpus, read_busy_seconds
from zoo.settings import Settings

TICK = policy._TICKS
STAT = """cpu  300 50 60 900 5 0 2 7 0 0
cpu0 {a} {n} 10 400 2 0 1 3 0 0
cpu1 {b} {n} 20 500 3 0 1 4 0 0
intr 1 2 3
"""


def stat(a: int = 100, b: int = 200, n: int = 25) -> str:
    return STAT.format(a=a, b=b, n=n)


def test_busy_seconds_are_user_system_irq_softirq_of_our_cpus():
    both = (100 + 10 + 1) + (200 + 20 + 1)
    assert read_busy_seconds(stat(), [0, 1], niced=False) == pytest.approx(both / TICK)
    assert read_busy_seconds(stat(), [1], niced=False) == pytest.approx(221 / TICK)
    # a niced process competes with niced neighbours: their time counts then
    assert read_busy_seconds(stat(), [0, 1], niced=True) == pytest.approx((both + 50) / TICK)


@pytest.mark.parametrize("text", ["", "cpu0 1 2 3 4 5 6 7\n", "cpu0 x 1 1 1 1 1 1\ncpu1 1"])
def test_busy_seconds_of_a_missing_or_garbled_cpu_are_none(text):
    assert read_busy_seconds(text, [0, 1], niced=False) is None


def test_the_clock_reads_a_fake_stat_and_is_none_without_one():
    clock = CpuClock([0, 1], stat=stat, wall=lambda: 5.0, own=lambda: 1.5)
    niced = 50 if clock._niced else 0  # this test run itself may be niced
    assert clock.read() == CpuReading(5.0, (332 + niced) / TICK, 1.5)

    def unreadable() -> str:
        raise OSError("no /proc here")

    assert CpuClock([0, 1], stat=unreadable).read() is None
    assert CpuClock([], stat=stat).read() is None


@pytest.mark.parametrize(
    ("others", "n_cpus", "free"),
    [
        (0.0, 2, 2),  # quiet
        (0.3, 2, 2),  # a shell, the kernel: still free
        (0.67, 2, 1),  # one busy neighbour squeezed by our spinning threads
        (1.0, 2, 1),  # one busy neighbour
        (2.0, 2, 0),  # both cores taken
        (3.5, 2, 0),  # more than taken: never below 0
        (0.94, 16, 15),
    ],
)
def test_free_cpus_count_what_others_leave(others, n_cpus, free):
    before = CpuReading(wall=10.0, busy=100.0, own=3.0)
    own = 0.8  # this process's own CPU time in the interval never counts as others'
    after = CpuReading(wall=10.5, busy=100.0 + own + others * 0.5, own=3.0 + own)
    assert free_cpus(before, after, n_cpus) == free


def test_no_time_between_readings_counts_every_cpu_free():
    same = CpuReading(1.0, 5.0, 1.0)
    assert free_cpus(same, same, 4) == 4


class FakeClock:
    """A machine where other processes use ``others`` CPUs; each step is ``step`` s long
    (the policy looks at the wall clock once a step)."""

    def __init__(self, others: float, n_cpus: int = 2, step: float = 0.3) -> None:
        self.cpus = tuple(range(n_cpus))
        self.others, self.step, self.now, self.busy = others, step, 0.0, 0.0
        self.working, self.own = 0.0, 0.0  # this process's CPUs in use, its CPU seconds
        self.reads = 0

    def wall(self) -> float:
        self.now += self.step
        self.busy += (self.others + self.working) * self.step
        self.own += self.working * self.step
        return self.now

    def read(self) -> CpuReading:
        self.reads += 1
        return CpuReading(self.now, self.busy, self.own)


class Threads:
    """A fake of torch's thread count that records every change."""

    def __init__(self, count: int) -> None:
        self.count, self.calls = count, list[int]()

    def set(self, n: int) -> None:
        self.calls.append(n)
        self.count = n


def steps(decode: DecodeThreads, n: int) -> list[int]:
    counts = []
    for _ in range(n):
        with decode.step() as used:
            counts.append(used)
    return counts


def policy_for(others: float, setting: int | None = None, count: int = 2):
    fake = Threads(count)
    clock = FakeClock(others)
    decode = DecodeThreads(
        setting, clock=clock, get_threads=lambda: fake.count, set_threads=fake.set
    )
    return decode, fake


def test_a_quiet_machine_changes_nothing():
    decode, fake = policy_for(others=0.1)
    assert steps(decode, 6) == [2] * 6 and fake.calls == []


def test_stat_is_read_once_an_interval_not_once_a_step():
    clock = FakeClock(others=1.0, step=1 / 64)  # 64 steps a second (exact in binary)
    fake = Threads(2)
    decode = DecodeThreads(clock=clock, get_threads=lambda: fake.count, set_threads=fake.set)
    counts = steps(decode, 100)
    assert clock.reads == 7  # the first step, then once per 0.25 s: steps 16, 32, ... 96
    assert counts[:16] == [2] * 16 and set(counts[16:]) == {1}


def test_a_busy_neighbour_gets_its_core_and_torch_count_is_put_back():
    decode, fake = policy_for(others=0.9)
    # the first step starts the first interval; from the second one on, one thread
    assert steps(decode, 4) == [2, 1, 1, 1]
    assert fake.calls == [1, 2] * 3 and fake.count == 2 and decode.threads == 1


def test_never_more_than_torch_count_and_never_none():
    decode, fake = policy_for(others=3.0, count=1)
    assert steps(decode, 3) == [1, 1, 1] and fake.calls == []
    decode, fake = policy_for(others=0.0, count=1)  # two free CPUs, torch asked for one
    assert steps(decode, 3) == [1, 1, 1] and fake.calls == []


def test_the_neighbour_leaving_gives_the_threads_back():
    decode, _ = policy_for(others=1.0)
    assert steps(decode, 3) == [2, 1, 1]
    decode._clock.others = 0.0
    assert steps(decode, 2) == [2, 2]


def test_a_new_policy_starts_from_this_process_s_last_reading(monkeypatch):
    """Each generation has its own policy; the next one starts from the last reading and
    decision of this process (when under ``STALE`` seconds old) instead of running its
    first interval blind on torch's count."""
    monkeypatch.setattr(DecodeThreads, "_latest", None)
    now = [0.0]  # seconds; a neighbour holds CPU 0 throughout (user ticks grow with time)

    def busy_stat() -> str:
        return stat(a=int(now[0] * TICK), b=0)

    def policy_at(start: float) -> tuple[DecodeThreads, Threads]:
        now[0] = start
        fake = Threads(2)
        clock = CpuClock([0, 1], stat=busy_stat, wall=lambda: now[0], own=lambda: 0.0)
        decode = DecodeThreads(clock=clock, get_threads=lambda: fake.count, set_threads=fake.set)
        return decode, fake

    def timed_steps(decode: DecodeThreads, n: int) -> list[int]:
        counts = []
        for _ in range(n):
            now[0] += 0.3
            counts += steps(decode, 1)
        return counts

    first, _ = policy_at(10.0)
    assert timed_steps(first, 3) == [2, 1, 1]  # blind for its first interval
    second, _ = policy_at(now[0] + 0.5)
    assert timed_steps(second, 2) == [1, 1]  # starts from the first one's decision
    later, _ = policy_at(now[0] + 1 + policy.STALE)
    assert timed_steps(later, 2) == [2, 1]  # too old a reading: blind again


def test_after_an_idle_spell_the_first_step_runs_torch_count():
    """A server between bursts reads nothing for a while; what other processes did over that
    spell says nothing of the next step, which runs torch's count and starts a new interval
    (a burst's prefill ran on one thread because a client had been busy while it waited)."""
    decode, _ = policy_for(others=1.0)
    assert steps(decode, 3) == [2, 1, 1]
    decode._clock.step = 4 * policy.STALE  # the wall clock jumps: an idle spell
    assert steps(decode, 1) == [2]
    decode._clock.step = 0.3
    assert steps(decode, 2) == [1, 1]  # the neighbour is still there


def test_a_step_longer_than_stale_keeps_its_reading():
    """A training step of a larger model (4 s of an 8-layer Llama beside a busy core) is no
    idle spell: the process computed throughout, so what others did over the step holds and
    the next step runs one thread (it ran torch's count at every step: 0.77x the best count)."""
    decode, _ = policy_for(others=1.0)
    decode._clock.working = 1.0
    decode._clock.step = 4 * policy.STALE
    assert steps(decode, 4) == [2, 1, 1, 1]
    decode._clock.working = 0.2  # a server waiting for requests: idle, torch's count again
    assert steps(decode, 1) == [2]


def test_the_setting_overrides_the_policy():
    decode, fake = policy_for(others=1.0, setting=0)
    assert steps(decode, 3) == [2, 2, 2] and fake.calls == []
    decode, fake = policy_for(others=0.0, setting=3)
    assert steps(decode, 2) == [3, 3] and fake.calls == [3, 2, 3, 2]
    with pytest.raises(ValueError, match="0 \\(off\\) or >= 1"):
        DecodeThreads(-1)


def test_without_a_reading_the_count_stays():
    class Blind(FakeClock):
        def read(self) -> CpuReading | None:  # type: ignore[override]
            return None

    fake = Threads(2)
    decode = DecodeThreads(clock=Blind(1.0), get_threads=lambda: fake.count, set_threads=fake.set)
    assert steps(decode, 3) == [2, 2, 2] and fake.calls == []


def test_only_the_cpu_gets_a_policy():
    assert DecodeThreads.for_device(torch.device("cuda"), None).setting == 0
    assert DecodeThreads.for_device(torch.device("cpu"), None).setting is None
    assert DecodeThreads.for_device(torch.device("cpu"), 2).setting == 2


@pytest.mark.parametrize(("text", "value"), [("auto", None), (" AUTO ", None), ("0", 0), ("3", 3)])
def test_zoo_decode_threads(text, value):
    assert Settings.from_env({"ZOO_DECODE_THREADS": text}).decode_threads == value
    assert Settings.from_env({}).decode_threads is None


@pytest.mark.parametrize("text", ["-1", "many"])
def test_a_bad_zoo_decode_threads_names_the_variable(text):
    with pytest.raises(ConfigError, match=rf"ZOO_DECODE_THREADS={text!r}"):
        Settings.from_env({"ZOO_DECODE_THREADS": text})


def _tiny_model():
    import zoo

    torch.manual_seed(0)
    return zoo.build("gpt2-124m", d_model=32, n_heads=2, d_ff=64, n_layers=2, vocab_size=300)


def _record_steps(monkeypatch) -> list[int]:
    """The thread count each decoding step (prefill included) runs with, as the model sees
    it: a forward pre-hook's reading would do as well."""
    from zoo.runtime.decoding import DecoderSession

    seen: list[int] = []
    for name in ("prefill", "step"):
        real = getattr(DecoderSession, name)

        def counting(self, *args, _real=real):
            seen.append(torch.get_num_threads())
            return _real(self, *args)

        monkeypatch.setattr(DecoderSession, name, counting)
    return seen


def _busy_machine(monkeypatch) -> list[int]:
    """A fake machine where a neighbour holds one of two cores (the policy would pick one
    thread), and a record of every ``torch.set_num_threads`` call on this thread (OpenMP
    keeps the count per thread: the native kernels' check tries counts on a thread of its
    own)."""
    import threading

    calls: list[int] = []
    real, caller = torch.set_num_threads, threading.get_ident()

    def spy(n: int) -> None:
        if threading.get_ident() == caller:
            calls.append(n)
        real(n)

    monkeypatch.setattr(policy, "CpuClock", lambda: FakeClock(others=1.0))
    monkeypatch.setattr(torch, "set_num_threads", spy)
    return calls


def test_generate_leaves_torch_threads_alone_by_default(monkeypatch):
    """A library call does not change process-wide state: on a machine
    where the policy would decode with one thread, zoo.generate's steps run with the
    caller's count, it never sets torch's count, and both counts are the same after. Not
    ZOO_DECODE_THREADS either: that is the command line's and zoo serve's setting."""
    import zoo

    model = _tiny_model()
    ids = torch.randint(0, 300, (1, 5))
    before = torch.get_num_threads(), torch.get_num_interop_threads()
    torch.set_num_threads(2)
    seen = _record_steps(monkeypatch)
    calls = _busy_machine(monkeypatch)
    try:
        for setting in (None, "auto", "1"):
            if setting is not None:
                monkeypatch.setenv("ZOO_DECODE_THREADS", setting)
            zoo.generate(model, ids, max_new_tokens=6, temperature=0)
            zoo.generate(model, [[1, 2, 3], [4]], max_new_tokens=3, temperature=0)
        assert set(seen) == {2} and calls == []
        assert torch.get_num_threads() == 2
        assert torch.get_num_interop_threads() == before[1]
    finally:
        monkeypatch.undo()
        torch.set_num_threads(before[0])


def test_generate_runs_its_steps_with_the_policy_it_is_asked_for(monkeypatch):
    """``threads="auto"`` sizes each step by the policy (here a neighbour holds one of two
    cores) and puts torch's count back; ``threads=N`` runs N; the tokens are those of
    torch's own count."""
    import zoo

    model = _tiny_model()
    ids = torch.randint(0, 300, (1, 5))
    seen = _record_steps(monkeypatch)
    monkeypatch.setattr(policy, "CpuClock", lambda: FakeClock(others=1.0))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        plain = zoo.generate(model, ids, max_new_tokens=6, temperature=0)
        assert seen == [2] * 6
        seen.clear()
        chosen = zoo.generate(model, ids, max_new_tokens=6, temperature=0, threads="auto")
        assert seen == [2] + [1] * 5 and torch.get_num_threads() == 2  # the first step reads
        seen.clear()
        zoo.generate(model, ids, max_new_tokens=3, temperature=0, threads=1)
        assert seen == [1] * 3 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert torch.equal(plain, chosen)


@pytest.mark.parametrize("threads", [0, -1, "many", 1.5, True])
def test_a_bad_threads_choice_is_refused_by_name(threads):
    from zoo.generation import GenerationConfig

    with pytest.raises(ConfigError, match="threads"):
        GenerationConfig(threads=threads)


@pytest.mark.parametrize(
    ("env", "chosen"), [(None, "auto"), ("auto", "auto"), ("0", None), ("3", 3)]
)
def test_the_command_line_applies_its_policy(monkeypatch, env, chosen):
    """``zoo generate`` and ``zoo chat`` ask for the policy ``ZOO_DECODE_THREADS`` names
    (default: the cores other processes leave free)."""
    import argparse

    from zoo.cli.generate import generation_config

    if env is None:
        monkeypatch.delenv("ZOO_DECODE_THREADS", raising=False)
    else:
        monkeypatch.setenv("ZOO_DECODE_THREADS", env)
    args = argparse.Namespace(
        max_new_tokens=4, temperature=0.0, top_k=None, top_p=None, seed=None, compile=False
    )
    assert generation_config(args).threads == chosen


def test_zoo_generate_decodes_with_the_policy(monkeypatch, capsys):
    """The command line's steps run with the policy's count (a neighbour on one of two
    cores: one thread), and torch's count is back after."""
    from zoo.cli import main

    seen = _record_steps(monkeypatch)
    monkeypatch.setattr(policy, "CpuClock", lambda: FakeClock(others=1.0))
    monkeypatch.delenv("ZOO_DECODE_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        args = ["generate", "shakespeare-byte", "To", "--random", "--max-new-tokens", "5"]
        assert main([*args, "--temperature", "0"]) == 0
        assert seen[1:] and set(seen[1:]) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


_CHILD_OPENMP = """
import threading, torch
calls = []
real = torch.set_num_threads
def spy(n):
    calls.append((threading.get_ident(), n))
    real(n)
torch.set_num_threads = spy
real(3)
from zoo.kernels import native
first = native.available()
again = [native.available() for _ in range(3)]
main = threading.get_ident()
print("MAIN", [n for ident, n in calls if ident == main], torch.get_num_threads(), len(calls))
"""


def test_the_native_kernels_openmp_check_leaves_the_callers_threads_alone():
    """The native kernels' check that their OpenMP runtime is PyTorch's never sets the
    calling thread's count (it tries counts on a thread of its own), once per process; run
    in a fresh process, where the check has not run yet."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _CHILD_OPENMP], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("MAIN")][-1]
    _, on_main, threads, total = line.split(" ", 3)
    assert on_main == "[]" and threads == "3"
    assert int(total) <= 3  # one check: two counts tried and the caller's put back


# -- training steps under the same policy ------------------------------------------------------
def _record_train_steps(monkeypatch) -> list[int]:
    """The thread count each optimizer step of zoo.train runs with."""
    from zoo.train import loop

    seen: list[int] = []
    real = loop.optimizer_step

    def counting(run, lr):
        seen.append(torch.get_num_threads())
        return real(run, lr)

    monkeypatch.setattr(loop, "optimizer_step", counting)
    return seen


def test_training_steps_take_the_cores_other_processes_leave(monkeypatch, tmp_path):
    """``train(threads="auto")`` (zoo train's default) sizes each optimizer step as decoding
    does (a neighbour holds one of two cores: one thread once the first interval is read),
    ``threads=N`` runs N, the default leaves torch's count alone; torch's count is back after
    each step, and the losses are those of torch's own count."""
    from zoo.tokenizers.byte import ByteTokenizer
    from zoo.train import TrainConfig, train

    data = tmp_path / "text.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    config = TrainConfig(steps=4, batch_size=2, eval_every=0, eval_batches=1, warmup=1)
    seen = _record_train_steps(monkeypatch)
    monkeypatch.setattr(policy, "CpuClock", lambda: FakeClock(others=1.0))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    losses = {}
    try:
        for threads in (None, "auto", 1):
            seen.clear()
            result = train(_tiny_model(), data, tmp_path / f"run-{threads}", config=config,
                           tokenizer=ByteTokenizer(), log=None, threads=threads)  # fmt: skip
            losses[threads] = result.losses
            expected = {None: [2] * 4, "auto": [2, 1, 1, 1], 1: [1] * 4}[threads]
            assert seen == expected and torch.get_num_threads() == 2, (threads, seen)
    finally:
        torch.set_num_threads(before)
    assert losses[None] == losses["auto"] == losses[1]


@pytest.mark.parametrize("threads", [0, -2, "many", 1.5, True])
def test_a_bad_training_threads_choice_is_refused(threads, tmp_path):
    from zoo.train import TrainConfig, train

    data = tmp_path / "text.txt"
    data.write_text("the quick brown fox. " * 400)
    with pytest.raises(ValueError, match="threads must be None, 'auto' or a count"):
        train(_tiny_model(), data, tmp_path / "run", config=TrainConfig(steps=1, batch_size=2),
              log=None, threads=threads)  # fmt: skip


@pytest.mark.parametrize(
    ("env", "chosen"), [(None, "auto"), ("auto", "auto"), ("0", None), ("3", 3)]
)
def test_zoo_train_asks_for_the_policy_zoo_train_threads_names(monkeypatch, env, chosen):
    from zoo.cli.train import _threads

    if env is None:
        monkeypatch.delenv("ZOO_TRAIN_THREADS", raising=False)
    else:
        monkeypatch.setenv("ZOO_TRAIN_THREADS", env)
    assert _threads() == chosen
