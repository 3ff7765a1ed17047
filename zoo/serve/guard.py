"""What every request passes before it reaches an endpoint: the API key (one of the server's
keys, compared in constant time) and the body's size (refused before it is parsed). A plain
ASGI middleware, so a refused request costs no parsing and no model time. The key a request
presented is known to the application behind it only as a digest, :data:`CLIENT` in the
request's scope: what keeps one client's prompts apart from another's in the prefix cache."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from typing import Any

from .protocol import error_body

__all__ = ["CLIENT", "DEFAULT_MAX_BODY_BYTES", "Guard"]

#: The scope key of the client's identity: a digest of the API key it presented (``b""``
#: when the server has no keys).
CLIENT = "zoo.client"

#: The largest request body accepted by default (a long chat fits many times over).
DEFAULT_MAX_BODY_BYTES = 4 * 2**20

Scope = dict[str, Any]
Message = dict[str, Any]


class Guard:
    """ASGI middleware: ``Authorization: Bearer KEY`` with one of ``api_keys`` when there are
    any, and bodies of at most ``max_body_bytes`` (413 from the ``Content-Length`` header, or
    as soon as a streamed body passes the limit). The body is read here and handed on whole,
    with the client's identity (:data:`CLIENT`) in the scope.

    Args:
        app: the ASGI application behind it.
        api_key: a key requests may present, or ``None``.
        api_keys: more keys (each client its own, so that each is a tenant of its own).
        max_body_bytes: the largest body accepted.
    """

    def __init__(
        self,
        app: Any,
        *,
        api_key: str | None = None,
        api_keys: Sequence[str] = (),
        max_body_bytes: int,
    ) -> None:
        keys = [*([] if api_key is None else [api_key]), *api_keys]
        for i, key in enumerate(keys):
            _check_key(key, f"API key {i + 1}" if len(keys) > 1 else "the API key")
        if len(set(keys)) < len(keys):
            raise ValueError(
                "an API key is given twice: give each client a key of its own (keys tell the "
                "clients apart, e.g. in the prefix cache)"
            )
        self.app = app
        self._keys = [key.encode("ascii") for key in keys]
        self.max_body_bytes = max_body_bytes

    @property
    def keys(self) -> int:
        """How many API keys the server takes (0: none is needed)."""
        return len(self._keys)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        client = self._client(headers.get(b"authorization", b""))
        if client is None:
            await _answer(
                send,
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer KEY' with "
                "a key the server was started with (--api-key, --api-key-file or ZOO_API_KEY)",
                code="invalid_api_key",
                extra=[(b"www-authenticate", b"Bearer")],
            )
            return
        scope[CLIENT] = client
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

    def _client(self, header: bytes) -> bytes | None:
        """The identity of the key ``header`` presents (``b""`` when the server has none), or
        ``None`` for a missing or wrong key."""
        if not self._keys:
            return b""
        scheme, _, given = header.partition(b" ")
        given = given.strip()
        # every key is compared, each with compare_digest: the time tells nothing of the key
        matches = [hmac.compare_digest(given, key) for key in self._keys]
        if scheme.lower() != b"bearer" or not any(matches):
            return None
        key = self._keys[matches.index(True)]
        return hashlib.blake2b(key, digest_size=16, person=b"zoo-serve-key").digest()

    async def _too_large(self, send: Any) -> None:
        await _answer(
            send,
            413,
            f"the request body is larger than {self.max_body_bytes} bytes, the most this "
            "server accepts (--max-body-bytes)",
            code="request_too_large",
        )


def _check_key(key: str, what: str) -> None:
    """A key travels in an HTTP header: printable ASCII, non-empty, no spaces (the key itself
    is never repeated in a message)."""
    if not (key.isascii() and key.isprintable()):
        raise ValueError(f"{what} must be printable ASCII (it travels in an HTTP header)")
    if not key or " " in key:
        raise ValueError(f"{what} must be non-empty and hold no spaces")


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
