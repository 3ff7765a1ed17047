"""Bounds on connections, kept below the HTTP application: how long a client may take to send
a request's headers and its body, how long an idle connection stays open, and how many
connections the server holds at once, below the process's open-file limit.

uvicorn has no deadline for a request's headers or body, so a client that sends a header line
every few seconds (a "slowloris") holds its connection, and a file descriptor, for as long as
it likes; enough of them and ``accept`` fails with ``Too many open files``, and every client
waits. :class:`BoundedH11Protocol`, uvicorn's h11 protocol with deadlines, sees each connection
from the moment it is accepted, before any header is read (so before the API key is checked):

* the request's headers must be complete within ``header_timeout`` seconds of the connection
  opening (of the previous response's end plus ``keep_alive``, the idle time uvicorn bounds),
  and its body within ``body_timeout`` seconds of the headers; past either, the client gets
  408 and the connection closes;
* at most ``max_connections`` connections are open. A new one beyond that closes the connection
  that has waited longest for a request's headers or body (idle keep-alive connections
  included) if it has waited ``grace`` seconds; a connection whose request is complete is
  never closed for another. When none has (every connection has a request in progress, or
  more connections came within ``grace`` than the cap holds), the new connection is answered
  503 and closed.

:func:`connection_cap` keeps ``max_connections`` below the open-file limit with room for the
sockets accepted but not yet counted, so ``accept`` never runs out of descriptors.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .protocol import error_body

__all__ = [
    "ACCEPT_BURST",
    "DEFAULT_MAX_CONNECTIONS",
    "RESERVED_FILES",
    "BoundedH11Protocol",
    "Limits",
    "bounded_protocol",
    "connection_cap",
]

#: The most connections accepted at one wake-up of the event loop (asyncio's ``backlog``
#: argument): sockets that are open before the protocol counts them.
ACCEPT_BURST = 64
#: Connections answered 503 that may linger at once; beyond, one is closed once answered.
LINGERING = ACCEPT_BURST
#: Descriptors kept free beyond ``max_connections``: up to four bursts of sockets accepted
#: but not yet counted or closed but not yet released, the connections lingering after a
#: 503, and the process's own later files.
RESERVED_FILES = 4 * ACCEPT_BURST + LINGERING + 64
#: The default cap when the open-file limit allows it (each connection costs a few KiB; the
#: engine holds ``max_batch + max_queue`` requests, and every request beyond gets 429).
DEFAULT_MAX_CONNECTIONS = 1024
#: Seconds a connection answered 503 may go on sending before it is closed.
LINGER = 1.0


@dataclass(frozen=True)
class Limits:
    """How long a client may take and how many connections are open at once.

    Args:
        header_timeout: seconds from a connection's opening to the end of a request's
            headers (after a response: from the response's end plus ``keep_alive``).
        body_timeout: seconds from the end of the headers to the end of the body.
        keep_alive: seconds an idle connection stays open between requests.
        max_connections: connections open at once (see :func:`connection_cap`).
        grace: seconds a connection may wait for its request before a new connection
            beyond ``max_connections`` may close it (a client's request follows its
            connection at once; the time covers a busy event loop).
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive: float = 5.0
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    grace: float = 0.5

    def __post_init__(self) -> None:
        for option, value in (
            ("--header-timeout", self.header_timeout),
            ("--body-timeout", self.body_timeout),
            ("--keep-alive", self.keep_alive),
            ("--max-connections", self.max_connections),
            ("grace", self.grace),
        ):
            if not value > 0:  # NaN too
                raise ValueError(f"{option} must be a positive number, not {value}")


def open_files() -> int:
    """How many file descriptors this process has open."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 0  # unknown: the reserve is all the room there is


def connection_cap(requested: int | None = None) -> int:
    """The most connections this process can hold with ``accept`` never failing: its
    open-file limit less the files open now and :data:`RESERVED_FILES`.

    Args:
        requested: the cap asked for (``None``: :data:`DEFAULT_MAX_CONNECTIONS`, or less
            where the limit is lower).

    Raises:
        ValueError: ``requested`` does not fit under the limit, or no connection does.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS if requested is None else requested
    used = open_files() + RESERVED_FILES
    room = soft - used
    if requested is None and room >= 1:
        return min(DEFAULT_MAX_CONNECTIONS, room)
    if requested is None or requested > room:
        wanted = used + (requested or 1)
        return _no_room(soft, wanted, room, requested)
    return requested


def _no_room(soft: int, wanted: int, room: int, requested: int | None) -> int:
    asked = f"--max-connections {requested}" if requested is not None else "zoo serve"
    lower = f" or lower --max-connections to {room} or less" if room >= 1 else ""
    raise ValueError(
        f"{asked} needs {wanted} open files, but this process may open {soft} "
        f"(ulimit -n): raise the limit (ulimit -n {max(wanted, 4096)}){lower}"
    )


def bounded_protocol(limits: Limits) -> type[BoundedH11Protocol]:
    """The HTTP protocol class for one server (``uvicorn.Config(http=...)``): every
    connection it makes shares ``limits`` and one count of open connections."""
    protocol: type[BoundedH11Protocol] = type("BoundedH11Protocol", (BoundedH11Protocol,), {})
    protocol.shared = _Shared(limits)
    return protocol


class _Shared:
    """One server's connections: how many are open, how many linger after a 503, and which
    wait for a request's headers or body, with since when (oldest first)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open = 0
        self.lingering = 0
        self.waiting: dict[BoundedH11Protocol, float] = {}  # insertion order: oldest first

    def make_room(self, now: float) -> bool:
        """Close the connection that has waited longest for its request, if it has waited
        ``grace`` seconds; ``False`` when none has."""
        for oldest, since in self.waiting.items():
            if now - since < self.limits.grace:
                return False
            oldest.close()
            return True
        return False


#: What a connection waits for: a request's headers, its body, or nothing (its request is
#: complete and the response under way, or it was answered 503).
_HEAD, _BODY, _DONE = "head", "body", "done"


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers and body and a cap
    on open connections (see the module). Made per server by :func:`bounded_protocol`."""

    shared: ClassVar[_Shared]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.shared.limits.keep_alive  # type: ignore[assignment]
        self._phase = _DONE
        self._deadline: asyncio.TimerHandle | None = None
        self._counted = False
        self._refused = False
        self._lingering = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Count the connection; beyond the cap, close the longest-waiting one or refuse."""
        super().connection_made(transport)
        shared = self.shared
        shared.open += 1
        self._counted = True
        if shared.open > shared.limits.max_connections and not shared.make_room(self.loop.time()):
            self._refuse()
        else:
            self._enter(_HEAD)

    def data_received(self, data: bytes) -> None:
        """Parse as uvicorn does (nothing, once refused), then follow the request's state."""
        if self._refused:
            return
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        """The response is sent: the connection waits for the next request's headers (idle
        for up to ``keep_alive`` seconds, then ``header_timeout`` more)."""
        super().on_response_complete()
        self._follow(idle=self.shared.limits.keep_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection, then let uvicorn end its request."""
        self._forget()
        super().connection_lost(exc)

    def close(self) -> None:
        """Close the connection now."""
        self._forget()
        self.transport.close()

    def _follow(self, idle: float = 0.0) -> None:
        if self.transport.is_closing():
            self._forget()
            return
        state = self.conn.their_state
        phase = _HEAD if state is h11.IDLE else _BODY if state is h11.SEND_BODY else _DONE
        if phase != self._phase:
            self._enter(phase, idle)

    def _enter(self, phase: str, idle: float = 0.0) -> None:
        """Wait for ``phase``, its deadline counted from now (plus ``idle`` seconds the
        keep-alive timer bounds); a waiting connection is the newest a full server may
        close."""
        self._cancel()
        self._phase = phase
        waiting = self.shared.waiting
        waiting.pop(self, None)
        if phase == _DONE:
            return
        waiting[self] = self.loop.time()
        limits = self.shared.limits
        seconds = limits.header_timeout + idle if phase == _HEAD else limits.body_timeout
        self._deadline = self.loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        limits = self.shared.limits
        if self._phase == _HEAD and self.conn.trailing_data[0]:  # part of a head came
            self._late("headers", limits.header_timeout, "header")
        elif self._phase == _BODY and self.cycle is not None and not self.cycle.response_started:
            self._late("body", limits.body_timeout, "body")
        self.close()

    def _late(self, what: str, seconds: float, option: str) -> None:
        """408: the request's ``what`` took longer than ``--{option}-timeout``."""
        self._answer(
            408,
            f"the request's {what} took longer than {seconds:g} s to arrive "
            f"(--{option}-timeout); send the whole request at once",
            f"{option}_timeout",
        )

    def _refuse(self) -> None:
        """503, then read and drop what the client sends until it closes, or for ``LINGER``
        seconds (closing a socket with unread bytes resets it, and the client could lose the
        answer); at once when :data:`LINGERING` connections linger already."""
        self._refused = True
        limits, shared = self.shared.limits, self.shared
        self._answer(
            503,
            f"the server holds {limits.max_connections} connections, each with a request in "
            "progress or just opened (--max-connections); retry shortly",
            "too_many_connections",
        )
        if shared.lingering >= LINGERING or not self.transport.can_write_eof():
            self.close()
            return
        self.transport.write_eof()
        shared.lingering += 1
        self._lingering = True
        self._deadline = self.loop.call_later(LINGER, self.close)

    def _answer(self, status: int, message: str, code: str) -> None:
        """Write a whole JSON error response, outside h11 (no request may have been read)."""
        kind = "server_error" if status >= 500 else "invalid_request_error"
        body = json.dumps(error_body(message, type=kind, code=code)).encode()
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        )
        self.transport.write(head.encode("ascii") + body)

    def _forget(self) -> None:
        self._cancel()
        self.shared.waiting.pop(self, None)
        if self._counted:
            self._counted = False
            self.shared.open -= 1
        if self._lingering:
            self._lingering = False
            self.shared.lingering -= 1

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
