"""One HTTP request's sequences, seen from the event loop: the bridge between the engine's
thread and the ``asyncio`` code that answers the client."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .request import Event, Observer, Request

if TYPE_CHECKING:
    from ..generation import GenerationConfig
    from ..tokenizers import Tokenizer
    from .engine import Engine

__all__ = ["Outbox", "Run"]


class Outbox:
    """Events from the engine's thread to one event loop, handed over in bursts: :meth:`put`
    queues an event, and :meth:`flush` (called by the engine once a step has emitted all of
    its events) schedules one delivery on the loop for all that wait, so a step that
    advances many sequences wakes the loop once, not once per token."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: collections.deque[tuple[asyncio.Queue[Any], Any]] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def put(self, queue: asyncio.Queue[Any], item: Any) -> None:
        """Queue ``item`` for ``queue`` (from any thread); :meth:`flush` delivers it."""
        self._items.append((queue, item))

    def flush(self) -> None:
        """Deliver what is queued on the loop (from any thread), unless a delivery is
        scheduled already (it takes what is queued when it runs)."""
        with self._lock:
            if self._scheduled or not self._items:
                return
            self._scheduled = True
        # a closed loop (the server stopped) has nobody listening any more
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            self._scheduled = False  # what arrives from here on schedules its own delivery
        while self._items:
            queue, item = self._items.popleft()
            queue.put_nowait(item)


_outboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Outbox] = (
    weakref.WeakKeyDictionary()
)


class Run:
    """The sequences of one request (one per prompt) and their events, in arrival order.

    Made on the event loop; the engine's thread emits into an ``asyncio.Queue`` through the
    loop's :class:`Outbox` (and flushes it after each step). :meth:`cancel` (a client gone)
    drops every sequence that has not finished. An ``observer`` (the served model's
    :class:`~zoo.serve.metrics.ModelMetrics`) is told of each sequence as it is queued,
    decodes and ends; ``cache_salt`` keeps its prompts' blocks in the prefix cache apart
    from those of other salts (see :class:`~zoo.serve.request.Request`).
    """

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        config: GenerationConfig,
        tokenizer: Tokenizer,
        end_ids: Sequence[int],
        adapter: int = 0,
        observer: Observer | None = None,
        cache_salt: bytes = b"",
    ) -> None:
        loop = asyncio.get_running_loop()
        self._outbox = _outboxes.get(loop) or _outboxes.setdefault(loop, Outbox(loop))
        self._queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.observer = observer
        flush = self._outbox.flush
        self.sequences = [
            Request(
                prompt,
                config,
                tokenizer,
                self._emitter(i),
                end_ids,
                flush,
                adapter,
                observer,
                cache_salt,
            )
            for i, prompt in enumerate(prompts)
        ]

    def _emitter(self, index: int) -> Callable[[Event], None]:
        def emit(event: Event) -> None:
            self._outbox.put(self._queue, (index, event))

        return emit

    def submit(self, engine: Engine) -> None:
        """Hand the sequences to ``engine`` (raises :class:`~zoo.serve.scheduler.QueueFull`),
        their arrival stamped now (:meth:`Request.queued <zoo.serve.request.Request.queued>`)."""
        for sequence in self.sequences:
            sequence.queued()
        engine.submit(self.sequences)
        if self.observer is not None:
            self.observer.received(len(self.sequences))

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """``(prompt index, event)`` until every sequence has finished. The pieces of a
        sequence's text that are already waiting when one is read come as one: a client that
        falls behind gets fewer, longer pieces, never other text."""
        left = len(self.sequences)
        while left:
            waiting = [await self._queue.get()]
            while not self._queue.empty():
                waiting.append(self._queue.get_nowait())
            merged: list[tuple[int, Event]] = []
            text_at: dict[int, int] = {}  # index -> where its text is in `merged`
            for index, event in waiting:
                if isinstance(event, str) and index in text_at:
                    at = text_at[index]
                    merged[at] = (index, f"{merged[at][1]}{event}")
                    continue
                if isinstance(event, str):
                    text_at[index] = len(merged)
                else:
                    left -= 1
                merged.append((index, event))
            for item in merged:
                yield item

    def cancel(self) -> None:
        """Drop every sequence still decoding or waiting."""
        for sequence in self.sequences:
            sequence.cancel()
