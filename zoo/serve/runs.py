"""One HTTP request's sequences, seen from the event loop: the bridge between the engine's
thread and the ``asyncio`` code that answers the client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

from .engine import Event, Finish, Sequence

if TYPE_CHECKING:
    from ..generation import GenerationConfig
    from ..tokenizers import Tokenizer
    from .engine import Engine

__all__ = ["Run"]


class Run:
    """The sequences of one request (one per prompt) and their events, in arrival order.

    Made on the event loop; the engine's thread emits into an ``asyncio.Queue`` through
    ``call_soon_threadsafe``. :meth:`cancel` (a client gone) drops every sequence that has
    not finished.
    """

    def __init__(
        self,
        prompts: Seq[Seq[int]],
        config: GenerationConfig,
        tokenizer: Tokenizer,
        end_ids: Seq[int],
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.sequences = [
            Sequence(prompt, config, tokenizer, self._emitter(i), end_ids)
            for i, prompt in enumerate(prompts)
        ]

    def _emitter(self, index: int) -> Callable[[Event], None]:
        def emit(event: Event) -> None:
            # a closed loop (the server stopped) has nobody listening any more
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._queue.put_nowait, (index, event))

        return emit

    def submit(self, engine: Engine) -> None:
        """Hand the sequences to ``engine`` (raises :class:`~zoo.serve.engine.QueueFull`)."""
        engine.submit(self.sequences)

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """``(prompt index, event)`` until every sequence has finished."""
        left = len(self.sequences)
        while left:
            index, event = await self._queue.get()
            if isinstance(event, Finish):
                left -= 1
            yield index, event

    def cancel(self) -> None:
        """Drop every sequence still decoding or waiting."""
        for sequence in self.sequences:
            sequence.cancel()
