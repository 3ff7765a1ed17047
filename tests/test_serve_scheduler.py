"""zoo serve's scheduler: the queue, admission, cancellation and fairness, in plain Python.
Importing it (and the requests it schedules) imports no torch, and nothing here needs a
model: requests are stand-ins with a ``cancelled`` flag."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from zoo.serve.scheduler import EngineStopped, QueueFull, Scheduler


def test_the_scheduler_and_its_requests_import_no_torch():
    code = (
        "import sys\n"
        "import zoo.serve.scheduler, zoo.serve.request, zoo.generation.reply\n"
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
