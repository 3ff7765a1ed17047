"""Which requests decode, and when: the queue, admission, cancellation and fairness of
``zoo serve``, in plain Python (importing it imports no torch; it is tested without).

Requests wait in one queue and are admitted in arrival order into the free rows of the
running batch between two steps (first come, first served); every running request gets one
token per step, so none waits on another's length. A request cancelled while it waits or
runs leaves before the next step. :meth:`Scheduler.submit` refuses what does not fit in the
free rows plus the queue (:class:`QueueFull`), and everything once stopping
(:class:`EngineStopped`).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

__all__ = ["EngineStopped", "QueueFull", "Schedule", "Scheduler"]


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full: try again later (HTTP 429)."""


class EngineStopped(Exception):
    """The engine is shutting down and takes no more work (HTTP 503)."""


class Cancellable(Protocol):
    """What the scheduler needs of a request: whether its client has gone away."""

    @property
    def cancelled(self) -> bool: ...


R = TypeVar("R", bound=Cancellable)


@dataclasses.dataclass
class Schedule(Generic[R]):
    """What happens before a step: the requests that join the batch (to prefill, in arrival
    order) and those that leave it or never join, cancelled (to end)."""

    admitted: list[R]
    cancelled: list[R]


class Scheduler(Generic[R]):
    """The queue of waiting requests and the set of running ones.

    Thread-safe: :meth:`submit` and :meth:`stop` come from any thread, the rest from the
    engine's.

    Args:
        max_running: requests decoding at once (the batch's rows).
        max_queue: requests that may wait for a row; more are refused.
    """

    def __init__(self, max_running: int, max_queue: int) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.max_running = max_running
        self.max_queue = max_queue
        self._running: dict[R, None] = {}  # insertion-ordered set
        self._waiting: collections.deque[R] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False

    @property
    def capacity(self) -> int:
        """Requests the engine holds at most: running plus waiting."""
        return self.max_running + self.max_queue

    @property
    def running(self) -> int:
        """Requests decoding now."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests waiting for a row."""
        return len(self._waiting)

    def submit(self, requests: Sequence[R]) -> None:
        """Queue ``requests`` (all or none).

        Raises:
            QueueFull: they do not fit in the free rows plus the waiting queue.
            EngineStopped: the engine is shutting down.
        """
        with self._cond:
            if self._stopping:
                raise EngineStopped("the server is shutting down")
            if len(requests) > self.capacity - len(self._running) - len(self._waiting):
                raise QueueFull(
                    f"the server is busy: {len(self._running)} sequences decoding and "
                    f"{len(self._waiting)} waiting (at most {self.max_running} and "
                    f"{self.max_queue}); retry later"
                )
            self._waiting.extend(requests)
            self._cond.notify_all()

    def wait(self) -> bool:
        """Block while there is nothing to do; ``False`` once stopping."""
        with self._cond:
            while not self._waiting and not self._running and not self._stopping:
                self._cond.wait()
            return not self._stopping

    def schedule(self) -> Schedule[R]:
        """Admit waiting requests into the free rows, and take out the cancelled ones."""
        with self._cond:
            cancelled = [r for r in self._running if r.cancelled]
            for request in cancelled:
                del self._running[request]
            free = self.max_running - len(self._running)
            admitted: list[R] = []
            while len(admitted) < free and self._waiting:
                request = self._waiting.popleft()
                if request.cancelled:
                    cancelled.append(request)
                else:
                    admitted.append(request)
                    self._running[request] = None
        return Schedule(admitted, cancelled)

    def finish(self, request: R) -> None:
        """``request`` has ended (or failed): its row is free."""
        with self._cond:
            self._running.pop(request, None)

    def stop(self) -> None:
        """Take no more work; :meth:`wait` returns ``False`` from now on."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def drain(self) -> list[R]:
        """Stop, and hand back every request still running or waiting (to end)."""
        with self._cond:
            self._stopping = True
            left = [*self._running, *self._waiting]
            self._running.clear()
            self._waiting.clear()
        return left
