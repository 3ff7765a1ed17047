"""What the serving tests hand a request as its ``emit``: :class:`Collect` keeps the events
the engine emits (from whichever thread runs it)."""

from __future__ import annotations

import threading
import time
from typing import Any

from zoo.serve.engine import Finish
from zoo.serve.limits import Limits
from zoo.serve.server import bind, http_server


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


def serve_in_thread(
    app: Any, limits: Limits, *, wait: float = 30
) -> tuple[Any, int, threading.Thread]:
    """``app`` behind the server's uvicorn set-up, run in a thread on a free port of
    127.0.0.1: the server, its port and its thread, once it has started (within ``wait``
    seconds, else the test fails)."""
    server = http_server(app, limits, log_level="warning")
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    deadline = time.monotonic() + wait
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    return server, sock.getsockname()[1], thread
