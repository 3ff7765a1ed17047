"""The HTTP application of ``zoo serve``: OpenAI's ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` (streamed as server-sent events with ``stream: true``), plus
``/health`` and Prometheus's ``/metrics`` (:mod:`zoo.serve.metrics`), on FastAPI.

Each request is checked in full before any model time is spent (the model's name, the
fields, the prompt against the context: :class:`~zoo.serve.served.Served`), in a thread of a
bounded pool rather than on the event loop, so that no request's parsing, rendering or
tokenizing holds up the others (:mod:`zoo.serve.prepare`); then its prompts join the
:class:`Engine`'s running batch. Every error is JSON in OpenAI's shape with a 4xx status for
the client's mistakes; the server goes on serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from ..tokenizers import Tokenizer
from .engine import Engine
from .guard import CLIENT, DEFAULT_MAX_BODY_BYTES, Guard
from .prepare import PREPARE_THREADS, Offload
from .protocol import ApiError, error_body
from .request import Finish
from .runs import Run
from .served import Served

__all__ = ["Served", "create_app"]

#: How a sequence ends well: an end-of-text id or a stop string, or max_tokens.
_DONE = ("stop", "length")


def create_app(
    engine: Engine,
    tokenizer: Tokenizer,
    *,
    model_id: str,
    api_key: str | None = None,
    api_keys: Sequence[str] = (),
    shared_prefix_cache: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    prepare_threads: int = PREPARE_THREADS,
) -> Guard:
    """The ASGI application serving ``engine``'s model under the name ``model_id``.

    Args:
        engine: the running :class:`Engine`.
        tokenizer: the model's tokenizer (text in, text out, its chat template).
        model_id: the name clients give as ``model``.
        api_key, api_keys: when any is set, every request needs
            ``Authorization: Bearer KEY`` with one of them; each key is a client of its own,
            whose prompts no other key's requests reuse from the prefix cache.
        shared_prefix_cache: let requests of different keys share the prefix cache (a
            request's ``cache_salt`` still keeps it apart).
        max_body_bytes: larger request bodies are refused (413) before they are parsed.
        prepare_threads: requests parsed, rendered and tokenized at once, in threads off the
            event loop (:mod:`zoo.serve.prepare`).
    """
    served = Served(engine, tokenizer, model_id, shared_prefix_cache=shared_prefix_cache)
    offload = Offload(prepare_threads)
    app = FastAPI(title="zoo serve", docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        stats = engine.prefix_cache_stats()
        return {
            "status": "ok",
            "model": model_id,
            "running": engine.running,
            "waiting": engine.waiting,
            "max_batch": engine.max_batch,
            "max_queue": engine.max_queue,
            "prefix_cache": None if stats is None else dataclasses.asdict(stats),
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(served.metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [served.card(name) for name in served.models]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        if name not in served.models:
            raise ApiError(404, f"the model {name!r} does not exist", code="model_not_found")
        return served.card(name)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        prepared = await offload(served.prepare_completion, *await _body(request))
        run = served.run(prepared, request.scope.get(CLIENT, b""))
        served.submit(run)
        body = prepared.body
        head = _head("cmpl", "text_completion", body.model)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return _EventStream(_completion_chunks(run, head, usage), run)
        texts, finishes = await _collect(run, request)
        choices = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": finish.reason}
            for i, (text, finish) in enumerate(zip(texts, finishes, strict=True))
        ]
        return JSONResponse({**head, "choices": choices, "usage": _usage(finishes)})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        prepared = await offload(served.prepare_chat, *await _body(request))
        run = served.run(prepared, request.scope.get(CLIENT, b""))
        served.submit(run)
        body = prepared.body
        head = _head("chatcmpl", "chat.completion", body.model)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            chunk_head = {**head, "object": "chat.completion.chunk"}
            return _EventStream(_chat_chunks(run, chunk_head, usage), run)
        texts, finishes = await _collect(run, request)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": texts[0]},
            "logprobs": None,
            "finish_reason": finishes[0].reason,
        }
        return JSONResponse({**head, "choices": [choice], "usage": _usage(finishes)})

    return Guard(app, api_key=api_key, api_keys=api_keys, max_body_bytes=max_body_bytes)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's JSON: a field of the wrong type or out of range is a 400
    naming the field, an unknown path a 404, an unexpected failure a 500."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            at = first.get("loc", ("body", "?"))[-1]
            message = f"the request body is not valid JSON (at character {at}: {first['msg']})"
            return JSONResponse(error_body(message, type="invalid_request_error"), status_code=400)
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem(s))"
        body = error_body(message, type="invalid_request_error", param=where or None)
        return JSONResponse(body, status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        body = error_body(
            f"{request.method} {request.url.path}: {exc.detail}", type="invalid_request_error"
        )
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def failure(request: Request, exc: Exception) -> JSONResponse:
        body = error_body(f"internal error: {type(exc).__name__}: {exc}", type="server_error")
        return JSONResponse(body, status_code=500)


async def _body(request: Request) -> tuple[bytes, str | None]:
    """The request's body (read whole by the guard) and its ``Content-Type``."""
    return await request.body(), request.headers.get("content-type")


def _head(prefix: str, kind: str, model_id: str) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model_id,
    }


def _usage(finishes: Sequence[Finish]) -> dict[str, int]:
    prompt = sum(f.prompt_tokens for f in finishes)
    completion = sum(f.completion_tokens for f in finishes)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


async def _until_disconnect(request: Request, run: Run) -> None:
    """Wait for the client to go away, then drop its sequences (their slots free up)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    run.cancel()


async def _collect(run: Run, request: Request) -> tuple[list[str], list[Finish]]:
    """Every sequence's whole text and finish; the sequences are dropped if the client
    disconnects first. An engine failure is a 500."""
    texts: list[list[str]] = [[] for _ in run.sequences]
    finishes: list[Finish | None] = [None] * len(run.sequences)
    watch = asyncio.create_task(_until_disconnect(request, run))
    try:
        async for index, event in run.events():
            if isinstance(event, Finish):
                finishes[index] = event
            else:
                texts[index].append(event)
    finally:
        watch.cancel()
        run.cancel()
    failed = next((f for f in finishes if f is not None and f.reason not in _DONE), None)
    if failed is not None:
        raise ApiError(500, failed.error or f"generation {failed.reason}", type="server_error")
    return ["".join(t) for t in texts], [f for f in finishes if f is not None]


class _EventStream(StreamingResponse):
    """Server-sent events of JSON chunks ending in ``data: [DONE]``; whatever ends the
    response (the last chunk, a client gone) drops the run's sequences still decoding."""

    def __init__(self, chunks: AsyncIterator[dict[str, Any]], run: Run) -> None:
        super().__init__(
            _sse(chunks),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
        self._run = run

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._run.cancel()


async def _sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def _failure(event: Finish) -> dict[str, Any]:
    return error_body(event.error or f"generation {event.reason}", type="server_error")


async def _completion_chunks(
    run: Run, head: dict[str, Any], include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    finishes = []
    async for index, event in run.events():
        if isinstance(event, str):
            choice = {"index": index, "text": event, "logprobs": None, "finish_reason": None}
        elif event.reason in _DONE:
            finishes.append(event)
            choice = {"index": index, "text": "", "logprobs": None, "finish_reason": event.reason}
        else:
            yield _failure(event)
            return
        yield {**head, "choices": [choice]}
    if include_usage:
        yield {**head, "choices": [], "usage": _usage(finishes)}


async def _chat_chunks(
    run: Run, head: dict[str, Any], include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice]}

    yield chunk({"role": "assistant", "content": ""})
    finishes = []
    async for _, event in run.events():
        if isinstance(event, str):
            yield chunk({"content": event})
        elif event.reason in _DONE:
            finishes.append(event)
            yield chunk({}, event.reason)
        else:
            yield _failure(event)
            return
    if include_usage:
        yield {**head, "choices": [], "usage": _usage(finishes)}
