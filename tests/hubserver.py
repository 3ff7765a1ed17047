"""The hostile variants of zoo's local Hub (:mod:`zoo.localhub`), for tests.

:class:`LocalHub` is :class:`zoo.localhub.LocalHub` (one server implementation: the one
``python -m zoo.localhub`` serves) plus fault injection, switched on per test:

* :attr:`LocalHub.outage_status`: every request answered with that status (a Hub outage);
  :meth:`LocalHub.stop` is the Hub being down;
* :meth:`LocalHub.drop_connection`, :meth:`LocalHub.corrupt_file`: downloads of a file cut at a
  byte, or served with a byte flipped;
* hostile answers (``download_headers``, ``info_override``, ``info_status``, ``trickle``,
  ``throttle`` with ``retry_after``, ``api_trickle``, ``unsized``, ``endless``,
  ``redirect_loop``, ``api_body``), described on the class.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.localhub import DEFAULT_GITATTRIBUTES, FileEntry, HubError, RequestRecord
from zoo.localhub import LocalHub as _WellBehavedHub
from zoo.localhub.routes import Handler
from zoo.localhub.storage import chunks

__all__ = ["DEFAULT_GITATTRIBUTES", "FileEntry", "HubError", "LocalHub", "RequestRecord"]


@dataclass
class _Fault:
    """A pending fault on downloads of one file; ``remaining=None`` means every time."""

    kind: str  # "drop" or "corrupt"
    at_byte: int
    remaining: int | None


class _HostileHandler(Handler):
    """:class:`zoo.localhub.routes.Handler` with the faults of :class:`LocalHub` applied."""

    hub: LocalHub

    def _before_route(self) -> None:
        if self.hub.outage_status is not None:
            raise HubError(self.hub.outage_status, "The Hub is unavailable (simulated outage)")
        if self.hub.redirect_loop is not None and self.hub.redirect_loop in self.path:
            raise HubError(302, "Found", headers={"Location": self.path})

    def _adjust_info(self, info: dict[str, Any], blobs: bool) -> dict[str, Any]:
        if blobs and self.hub.info_status is not None:
            raise HubError(self.hub.info_status, "file metadata unavailable (simulated)")
        info.update(self.hub.info_override)
        return info

    def _before_download(self, method: str, filename: str) -> None:
        if method == "GET" and self.hub.throttle > 0:
            self.hub.throttle -= 1
            raise HubError(429, "Too Many Requests", headers={"Retry-After": self.hub.retry_after})

    def _adjust_download_headers(self, filename: str, headers: dict[str, str]) -> None:
        headers.update(self.hub.download_headers.get(filename, {}))
        if filename in self.hub.unsized:
            headers.pop("Content-Length", None)
            headers.pop("X-Linked-Size", None)
        if filename in self.hub.endless:  # a chunked body (HTTP/1.1), with no end
            headers.pop("Content-Length", None)
            headers["Transfer-Encoding"] = "chunked"
            self.protocol_version = "HTTP/1.1"

    def _send_file(
        self, repo_type: str, repo_id: str, filename: str, source: Path, start: int, end: int
    ) -> None:
        fault = self.hub._take_fault(repo_type, repo_id, filename)
        if filename in self.hub.endless:
            self._endless(source, start, end)
            return
        if self.hub.trickle is not None:
            self._trickle(source, start, end)
            return
        self._stream(source, start, end, fault)

    def _send_json(
        self,
        status: int,
        payload: Any,
        headers: Any = None,
        content_type: str = "application/json",
    ) -> None:
        if self.hub.api_body is not None:
            self._drip(status, self.hub.api_body, content_type, headers or {})
            return
        if self.hub.api_trickle is None:
            super()._send_json(status, payload, headers, content_type)
            return

        body = json.dumps(payload).encode()
        self._drip(status, body, content_type, headers or {})

    def _drip(self, status: int, body: bytes, content_type: str, headers: Any) -> None:
        """Send a whole JSON answer, status line and headers included, one byte at a time,
        ``hub.api_trickle`` seconds apart, until the client leaves (at once without it)."""
        head = f"HTTP/1.0 {status} OK\r\nContent-Type: {content_type}\r\n"
        head += f"Content-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        if self.hub.api_trickle is None:
            self.wfile.write(head.encode() + body)
            self.close_connection = True
            return
        try:
            for byte in head.encode() + body:
                time.sleep(self.hub.api_trickle or 0)
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
        except OSError:
            pass
        else:
            self.hub.api_dripped += 1
        self.close_connection = True

    def _endless(self, source: Path, start: int, end: int) -> None:
        """Send bytes [start, end) of the blob as HTTP chunks, then zero bytes in 64 KiB
        chunks, with no last chunk, until the client leaves."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            with open(source, "rb") as f:
                f.seek(start)
                for _, chunk in chunks(f, start, end):
                    self._chunk(chunk)
            while True:
                self._chunk(bytes(1 << 16))
                self.hub.endless_sent += 1 << 16

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _trickle(self, source: Path, start: int, end: int) -> None:
        """Send one byte at a time, ``hub.trickle`` seconds apart, until the client leaves."""
        with open(source, "rb") as f:
            f.seek(start)
            for _ in range(start, end):
                time.sleep(self.hub.trickle or 0)
                self.wfile.write(f.read(1))
                self.wfile.flush()

    def _stream(self, source: Path, start: int, end: int, fault: _Fault | None) -> None:
        """Send bytes [start, end) of a blob, applying a drop or corruption fault."""
        stop = end
        if fault is not None and fault.kind == "drop":
            stop = min(end, max(start, fault.at_byte))
        with open(source, "rb") as f:
            f.seek(start)
            for offset, chunk in chunks(f, start, stop):
                if fault is not None and fault.kind == "corrupt":
                    chunk = _flip_byte(chunk, fault.at_byte - offset)
                self.wfile.write(chunk)
        if stop < end:  # simulate the connection dying mid-body
            self.wfile.flush()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)


class LocalHub(_WellBehavedHub):
    """:class:`zoo.localhub.LocalHub` with fault injection (same arguments)."""

    handler_class = _HostileHandler

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: When set (e.g. 503), every request is answered with this status: a Hub outage.
        self.outage_status: int | None = None
        #: Hostile answers, for security tests. ``download_headers``: headers that replace the
        #: real ones on downloads of a file (``{"ETag": '"../../x.pth"'}``); ``info_override``:
        #: fields that replace those of every repo-info answer (``{"sha": "../../x"}``);
        #: ``info_status``: a status every repo-info call with ``blobs`` (file metadata) gets;
        #: ``trickle``: seconds to wait before each byte of a download; ``throttle``: how many
        #: more downloads get ``429 Too Many Requests`` (with ``Retry-After: <retry_after>``);
        #: ``api_trickle``: seconds to wait before each byte of every JSON API answer (headers
        #: first); ``unsized``: files sent with no ``Content-Length`` (nor ``X-Linked-Size``),
        #: their end marked only by closing the connection; ``endless``: files sent as a chunked
        #: body with no ``Content-Length`` (``X-Linked-Size`` and the ETag stay true) that goes
        #: on with zero bytes after the file's own and never ends (``endless_sent`` counts
        #: those bytes); ``redirect_loop``: requests whose path holds this text are answered
        #: ``302`` to themselves, forever; ``api_body``: the bytes every JSON API answer sends
        #: in place of its JSON; ``api_dripped`` counts the dripped answers sent to their end.
        self.download_headers: dict[str, dict[str, str]] = {}
        self.info_override: dict[str, Any] = {}
        self.info_status: int | None = None
        self.trickle: float | None = None
        self.throttle = 0
        self.retry_after = "0"
        self.api_trickle: float | None = None
        self.unsized: set[str] = set()
        self.endless: set[str] = set()
        self.endless_sent = 0
        self.redirect_loop: str | None = None
        self.api_body: bytes | None = None
        self.api_dripped = 0
        self._faults: dict[tuple[str, str, str], _Fault] = {}

    def drop_connection(
        self,
        repo_id: str,
        path: str,
        *,
        at_byte: int,
        times: int | None = 1,
        repo_type: str = "model",
    ) -> None:
        """Cut GET downloads of ``path`` at file offset ``at_byte``: headers (with the full
        ``Content-Length``) and the bytes before that offset are sent, then the socket closes.

        ``times=1`` lets the client's resume (``Range`` request) succeed afterwards;
        ``times=None`` cuts every attempt, so resumes make no progress and the client gives up.
        """
        self._add_fault(repo_type, repo_id, path, _Fault("drop", at_byte, times))

    def corrupt_file(
        self,
        repo_id: str,
        path: str,
        *,
        times: int | None = None,
        at_byte: int | None = None,
        repo_type: str = "model",
    ) -> None:
        """Serve ``path`` with one byte flipped (default: the middle one), headers unchanged,
        so only a checksum against the ETag / LFS sha256 can tell."""
        size = self.file_entry(repo_id, path, repo_type=repo_type).size
        offset = size // 2 if at_byte is None else at_byte
        self._add_fault(repo_type, repo_id, path, _Fault("corrupt", offset, times))

    def clear_faults(self) -> None:
        """Remove every pending fault and end any outage."""
        with self._lock:
            self._faults.clear()
        self.outage_status = None
        self.download_headers.clear()
        self.info_override.clear()
        self.info_status = None
        self.trickle = None
        self.throttle = 0
        self.retry_after = "0"
        self.api_trickle = None
        self.unsized.clear()
        self.endless.clear()
        self.endless_sent = 0
        self.redirect_loop = None
        self.api_body = None
        self.api_dripped = 0

    def _add_fault(self, repo_type: str, repo_id: str, path: str, fault: _Fault) -> None:
        with self._lock:
            self._faults[(repo_type, repo_id, path)] = fault

    def _take_fault(self, repo_type: str, repo_id: str, path: str) -> _Fault | None:
        """The fault to apply to this download, if any (consuming one use)."""
        key = (repo_type, repo_id, path)
        with self._lock:
            fault = self._faults.get(key)
            if fault is None:
                return None
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    del self._faults[key]
            return fault


def _flip_byte(chunk: bytes, index: int) -> bytes:
    """``chunk`` with the byte at ``index`` inverted (unchanged if out of range)."""
    if not 0 <= index < len(chunk):
        return chunk
    return chunk[:index] + bytes([chunk[index] ^ 0xFF]) + chunk[index + 1 :]
