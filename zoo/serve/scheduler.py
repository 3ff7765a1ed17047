"""Which requests run, and how much of each, every step: the queue, admission, cancellation,
fairness and the token budget of ``zoo serve``, in plain Python (importing it imports no
torch; it is tested without).

Requests wait in one queue and are admitted in arrival order into the free rows of the
running batch between two steps (first come, first served). Then, as vLLM's scheduler does,
:meth:`Scheduler.plan` decides the step: every running request past its prompt decodes one
token (none waits on another's length, and a decode is never cut), and the prompts still
coming in get chunks under the step's prefill budget (:class:`~zoo.serve.prefill_budget.
PrefillBudget`; the chunks are prefilled left-padded in one pass, so the budget counts the
padding): as many of them as prefill the most real tokens, oldest first, each from where it
stands (:func:`plan_chunks`). The oldest prompt waiting gets a chunk every step, so none
starves. The plan (a :class:`StepPlan`) is what the engine hands the runner to execute.

A request cancelled while it waits or runs leaves before the next step.
:meth:`Scheduler.submit` refuses what does not fit in the free rows plus the queue
(:class:`QueueFull`), and everything once stopping (:class:`EngineStopped`).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from .prefill_budget import DEFAULT_MAX_STALL, DEFAULT_PREFILL_CHUNK, PrefillBudget

__all__ = [
    "Chunk",
    "EngineStopped",
    "QueueFull",
    "Schedule",
    "Scheduler",
    "StepPlan",
    "plan_chunks",
]


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


@dataclasses.dataclass(frozen=True)
class Chunk(Generic[R]):
    """The ``length`` prompt tokens of ``request`` from position ``start``, prefilled this
    step; ``last``: they end its prompt (their pass gives its first token)."""

    request: R
    start: int
    length: int
    last: bool


@dataclasses.dataclass(frozen=True)
class StepPlan(Generic[R]):
    """One step, as :meth:`Scheduler.plan` decides it: the requests that decode one token
    (in admission order) and the prompt chunks prefilled together in one left-padded pass
    (in arrival order)."""

    decodes: tuple[R, ...]
    chunks: tuple[Chunk[R], ...]

    @property
    def padded(self) -> int:
        """Tokens of the prefill pass, padding included: what the budget bounds."""
        return len(self.chunks) * max((c.length for c in self.chunks), default=0)


def plan_chunks(left: list[int], budget: int | None) -> list[int]:
    """How many tokens each of the first prompts waiting (``left``: the tokens each has left,
    in arrival order) prefills in the next pass, left-padded together: at most ``budget``
    tokens counting the padding (``None``: no bound). Takes the number of prompts that
    prefills the most real tokens (the fewest padded ones on a tie); the first prompt is
    always among them."""
    if budget is None:
        return list(left)
    best: tuple[int, int] = (0, 0)  # (real tokens, -padded tokens)
    sizes: list[int] = []
    for m in range(1, min(len(left), budget) + 1):
        width = min(budget // m, max(left[:m]))
        chunk = [min(n, width) for n in left[:m]]
        score = (sum(chunk), sum(chunk) - m * width)
        if score > best:
            best, sizes = score, chunk
    return sizes


class Scheduler(Generic[R]):
    """The queue of waiting requests and the set of running ones.

    Thread-safe: :meth:`submit` and :meth:`stop` come from any thread, the rest from the
    engine's.

    Args:
        max_running: requests decoding at once (the batch's rows).
        max_queue: requests that may wait for a row; more are refused.
        prefill_chunk: prompt tokens a step prefills at most, padding included (``None``:
            whole prompts).
        max_stall: while streams decode, a step's prompt chunk is sized to take at most about
            this many decoding steps (times the prompts waiting per stream where more wait
            than decode), as :attr:`budget` is told (``None``: only
            ``prefill_chunk`` bounds it).
    """

    def __init__(
        self,
        max_running: int,
        max_queue: int,
        *,
        prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
        max_stall: float | None = DEFAULT_MAX_STALL,
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.max_running = max_running
        self.max_queue = max_queue
        #: The prefill tokens of each step; the engine tells it how long steps take.
        self.budget = PrefillBudget(prefill_chunk, max_stall)
        self._running: dict[R, None] = {}  # insertion-ordered set
        # each running request still prefilling, in arrival order: [tokens in, prompt tokens]
        self._prompts: dict[R, list[int]] = {}
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
                self._prompts.pop(request, None)
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

    def joined(self, request: R, prompt: int, cached: int = 0) -> None:
        """``request`` (admitted) has its row: its prompt of ``prompt`` tokens, the first
        ``cached`` of them in already (copied from the prefix cache), is prefilled from the
        next :meth:`plan` on.

        Raises:
            ValueError: ``request`` is not running, or ``cached`` is not in ``[0, prompt)``
                (the prompt's last token must be computed: it gives the first new one).
        """
        if not 0 <= cached < prompt:
            raise ValueError(
                f"cached tokens must be in [0, {prompt}), got {cached}: the last prompt token "
                "is always computed, for the logits of the first new one"
            )
        with self._cond:
            if request not in self._running:
                raise ValueError(f"{request!r} is not running: admit it with schedule() first")
            self._prompts[request] = [cached, prompt]

    @property
    def prefilling(self) -> list[R]:
        """Running requests whose prompts are not all in yet, in arrival order."""
        with self._cond:
            return list(self._prompts)

    def plan(self) -> StepPlan[R]:
        """The next step: every running request past its prompt decodes one token, and the
        prompts still coming in get chunks under the budget (see the module). Counts the
        chunks as prefilled: a prompt whose last chunk this is decodes from the next plan
        on."""
        with self._cond:
            decodes = tuple(r for r in self._running if r not in self._prompts)
            waiting = list(self._prompts.items())
            budget = self.budget.tokens(len(decodes), len(waiting))
            sizes = plan_chunks([n - done for _, (done, n) in waiting], budget)
            chunks: list[Chunk[R]] = []
            for (request, progress), size in zip(waiting, sizes, strict=False):
                start, prompt = progress
                chunks.append(Chunk(request, start, size, start + size == prompt))
                progress[0] += size
                if progress[0] == prompt:
                    del self._prompts[request]
        return StepPlan(decodes, tuple(chunks))

    def finish(self, request: R) -> None:
        """``request`` has ended (or failed): its row is free."""
        with self._cond:
            self._running.pop(request, None)
            self._prompts.pop(request, None)

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
            self._prompts.clear()
            self._waiting.clear()
        return left
