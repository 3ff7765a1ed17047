"""``zoo serve``'s bounds on connections: a request's headers and body have deadlines (408),
idle connections close, a connection beyond the cap closes the one that waited longest (or
gets 503 when every one has a request in progress), and the cap stays below the open-file
limit: 1,100 slow connections to a server limited to 1,024 files leave a normal request
answered.

The deadlines and the cap are tested on the server's own uvicorn set-up (``http_server``, the
request guard included) in a thread of this process, around a small app; the file limit on a
real ``zoo serve`` process. No test asserts a wall-clock window (they flaked on a loaded
machine): the deadlines are read as the server set them on its own loop clock, the grace rule
runs on an injected ``now``, and what must happen after a deadline is awaited, not timed."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import resource
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
from serve_events import serve_in_thread
from test_serve import Server

from zoo.cli import main
from zoo.serve import limits as limits_module
from zoo.serve.guard import Guard
from zoo.serve.limits import RESERVED_FILES, Limits, connection_cap, open_files

HEAD = b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # a request's head, less its last line


class Local:
    """The server's uvicorn set-up in a thread, serving ``/ok`` at once and ``/hold`` once
    :meth:`release` is called."""

    def __init__(self, limits: Limits) -> None:
        self.released = threading.Event()
        guarded = Guard(self.app, api_key=None, max_body_bytes=1024)
        self.server, self.port, self.thread = serve_in_thread(guarded, limits, wait=10)

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while scope["path"] == "/hold" and not self.released.is_set():
            await asyncio.sleep(0.01)
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    def counts(self) -> tuple[int, int]:
        """Connections open, and those waiting for a request's headers or body."""
        shared = self.server.config.http_protocol_class.shared  # type: ignore[attr-defined]
        return shared.open, len(shared.waiting)

    def wait_open(self, n: int, waiting: int | None = None) -> None:
        deadline = time.monotonic() + 5
        while (got := self.counts())[0] != n or waiting not in (None, got[1]):
            assert time.monotonic() < deadline, f"{got} connections (open, waiting)"
            time.sleep(0.01)

    def waiting_since(self, sock: socket.socket) -> tuple[float, float]:
        """When the server began waiting for ``sock``'s request, and when its deadline falls,
        both on the server's own loop clock (``loop.time()``)."""
        shared = self.server.config.http_protocol_class.shared  # type: ignore[attr-defined]
        for protocol, since in dict(shared.waiting).items():
            if protocol.client == sock.getsockname()[:2]:
                return since, protocol._deadline.when()
        raise AssertionError(f"the server is not waiting for {sock.getsockname()}")

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def get(self, path: str = "/ok") -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def stop(self) -> None:
        self.released.set()
        self.server.should_exit = True
        self.thread.join(30)


@contextmanager
def local(**limits: Any) -> Iterator[Local]:
    server = Local(Limits(**{"header_timeout": 0.5, "body_timeout": 0.5, **limits}))
    try:
        yield server
    finally:
        server.stop()


def closed_after(sock: socket.socket, limit: float) -> tuple[float, bytes]:
    """Seconds until the server closes ``sock`` (at most ``limit``) and what it sent."""
    start, got = time.monotonic(), b""
    sock.settimeout(limit)
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"still open after {limit} s; received {got!r}") from None
    return time.monotonic() - start, got


def _received(sock: socket.socket) -> bytes:
    """What the server sent on ``sock`` and closed it after; ``b""`` while it is still open."""
    sock.setblocking(False)
    try:
        first = sock.recv(4096)
    except BlockingIOError:
        return b""
    except ConnectionResetError:
        return b"(reset)"
    finally:
        sock.setblocking(True)
    return first + closed_after(sock, 30)[1] if first else b"(closed)"


def answer(sock: socket.socket) -> bytes:
    """A whole response of ``Local``'s app (its body is ``ok``)."""
    got = b""
    while not got.endswith(b"\r\n\r\nok"):
        chunk = sock.recv(4096)
        assert chunk, f"closed after {got!r}"
        got += chunk
    return got


def error(response: bytes) -> dict[str, Any]:
    """The OpenAI-shaped error object of a raw HTTP response."""
    body: dict[str, Any] = json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]
    return body


def test_headers_and_bodies_that_never_end_get_408_and_idle_connections_close():
    with local(keep_alive=2, header_timeout=1) as server, ExitStack() as stack:
        silent, slow, stalled, idle = (stack.enter_context(server.connect()) for _ in range(4))
        slow.sendall(HEAD)
        stalled.sendall(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        idle.sendall(HEAD + b"\r\n")
        assert answer(idle).startswith(b"HTTP/1.1 200")
        # The deadlines as the server set them, on its own clock (no wall-clock window): a
        # head's from the connection's opening, not moved by the header lines that follow; an
        # answered connection's --keep-alive (2 s) plus --header-timeout (1 s).
        server.wait_open(4, waiting=4)
        since, deadline = server.waiting_since(slow)
        assert deadline - since == pytest.approx(1, abs=0.2)
        slow.sendall(b"X-Slow: 1\r\n")
        server.wait_open(4, waiting=4)
        assert server.waiting_since(slow) == (since, deadline), "a header line moved it"
        since, deadline = server.waiting_since(idle)
        assert deadline - since == pytest.approx(3, abs=0.2), "--keep-alive, not the 1 s"
        got = b""
        for _ in range(200):  # a header line every 0.1 s: had each moved the deadline 1 s
            time.sleep(0.1)  # on, the connection would never close
            with contextlib.suppress(OSError):
                slow.sendall(b"X-Slow: 1\r\n")
            if got := _received(slow):
                break
        assert got.startswith(b"HTTP/1.1 408") and error(got)["code"] == "header_timeout", got
        assert _received(idle) == b"", "an idle connection outlives a head's 1 s"
        got = closed_after(stalled, 30)[1]
        assert got.startswith(b"HTTP/1.1 408") and error(got)["code"] == "body_timeout"
        assert "--body-timeout" in error(got)["message"]
        assert closed_after(silent, 30)[1] == b"", "a connection that says nothing: closed"
        assert closed_after(idle, 30)[1] == b"", "an idle keep-alive connection: closed"
        server.wait_open(0)
        assert server.get() == (200, b"ok")


class _Waiting:
    """A connection waiting for its request, as :meth:`_Shared.make_room` sees one."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_make_room_closes_the_oldest_only_past_the_grace():
    """The grace rule on an injected clock (``now``): a burst of connections younger than the
    grace closes none; past it, the oldest goes, one per call."""
    shared = limits_module._Shared(Limits(grace=1.0))
    old, young = _Waiting(), _Waiting()
    shared.waiting.update({old: 10.0, young: 10.5})  # type: ignore[dict-item]
    assert shared.make_room(10.99) is False and not old.closed
    assert shared.make_room(11.0) is True and old.closed and not young.closed
    assert limits_module._Shared(Limits()).make_room(1e9) is False  # none waiting


def test_beyond_the_cap_the_connection_waiting_longest_is_closed_or_503():
    """A burst (no connection has waited the grace, here 30 s) gets 503; with a tiny grace
    (1 µs) every waiting connection has waited it, and the oldest is closed: no sleep, no
    wall-clock window."""
    with local(max_connections=3, header_timeout=30, grace=30) as server, ExitStack() as stack:
        for _ in range(3):
            stack.enter_context(server.connect())
        server.wait_open(3)
        status, body = server.get()
        assert status == 503 and json.loads(body)["error"]["code"] == "too_many_connections"
    with local(max_connections=3, header_timeout=30, grace=1e-6) as server, ExitStack() as stack:
        waiting = [stack.enter_context(server.connect()) for _ in range(3)]
        waiting[1].sendall(HEAD)
        server.wait_open(3)
        assert server.get() == (200, b"ok")  # closes the oldest, the one that said nothing
        assert closed_after(waiting[0], 2)[1] == b""
        waiting.append(stack.enter_context(server.connect()))
        server.wait_open(3)
        assert server.get() == (200, b"ok")  # then the one with half a head
        assert closed_after(waiting[1], 2)[1] == b""
        for sock in waiting[2:]:
            sock.close()
        server.wait_open(0)
        held = []
        for _ in range(3):  # every connection's request in progress
            sock = stack.enter_context(server.connect())
            sock.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(sock)
        server.wait_open(3, waiting=0)
        status, body = server.get()
        assert status == 503 and "--max-connections" in json.loads(body)["error"]["message"]
        server.released.set()
        for sock in held:
            assert answer(sock).startswith(b"HTTP/1.1 200")
            sock.close()
        server.wait_open(0)
        assert server.get() == (200, b"ok")


def test_the_cap_stays_below_the_open_file_limit(monkeypatch):
    monkeypatch.setattr(limits_module.resource, "getrlimit", lambda _: (1024, 4096))
    room = 1024 - RESERVED_FILES - open_files()
    assert 0 < connection_cap() <= room and connection_cap(10) == 10
    with pytest.raises(ValueError, match=r"--max-connections 2000 needs .* \(ulimit -n\)"):
        connection_cap(2000)
    monkeypatch.setattr(limits_module.resource, "getrlimit", lambda _: (200, 4096))
    with pytest.raises(ValueError, match=r"may open 200 .*raise the limit"):
        connection_cap()
    with pytest.raises(ValueError, match="--keep-alive must be a positive number"):
        Limits(keep_alive=0)


@pytest.mark.parametrize("option", ["--header-timeout=nan", "--body-timeout=0",
                                    "--keep-alive=-1", "--max-connections=0"])  # fmt: skip
def test_serve_refuses_limits_that_are_no_limits(option, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "shakespeare-byte", option])
    assert exit_.value.code == 2 and option.split("=")[0] in capsys.readouterr().err


def test_1100_slow_connections_under_a_1024_file_limit_leave_a_request_answered(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open {hard} files; the clients need 1,200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # what the server inherits
    try:
        server = Server(tmp_path, "shakespeare-byte")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))  # the clients'
    try:
        with ExitStack() as stack:
            for _ in range(1100):  # each sends half a head, as a header line every 5 s would
                sock = stack.enter_context(socket.create_connection(("127.0.0.1", server.port)))
                sock.sendall(HEAD)
            time.sleep(1)  # they have been waiting a while (past the grace of 0.5 s)
            # Answered at all is what the file limit threatened (accept failing, the server
            # spinning): the client's timeout catches a hang, no wall-clock window is asserted.
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            connection.request("GET", "/health")
            response = connection.getresponse()
            assert response.status == 200 and json.loads(response.read())["running"] == 0
        assert server.process.poll() is None
        log = server.err.read_text()
        assert "Too many open files" not in log and "Traceback" not in log, log[-2000:]
    finally:
        server.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
