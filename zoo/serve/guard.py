"""What every request passes before it reaches an endpoint: the API key (compared in
constant time) and the body's size (refused before it is parsed). A plain ASGI middleware,
so a refused request costs no parsing and no model time."""

from __future__ import annotations

import hmac
import json
from typing import Any

from .protocol import error_body

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Guard"]

#: The largest request body accepted by default (a long chat fits many times over).
DEFAULT_MAX_BODY_BYTES = 4 * 2**20

Scope = dict[str, Any]
Message = dict[str, Any]


class Guard:
    """ASGI middleware: ``Authorization: Bearer KEY`` when ``api_key`` is set, and bodies of
    at most ``max_body_bytes`` (413 from the ``Content-Length`` header, or as soon as a
    streamed body passes the limit). The body is read here and handed on whole.

    Args:
        app: the ASGI application behind it.
        api_key: the key every request must present, or ``None`` for none.
        max_body_bytes: the largest body accepted.
    """

    def __init__(self, app: Any, *, api_key: str | None, max_body_bytes: int) -> None:
        if api_key is not None and not (api_key.isascii() and api_key.isprintable()):
            raise ValueError(  # the key itself is never repeated in a message
                "the API key must be printable ASCII (it travels in an HTTP header)"
            )
        if api_key is not None and (not api_key or " " in api_key):
            raise ValueError("the API key must be non-empty and hold no spaces")
        self.app = app
        self._key = api_key.encode("ascii") if api_key is not None else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self._key is not None and not self._authorized(headers.get(b"authorization", b"")):
            await _answer(
                send,
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer KEY' with "
                "the key the server was started with (--api-key or ZOO_API_KEY)",
                code="invalid_api_key",
                extra=[(b"www-authenticate", b"Bearer")],
            )
            return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await self._too_large(send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                await self._too_large(send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(bytes(body), receive), send)

    def _authorized(self, header: bytes) -> bool:
        scheme, _, key = header.partition(b" ")
        assert self._key is not None
        # compare_digest takes as long for any key of a given length: no timing oracle
        return scheme.lower() == b"bearer" and hmac.compare_digest(key.strip(), self._key)

    async def _too_large(self, send: Any) -> None:
        await _answer(
            send,
            413,
            f"the request body is larger than {self.max_body_bytes} bytes, the most this "
            "server accepts (--max-body-bytes)",
            code="request_too_large",
        )


def _replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives ``body`` once, then what the client sends next (its
    disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        message: Message = await receive()
        return message

    return replay


async def _answer(
    send: Any,
    status: int,
    message: str,
    *,
    code: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    payload = json.dumps(error_body(message, type="invalid_request_error", code=code)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
