"""The HTTP plumbing of the local Hub: the threaded server, and the request handler's base
(dispatch, auth, JSON bodies, Hub-style errors, access checks, hooks for hostile variants)."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from .storage import HubError, Repo, RequestRecord, chunks

if TYPE_CHECKING:
    from .repos import LocalHub

# Plural URL segment used by the API -> repo type, and the prefix of non-API (resolve, git) URLs.
API_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


class Server(ThreadingHTTPServer):
    """Joins its request threads on close so that no thread outlives :meth:`LocalHub.stop`."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True


class HandlerBase(BaseHTTPRequestHandler):
    """What every answer of the local Hub shares: dispatch, auth, bodies, errors and access
    checks. One request per connection (HTTP/1.0). :class:`~zoo.localhub.routes.Handler`
    adds the routes."""

    hub: LocalHub
    protocol_version = "HTTP/1.0"
    server_version = "LocalHub/1.0"
    timeout = 30  # bounds a stuck client

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- plumbing -------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        self.query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.segments = [unquote(s) for s in url.path.split("/")[1:]]
        self.auth = self._auth_state()
        self.hub.requests.append(
            RequestRecord(method, url.path, self.auth, self.headers.get("Range"))
        )
        try:
            self._before_route()
            if self.auth == "invalid":
                raise HubError(401, INVALID_CREDENTIALS)
            route = self._route(method)
            if route is None:
                raise HubError(404, f"Not found: {method} {url.path}")
            route()
        except HubError as err:
            self._send_error(err, head=method == "HEAD")
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as err:  # a LocalHub bug: answer 500 rather than killing the socket
            with contextlib.suppress(OSError):
                self._send_error(HubError(500, f"LocalHub error: {err!r}"), head=method == "HEAD")

    def _route(self, method: str) -> Callable[[], None] | None:
        """The answer to this request (``None``: 404); the routes define it."""
        raise NotImplementedError

    # -- hooks for hostile variants (tests/hubserver.py) --------------------------------------

    def _before_route(self) -> None:
        """Called before every request is routed; raise :class:`HubError` to answer it."""

    def _adjust_info(self, info: dict[str, Any], blobs: bool) -> dict[str, Any]:
        """The repo-info answer to send (``blobs``: with file metadata)."""
        return info

    def _before_download(self, method: str, filename: str) -> None:
        """Called before a file download is answered; raise :class:`HubError` to refuse it."""

    def _adjust_download_headers(self, filename: str, headers: dict[str, str]) -> None:
        """Change the headers of a file download in place."""

    def _send_file(
        self, repo_type: str, repo_id: str, filename: str, source: Path, start: int, end: int
    ) -> None:
        """Send bytes [start, end) of the blob ``source`` as a download's body."""
        with open(source, "rb") as f:
            f.seek(start)
            for _, chunk in chunks(f, start, end):
                self.wfile.write(chunk)

    def _auth_state(self) -> str:
        header = self.headers.get("Authorization")
        if header is None:
            return "none"
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and secrets.compare_digest(value.strip(), self.hub.token):
            return "valid"
        return "invalid"

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    def _read_json(self) -> Any:
        try:
            return json.loads(self._read_body() or b"{}")
        except ValueError as err:
            raise HubError(400, f"Invalid JSON body: {err}") from err

    def _send_json(
        self,
        status: int,
        payload: Any,
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_error(self, err: HubError, *, head: bool) -> None:
        headers = {"X-Error-Message": err.message, **err.headers}
        if err.code is not None:
            headers["X-Error-Code"] = err.code
        if head:
            self.send_response(err.status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send_json(err.status, {"error": err.message}, headers)

    # -- access control -------------------------------------------------------------------

    def _require_write(self) -> None:
        if self.auth != "valid":
            raise HubError(401, "A valid token is required for this action (Authorization header)")

    def _readable_repo(self, repo_type: str, repo_id: str) -> Repo:
        """The repo if this request may read it; Hub-style 401/404 otherwise (lock held)."""
        if self.hub.require_auth_for_reads and self.auth != "valid":
            raise HubError(401, "A valid token is required (require_auth_for_reads)")
        repo = self.hub._repos.get((repo_type, repo_id))
        if repo is None or (repo.private and self.auth != "valid"):
            status = 404 if self.auth == "valid" else 401
            raise HubError(status, "Repository not found", "RepoNotFound")
        return repo

    def _writable_repo(self, repo_type: str, repo_id: str) -> Repo:
        self._require_write()
        return self._readable_repo(repo_type, repo_id)

    # -- account and repo management ------------------------------------------------------
