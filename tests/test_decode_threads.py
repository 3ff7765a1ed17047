"""The CPU decoding thread policy (zoo.nn.threads): its decisions from fake ``/proc/stat``
readings and fake thread setters (no timing), the ``ZOO_DECODE_THREADS`` setting, and
``zoo.generate`` running its steps with the policy's count and the same tokens."""

from __future__ import annotations

import pytest
import torch

from zoo.errors import ConfigError
from zoo.nn import threads as policy
from zoo.nn.threads import CpuClock, CpuReading, DecodeThreads, free_cpus, read_busy_seconds
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
        self.reads = 0

    def wall(self) -> float:
        self.now += self.step
        self.busy += self.others * self.step
        return self.now

    def read(self) -> CpuReading:
        self.reads += 1
        return CpuReading(self.now, self.busy, 0.0)


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


def test_generate_runs_its_steps_with_the_policy_count_and_the_same_tokens(monkeypatch):
    """zoo.generate sizes each step by the policy (here a fake machine where a neighbour
    holds one of two cores) and puts torch's count back; the tokens are those of torch's
    own count."""
    import zoo
    from zoo.nn.decoding import DecoderSession

    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", d_model=32, n_heads=2, d_ff=64, n_layers=2, vocab_size=300)
    ids = torch.randint(0, 300, (1, 5))
    seen: list[int] = []
    step = DecoderSession.step

    def counting(self, tokens):
        seen.append(torch.get_num_threads())
        return step(self, tokens)

    monkeypatch.setattr(DecoderSession, "step", counting)
    monkeypatch.setattr(policy, "CpuClock", lambda: FakeClock(others=1.0))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setenv("ZOO_DECODE_THREADS", "0")
        plain = zoo.generate(model, ids, max_new_tokens=6, temperature=0)
        assert seen == [2] * 5
        seen.clear()
        monkeypatch.setenv("ZOO_DECODE_THREADS", "auto")
        chosen = zoo.generate(model, ids, max_new_tokens=6, temperature=0)
        assert seen == [1] * 5 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert torch.equal(plain, chosen)
