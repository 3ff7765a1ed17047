"""zoo serve's scheduler: the queue, admission, cancellation and fairness, in plain Python.
Importing it (and the requests it schedules) imports no torch, and nothing here needs a
model: requests are stand-ins with a ``cancelled`` flag."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zoo.serve.scheduler import EngineStopped, QueueFull, Scheduler, plan_chunks


def test_the_scheduler_and_its_requests_import_no_torch():
    code = (
        "import sys\n"
        "import zoo.serve.scheduler, zoo.serve.prefill_budget, zoo.serve.request\n"
        "import zoo.generation.reply\n"
        "heavy = sorted(m for m in ('torch', 'fastapi', 'uvicorn') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


class Job:
    """A request as the scheduler sees it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cancelled = False

    def __repr__(self) -> str:
        return self.name


def test_requests_join_in_arrival_order_as_rows_free_up():
    scheduler: Scheduler[Job] = Scheduler(max_running=2, max_queue=3)
    a, b, c, d = (Job(n) for n in "abcd")
    scheduler.submit([a, b, c])
    scheduler.submit([d])
    assert scheduler.capacity == 5 and scheduler.waiting == 4
    first = scheduler.schedule()
    assert first.admitted == [a, b] and first.cancelled == []
    assert (scheduler.running, scheduler.waiting) == (2, 2)
    assert scheduler.schedule().admitted == [], "no free row"
    scheduler.finish(b)
    assert scheduler.schedule().admitted == [c]
    scheduler.finish(a)
    scheduler.finish(c)
    assert scheduler.schedule().admitted == [d] and scheduler.running == 1


def test_a_full_queue_refuses_all_or_none():
    scheduler: Scheduler[Job] = Scheduler(max_running=1, max_queue=1)
    scheduler.submit([Job("a")])
    scheduler.schedule()
    with pytest.raises(QueueFull, match=r"busy: 1 sequences decoding and 0 waiting \(at most 1"):
        scheduler.submit([Job("b"), Job("c")])
    assert scheduler.waiting == 0, "a refused request leaves nothing queued"
    scheduler.submit([Job("b")])
    with pytest.raises(ValueError, match="max_queue must be >= 0, got -1"):
        Scheduler(max_running=1, max_queue=-1)


def test_cancelled_requests_leave_before_the_next_step_and_never_join():
    scheduler: Scheduler[Job] = Scheduler(max_running=1, max_queue=2)
    running, waiting, next_ = Job("running"), Job("waiting"), Job("next")
    scheduler.submit([running, waiting, next_])
    scheduler.schedule()
    running.cancelled = waiting.cancelled = True
    schedule = scheduler.schedule()
    assert schedule.cancelled == [running, waiting] and schedule.admitted == [next_]
    assert scheduler.running == 1 and scheduler.waiting == 0


def test_stopping_refuses_work_wakes_the_loop_and_drains_every_request():
    scheduler: Scheduler[Job] = Scheduler(max_running=1, max_queue=2)
    woke: list[bool] = []
    idle = threading.Thread(target=lambda: woke.append(scheduler.wait()))
    idle.start()  # nothing to do: the engine's loop waits
    scheduler.submit([Job("a"), Job("b")])
    idle.join(10)
    assert woke == [True]
    scheduler.schedule()
    scheduler.stop()
    assert scheduler.wait() is False
    with pytest.raises(EngineStopped, match="shutting down"):
        scheduler.submit([Job("c")])
    assert [j.name for j in scheduler.drain()] == ["a", "b"]
    assert scheduler.running == scheduler.waiting == 0


class Prompt(Job):
    """A request with a prompt of ``length`` tokens, ``cached`` of them copied in."""

    def __init__(self, name: str, length: int, cached: int = 0) -> None:
        super().__init__(name)
        self.length = length
        self.cached = cached


def joined(scheduler: Scheduler[Job], *requests: Prompt) -> None:
    """Submit ``requests``, admit them, and tell the scheduler their prompts."""
    scheduler.submit(list(requests))
    for request in scheduler.schedule().admitted:
        assert isinstance(request, Prompt)
        scheduler.joined(request, request.length, request.cached)


def test_the_step_plan_decodes_every_stream_and_prefills_chunks_under_the_budget():
    scheduler: Scheduler[Job] = Scheduler(
        max_running=3, max_queue=2, prefill_chunk=8, max_stall=None
    )
    a, b = Prompt("a", 5), Prompt("b", 20, cached=4)
    joined(scheduler, a, b)
    first = scheduler.plan()
    assert first.decodes == ()
    assert [(c.request, c.start, c.length, c.last) for c in first.chunks] == [
        (a, 0, 4, False),
        (b, 4, 4, False),
    ]
    assert first.padded == 8
    assert scheduler.prefilling == [a, b]
    second = scheduler.plan()  # 2 rows of 4 prefill 1 + 4 tokens, 1 row of 8 only a's 1
    assert [(c.request, c.start, c.length, c.last) for c in second.chunks] == [
        (a, 4, 1, True),
        (b, 8, 4, False),
    ]
    assert scheduler.plan().decodes == (a,), "a's prompt is in: it decodes from the next step on"
    while scheduler.prefilling:
        plan = scheduler.plan()
        assert set(plan.decodes).isdisjoint(c.request for c in plan.chunks)
    assert scheduler.plan() == type(first)(decodes=(a, b), chunks=())
    scheduler.finish(a)
    assert scheduler.plan().decodes == (b,)
    with pytest.raises(ValueError, match=r"cached tokens must be in \[0, 3\), got 3"):
        c = Prompt("c", 3, cached=3)
        joined(scheduler, c)


def test_a_burst_of_prompts_beside_one_stream_enters_in_one_pass():
    """Seven 10-token prompts arrive while one stream decodes and a chunk of 40 tokens takes
    the stall the budget allows one prompt: all seven enter in the next step (before, four
    of them did, and the rest waited a step for their first token); one long prompt beside
    four streams still gets the 40 tokens alone."""
    scheduler: Scheduler[Job] = Scheduler(max_running=8, max_queue=0, prefill_chunk=512)
    scheduler.budget.decoded(0.1)
    scheduler.budget.prefilled(40, 0.2)  # 40 tokens take the 2 steps' target
    stream = Prompt("stream", 3)
    joined(scheduler, stream)
    assert [c.length for c in scheduler.plan().chunks] == [3]  # nothing decodes: whole
    burst = [Prompt(f"p{i}", 10) for i in range(7)]
    joined(scheduler, *burst)
    plan = scheduler.plan()
    assert plan.decodes == (stream,)
    assert [(c.request, c.length, c.last) for c in plan.chunks] == [(p, 10, True) for p in burst]
    for p in burst:
        scheduler.finish(p)
    streams = [Prompt(f"s{i}", 1) for i in range(3)]
    joined(scheduler, *streams)
    scheduler.plan()
    long = Prompt("long", 900)
    joined(scheduler, long)
    plan = scheduler.plan()
    assert len(plan.decodes) == 4 and [c.length for c in plan.chunks] == [40]


@settings(max_examples=300, deadline=None)
@given(
    left=st.lists(st.integers(1, 600), min_size=1, max_size=12),
    budget=st.one_of(st.none(), st.integers(1, 600)),
)
def test_plan_chunks_keeps_the_budget_and_always_serves_the_oldest_prompt(left, budget):
    sizes = plan_chunks(left, budget)
    assert sizes and sizes[0] >= 1, "the oldest prompt waiting always gets a chunk"
    assert all(1 <= s <= n for s, n in zip(sizes, left, strict=False)) and len(sizes) <= len(left)
    if budget is None:
        assert sizes == left
    else:
        assert len(sizes) * max(sizes) <= budget, "the padded pass fits the budget"


# (prompt tokens, cached tokens, new tokens, step it arrives at)
MIX = st.lists(
    st.tuples(st.integers(1, 60), st.integers(0, 59), st.integers(1, 5), st.integers(0, 6)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(mix=MIX, rows=st.integers(1, 4), budget=st.one_of(st.none(), st.integers(1, 48)))
def test_step_plans_keep_the_budget_fill_every_prompt_in_order_and_starve_no_one(mix, rows, budget):
    """Requests arrive, join, prefill and decode as the engine runs them, step by step:
    every plan keeps to the budget (padding included), decodes every stream past its prompt
    (decodes are never cut), continues each prompt where it stands in arrival order, always
    serves the oldest prompt waiting, and every request ends within a bounded number of
    steps."""
    scheduler: Scheduler[Job] = Scheduler(
        max_running=rows, max_queue=len(mix), prefill_chunk=budget, max_stall=None
    )
    requests = [Prompt(f"r{i}", n, min(c, n - 1)) for i, (n, c, _, _) in enumerate(mix)]
    wants = {r: k for r, (_, _, k, _) in zip(requests, mix, strict=True)}
    arrives = {r: t for r, (*_, t) in zip(requests, mix, strict=True)}
    filled: dict[Job, int] = {}  # prompt tokens in, of each request admitted
    got: dict[Job, int] = {}  # new tokens of each request past its prompt
    ended: list[Job] = []
    bound = max(arrives.values()) + sum(n for n, *_ in mix) + sum(wants.values()) + 1
    for step in range(bound + 1):
        scheduler.submit([r for r in requests if arrives[r] == step])
        admitted = scheduler.schedule().admitted
        for request in admitted:
            assert isinstance(request, Prompt)
            scheduler.joined(request, request.length, request.cached)
            filled[request] = request.cached
        waiting = scheduler.prefilling
        plan = scheduler.plan()
        if budget is not None:
            assert plan.padded <= budget
        streams = {r for r in filled if r not in ended and filled[r] == r.length}  # type: ignore[attr-defined]
        assert set(plan.decodes) == streams and len(plan.decodes) == len(streams)
        assert [c.request for c in plan.chunks] == waiting[: len(plan.chunks)]
        assert bool(plan.chunks) == bool(waiting), "the oldest prompt waiting always moves"
        for chunk in plan.chunks:
            length = chunk.request.length  # type: ignore[attr-defined]
            assert chunk.start == filled[chunk.request] and chunk.length >= 1
            filled[chunk.request] += chunk.length
            assert filled[chunk.request] <= length and chunk.last == (
                filled[chunk.request] == length
            )
        for request in [*plan.decodes, *(c.request for c in plan.chunks if c.last)]:
            got[request] = got.get(request, 0) + 1
            if got[request] == wants[request]:
                scheduler.finish(request)
                ended.append(request)
        if len(ended) == len(requests):
            break
    assert sorted(ended, key=requests.index) == requests, f"left after {bound} steps"
    assert all(filled[r] == r.length for r in requests)  # type: ignore[attr-defined]
