"""What the serving tests hand a request as its ``emit``: :class:`Collect` keeps the events
the engine emits (from whichever thread runs it)."""

from __future__ import annotations

import threading

from zoo.serve.engine import Finish


class Collect:
    """A sequence's events, as the engine emits them."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.finish: Finish | None = None
        self.done = threading.Event()
        self.started = threading.Event()

    def __call__(self, event: str | Finish) -> None:
        if isinstance(event, Finish):
            self.finish = event
            self.done.set()
        else:
            self.pieces.append(event)
            self.started.set()

    @property
    def text(self) -> str:
        """The text so far."""
        return "".join(self.pieces)
