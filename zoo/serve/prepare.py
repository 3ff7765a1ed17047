"""A request's work before the engine, kept off the event loop and bounded before it is spent.

Parsing a body of up to ``--max-body-bytes``, rendering a conversation through a chat template
and tokenizing the result are CPU work that takes seconds for a hostile request: on the event
loop it would hold every other client (``/health`` included) for as long. So each request's
preparation runs in a pool of :data:`PREPARE_THREADS` threads (:class:`Offload`: a flood of
requests waits for a thread instead of starting one each), and its work is bounded by the
model's context before it is done:

- a conversation of more messages than the context has positions is refused before it is
  validated or rendered (:func:`conversation`; each message takes at least one token in every
  chat template), and its messages are validated :data:`VALIDATE_AT_ONCE` at a time;
- a completion's prompt of ids is counted before it is validated, and its lists validated one
  at a time (:func:`completion_prompt`);
- a body nests at most :data:`zoo.jsonfile.MAX_DEPTH` levels (:func:`check_depth`);
- a prompt's tokens are counted piece by piece and counting stops as soon as they exceed what
  the context leaves (:func:`encode_within`), instead of tokenizing all of a text that cannot
  fit.

A single call into C code (the JSON parser, one validation, one encode) holds the interpreter
lock, and so the event loop, for as long as it runs: hence the parts of bounded size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from .. import jsonfile
from .protocol import ApiError, ChatMessage

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer

__all__ = [
    "COUNT_CHARS",
    "PREPARE_THREADS",
    "VALIDATE_AT_ONCE",
    "Offload",
    "Parts",
    "PromptTooLong",
    "check_depth",
    "completion_prompt",
    "conversation",
    "encode_within",
    "parse_body",
]

#: Threads that prepare requests (parse, render, tokenize) at once; more requests wait.
PREPARE_THREADS = 2
#: Characters of a rendered conversation tokenized at once while its tokens are counted.
COUNT_CHARS = 1 << 14
#: Messages of a conversation validated in one call (the event loop may run between two).
VALIDATE_AT_ONCE = 256

_MESSAGES = TypeAdapter(list[ChatMessage])
_IDS = TypeAdapter(list[int], config=ConfigDict(strict=True))

#: A request's JSON object to validate, and the fields validated already (set after).
Parts = tuple[dict[str, Any], dict[str, Any]]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class Offload:
    """Runs a request's preparation in a thread of a pool of ``threads`` (shared by every
    request of one application), so the event loop goes on answering meanwhile."""

    def __init__(self, threads: int = PREPARE_THREADS) -> None:
        if threads < 1:
            raise ValueError(f"a preparation pool needs at least 1 thread, got {threads}")
        self.threads = threads
        self._limiter = anyio.CapacityLimiter(threads)

    async def __call__(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in a thread of the pool (waiting for one to be free)."""
        return await anyio.to_thread.run_sync(function, *args, limiter=self._limiter)


def parse_body(
    body: bytes,
    content_type: str | None,
    model: type[M],
    *,
    parts: Callable[[dict[str, Any]], Parts] | None = None,
) -> M:
    """A request body as ``model``, refused as FastAPI refuses it (a 400 naming the field).

    Args:
        body: the body's bytes (at most ``--max-body-bytes``: the guard read it).
        content_type: its ``Content-Type`` header (``None``: none sent, read as JSON).
        model: the request's pydantic model.
        parts: counts the long fields of a JSON object (before anything else: a body they
            refuse costs no more), checks its depth (:func:`check_depth`) and validates them
            a part at a time (:func:`conversation`, :func:`completion_prompt`).
    """
    data = _json(body, content_type)
    try:
        if parts is not None and isinstance(data, dict):
            data, validated = parts(data)
        else:
            check_depth(data)
            validated = {}
        request = model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc) from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None
    for name, value in validated.items():  # validated already: set as they are
        setattr(request, name, value)
    return request


def _json(body: bytes, content_type: str | None) -> Any:
    """The JSON value of a request body (a 400 for one that is not JSON)."""
    if content_type is not None and not _is_json(content_type):
        raise ApiError(
            400,
            f"the request body must be JSON (Content-Type: application/json), got "
            f"Content-Type {content_type[:100]!r}",
        )
    if not body:
        raise ApiError(400, "the request body is empty; send a JSON object")
    try:  # the depth is bounded by jsonfile.MAX_DEPTH after the count checks (check_depth)
        return json.loads(body)
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
                 "input": {}, "ctx": {"error": exc.msg}}  # fmt: skip
        raise RequestValidationError([error]) from None
    except (RecursionError, UnicodeDecodeError) as exc:
        why = "is not UTF-8" if isinstance(exc, UnicodeDecodeError) else "is nested too deeply"
        raise ApiError(400, f"the request body {why} to be read as JSON") from None


def check_depth(value: Any, limit: int = jsonfile.MAX_DEPTH) -> None:
    """A 400 when ``value``'s lists and dicts nest more than ``limit`` levels: the bound of
    :func:`zoo.jsonfile.loads`, counted on the parsed value without recursion, in Python
    steps (the event loop may run between two) rather than over the text in one long call."""
    if not isinstance(value, (dict, list)):
        return
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > limit:
            raise ApiError(
                400,
                f"the request body nests more than {limit} levels of arrays and objects (a "
                "request nests a few); it was not read",
            )
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, level + 1) for c in children if isinstance(c, (dict, list)))


def _invalid(exc: ValidationError, *at: str | int) -> RequestValidationError:
    """pydantic's errors as FastAPI reports a body's, each ``loc`` under ``body`` (and
    ``at``)."""
    errors = exc.errors(include_url=False)
    return RequestValidationError([{**e, "loc": ("body", *at, *e["loc"])} for e in errors])


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def conversation(max_messages: int) -> Callable[[dict[str, Any]], Parts]:
    """The ``parts`` of a chat request: its ``messages`` counted (at most ``max_messages``,
    before anything is validated) and validated :data:`VALIDATE_AT_ONCE` at a time."""

    def parts(data: dict[str, Any]) -> Parts:
        messages = data.get("messages")
        if isinstance(messages, list) and len(messages) > max_messages:
            raise ApiError(
                400,
                f"the conversation has {len(messages)} messages; this server takes at most "
                f"{max_messages}, the positions of its context (--max-model-len), since every "
                "message takes at least one token. Send fewer messages",
                code="too_many_messages",
                param="messages",
            )
        check_depth(data)
        if not isinstance(messages, list):
            return data, {}
        checked: list[ChatMessage] = []
        for start in range(0, len(messages), VALIDATE_AT_ONCE):
            chunk = messages[start : start + VALIDATE_AT_ONCE]
            checked += _validated(_MESSAGES, chunk, ("messages",), start)
        # message objects pass the request's validation as they are (not validated again)
        return {**data, "messages": checked}, {}

    return parts


def completion_prompt(max_len: int, capacity: int) -> Callable[[dict[str, Any]], Parts]:
    """The ``parts`` of a completion request: a ``prompt`` of id lists counted (at most
    ``capacity`` lists, each of fewer than ``max_len`` ids, before anything is validated) and
    validated one list at a time; a prompt of more than ``max_len`` ids is refused unread."""

    def parts(data: dict[str, Any]) -> Parts:
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) > max(max_len, capacity):
            raise ApiError(
                400,
                f"prompt is a list of {len(prompt)} items: more ids than this model's context "
                f"holds ({max_len}), and more prompts than this server takes at once "
                f"({capacity}: --max-batch plus --max-queue)",
                code="context_length_exceeded",
                param="prompt",
            )
        check_depth(data)
        if not isinstance(prompt, list) or not all(isinstance(row, list) for row in prompt):
            return data, {}
        if len(prompt) > capacity:
            raise ApiError(
                400,
                f"{len(prompt)} prompts in one request; this server takes at most {capacity} "
                "(--max-batch plus --max-queue)",
                param="prompt",
            )
        rows = []
        for i, row in enumerate(prompt):
            if len(row) >= max_len:
                raise ApiError(
                    400,
                    f"this model's maximum context length is {max_len} tokens; prompt {i} has "
                    f"{len(row)}, with no room for a new token. Shorten the prompt",
                    code="context_length_exceeded",
                    param="prompt",
                )
            rows.append(_validated(_IDS, row, ("prompt", i)))
        return {**data, "prompt": [[0]]}, {"prompt": rows}

    return parts


def _validated(
    adapter: TypeAdapter[Any], items: list[Any], where: tuple[str | int, ...], offset: int = 0
) -> Any:
    """``items`` validated by ``adapter``; an error is placed at ``body.*where``, its index
    in ``items`` moved by ``offset`` (where ``items`` begin in the field)."""
    try:
        return adapter.validate_python(items)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        index, *rest = error["loc"]
        loc = ("body", *where, int(index) + offset, *rest)
        raise RequestValidationError([{**error, "loc": loc}]) from None


class PromptTooLong(Exception):
    """A prompt has more than ``limit`` tokens: ``counted`` were counted when counting
    stopped (the prompt has at least that many)."""

    def __init__(self, counted: int, limit: int) -> None:
        super().__init__(f"more than {limit} tokens ({counted} counted)")
        self.counted = counted
        self.limit = limit


def encode_within(
    tokenizer: Tokenizer, text: str, limit: int, *, special: bool = False
) -> list[int]:
    """The ids of ``text`` (:meth:`~zoo.tokenizers.Tokenizer.encode`'s), or
    :class:`PromptTooLong` as soon as more than ``limit`` are counted.

    Tokens are counted as the text is encoded piece by piece (the tokenizer's own pieces,
    :meth:`~zoo.tokenizers.Tokenizer.iter_encode`; with ``special``, a rendered conversation
    is also cut before its special tokens into parts of about :data:`COUNT_CHARS` characters),
    so a text far beyond the context costs about ``limit`` tokens' work, not the whole text's.

    Args:
        special: special-token strings in ``text`` become their ids (a chat template's
            rendering), as ``encode(text, allowed_special="all")``; else they are text.
    """
    allowed: Any = "all" if special else False
    parts = _parts(text, tuple(tokenizer.special_tokens)) if special else iter([text])
    ids: list[int] = []
    cut = False
    for i, part in enumerate(parts):
        cut = cut or i > 0
        for piece in tokenizer.iter_encode(part, allowed_special=allowed):
            ids += piece
            if len(ids) > limit:
                raise PromptTooLong(len(ids), limit)
    # a special token may take up the whitespace beside it: encoded whole, the ids are exact
    return tokenizer.encode(text, allowed_special=allowed) if cut else ids


def _parts(text: str, specials: tuple[str, ...]) -> Iterator[str]:
    """``text`` in consecutive parts of at least :data:`COUNT_CHARS` characters (the last
    one shorter), each cut just before a special token's string (or nowhere, without one)."""
    if len(text) <= COUNT_CHARS or not specials:
        yield text
        return
    pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    start = 0
    for found in pattern.finditer(text, COUNT_CHARS):
        if found.start() - start >= COUNT_CHARS:
            yield text[start : found.start()]
            start = found.start()
    yield text[start:]
