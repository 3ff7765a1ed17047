"""The HTTP application of ``zoo serve``: OpenAI's ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` (streamed as server-sent events with ``stream: true``), plus
``/health`` and Prometheus's ``/metrics`` (:mod:`zoo.serve.metrics`), on FastAPI.

Each request is checked in full before any model time is spent (the model's name, the
fields, the prompt against the context), then its prompts join the :class:`Engine`'s running
batch. Every error is JSON in OpenAI's shape with a 4xx status for the client's mistakes; the
server goes on serving.
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

from ..generation import GenerationConfig
from ..tokenizers import Tokenizer
from .chat import ChatTemplates
from .engine import Engine
from .guard import DEFAULT_MAX_BODY_BYTES, Guard
from .metrics import Metrics
from .protocol import ApiError, ChatRequest, CompletionRequest, Prompt, _Sampling, error_body
from .request import Finish
from .runs import Run
from .scheduler import EngineStopped, QueueFull

__all__ = ["Served", "create_app"]

#: How a sequence ends well: an end-of-text id or a stop string, or max_tokens.
_DONE = ("stop", "length")


class Served:
    """What the endpoints serve: the engine, the tokenizer, the model's name (and each of
    the engine's LoRA adapters, a model of its own name) and its chat template, with the
    checks every request goes through."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, model_id: str) -> None:
        if model_id in engine.adapter_ids:
            raise ValueError(f"an adapter is named {model_id!r}, as the base model is")
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_id = model_id
        #: Every model name a request may give, with the adapter it applies (0: none).
        self.models = {model_id: 0, **engine.adapter_ids}
        self.created = int(time.time())
        self.chat = ChatTemplates(tokenizer)
        self.vocab_size: int = engine.model.config.vocab_size
        #: What ``/metrics`` reports: this application's own registry.
        self.metrics = Metrics(engine, self.models)

    def card(self, name: str) -> dict[str, Any]:
        """A model as ``/v1/models`` lists it (an adapter names its base as ``parent``)."""
        card = {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "zoo",
            "max_model_len": self.engine.max_len,
        }
        return card if name == self.model_id else {**card, "parent": self.model_id}

    def adapter(self, name: str) -> int:
        """The adapter a model name applies (0: the base); 404 for a name not served."""
        if name not in self.models:
            served = ", ".join(repr(m) for m in self.models)
            raise ApiError(
                404,
                f"the model {name!r} does not exist: this server serves {served} "
                f"(GET /v1/models lists {'them' if len(self.models) > 1 else 'it'})",
                code="model_not_found",
                param="model",
            )
        return self.models[name]

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        body: _Sampling,
        max_tokens: int,
        end_ids: Sequence[int],
    ) -> Run:
        """A request's sequences, counted under its model's name; checked (:meth:`check`)."""
        adapter = self.models[body.model]
        observer = self.metrics.model(body.model)
        return Run(
            prompts, self.config(body, max_tokens), self.tokenizer, end_ids, adapter, observer
        )

    def check(self, body: _Sampling) -> int:
        """The model's name and the fields the server cannot honour; returns the adapter
        the model name applies."""
        adapter = self.adapter(body.model)
        unsupported = body.unsupported()
        if unsupported:
            raise ApiError(
                400,
                f"zoo serve does not support {', '.join(unsupported)}; leave them out",
                code="unsupported_parameter",
                param=unsupported[0].split()[0],
            )
        return adapter

    def config(self, body: _Sampling, max_tokens: int) -> GenerationConfig:
        """The generation settings of a request (a 400 for values out of range)."""
        try:
            return GenerationConfig(
                max_new_tokens=max_tokens,
                temperature=1.0 if body.temperature is None else body.temperature,
                top_k=body.top_k,
                top_p=body.top_p,
                seed=body.seed,
                stop=body.stops(),
                eos_id=self.tokenizer.eos_id,
                vocab_limit=self.tokenizer.vocab_size,
            )
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

    def encode(self, text: str, what: str = "prompt") -> list[int]:
        """A text prompt's ids (a 400 for text that is not Unicode)."""
        try:
            return self.tokenizer.encode(text)
        except ValueError as exc:
            raise ApiError(400, f"{what}: {exc}", param="prompt") from None

    def check_prompt(self, ids: Sequence[int], max_tokens: int, what: str = "the prompt") -> None:
        """Ids in the vocabulary, at least one, and room for ``max_tokens`` after them."""
        if not ids:
            raise ApiError(400, f"{what} is empty; give at least one token", param="prompt")
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ApiError(
                400,
                f"{what} holds token id {bad}, outside the vocabulary [0, {self.vocab_size})",
                param="prompt",
            )
        limit = self.engine.max_len
        if len(ids) + max_tokens > limit:
            raise ApiError(
                400,
                f"this model's maximum context length is {limit} tokens; {what} has "
                f"{len(ids)} and max_tokens asks for {max_tokens} more ({len(ids) + max_tokens})."
                " Shorten the prompt or lower max_tokens",
                code="context_length_exceeded",
                param="max_tokens",
            )

    def submit(self, run: Run) -> None:
        """Hand a request's sequences to the engine (429 when it is full)."""
        capacity = self.engine.capacity
        if len(run.sequences) > capacity:
            raise ApiError(
                400,
                f"{len(run.sequences)} prompts in one request; this server takes at most "
                f"{capacity} (--max-batch plus --max-queue)",
                param="prompt",
            )
        try:
            run.submit(self.engine)
        except QueueFull as exc:
            raise ApiError(429, str(exc), type="rate_limit_error", code="server_busy") from None
        except EngineStopped as exc:
            raise ApiError(503, str(exc), type="server_error", code="shutting_down") from None


def create_app(
    engine: Engine,
    tokenizer: Tokenizer,
    *,
    model_id: str,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Guard:
    """The ASGI application serving ``engine``'s model under the name ``model_id``.

    Args:
        engine: the running :class:`Engine`.
        tokenizer: the model's tokenizer (text in, text out, its chat template).
        model_id: the name clients give as ``model``.
        api_key: when set, every request needs ``Authorization: Bearer <api_key>``.
        max_body_bytes: larger request bodies are refused (413) before they are parsed.
    """
    served = Served(engine, tokenizer, model_id)
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
    async def completions(body: CompletionRequest, request: Request) -> Response:
        served.check(body)
        max_tokens = body.max_tokens or 16
        prompts = _prompts(served, body.prompt)
        for i, ids in enumerate(prompts):
            served.check_prompt(
                ids, max_tokens, f"prompt {i}" if len(prompts) > 1 else "the prompt"
            )
        run = served.run(prompts, body, max_tokens, _end_ids(tokenizer))
        served.submit(run)
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
    async def chat(body: ChatRequest, request: Request) -> Response:
        served.check(body)
        prompt, end_ids = served.chat.prompt([m.plain() for m in body.messages])
        max_tokens = body.max_completion_tokens or body.max_tokens
        if max_tokens is None:  # as OpenAI: up to the end of the context
            max_tokens = max(1, engine.max_len - len(prompt))
        served.check_prompt(prompt, max_tokens, "the conversation")
        run = served.run([prompt], body, max_tokens, end_ids)
        served.submit(run)
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

    return Guard(app, api_key=api_key, max_body_bytes=max_body_bytes)


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


def _prompts(served: Served, prompt: Prompt) -> list[list[int]]:
    """A completion prompt as id lists: text encoded, ids as given."""
    if isinstance(prompt, str):
        return [served.encode(prompt)]
    if not prompt:
        raise ApiError(400, "prompt is an empty list; give text or token ids", param="prompt")
    ids = [item for item in prompt if isinstance(item, int)]
    if len(ids) == len(prompt):  # a list of ids: one prompt
        return [ids]
    rows = []
    for i, item in enumerate(prompt):
        if isinstance(item, str):
            rows.append(served.encode(item, f"prompt {i}"))
        else:
            rows.append(list(item))  # type: ignore[call-overload]
    return rows


def _end_ids(tokenizer: Tokenizer) -> list[int]:
    """The ids that end a completion: end-of-text, and an instruct model's end-of-turn."""
    return list(tokenizer.end_ids)


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
