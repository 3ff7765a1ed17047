"""What ``zoo serve``'s endpoints serve, and each request's checks: the model's name, the
fields, the prompt against the context (:class:`Served`).

A request's body is turned into checked prompt ids by :meth:`Served.prepare_completion` and
:meth:`Served.prepare_chat`, which run in a thread of the application's preparation pool
(:mod:`zoo.serve.prepare`), never on the event loop, and whose work is bounded by the
context before it is spent. Who may reuse a request's prompt in the prefix cache is decided
here too (:meth:`Served.cache_salt`): the client's API key and the request's ``cache_salt``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Sequence
from typing import Any

from ..generation import GenerationConfig
from ..tokenizers import Tokenizer
from .chat_prompt import ChatTemplates
from .encdec_runner import source_settings, with_source_settings
from .engine import Engine
from .metrics import Metrics
from .prepare import PromptTooLong, completion_prompt, conversation, encode_within, parse_body
from .protocol import ApiError, ChatRequest, CompletionRequest, Prompt, _Sampling
from .runs import Run
from .scheduler import EngineStopped, QueueFull
from .source_prompts import SourcePrompts, target_only

__all__ = ["Prepared", "Served"]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A request checked and ready for the engine: its fields, its prompts' ids, the new
    tokens each may take and the ids that end them."""

    body: CompletionRequest | ChatRequest
    prompts: list[list[int]]
    max_tokens: int
    end_ids: list[int]


class Served:
    """What the endpoints serve: the engine, the tokenizer, the model's name (and each of
    the engine's LoRA adapters, a model of its own name) and its chat template, with the
    checks every request goes through.

    Args:
        shared_prefix_cache: clients of different API keys share the prefix cache's blocks
            (by default each key's prompts are kept apart: a hit would tell one client that
            another sent a prompt).
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        model_id: str,
        *,
        shared_prefix_cache: bool = False,
    ) -> None:
        if model_id in engine.adapter_ids:
            raise ValueError(f"an adapter is named {model_id!r}, as the base model is")
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.shared_prefix_cache = shared_prefix_cache
        #: Every model name a request may give, with the adapter it applies (0: none).
        self.models = {model_id: 0, **engine.adapter_ids}
        self.created = int(time.time())
        self.chat = ChatTemplates(tokenizer)
        config: Any = engine.model.config  # a decoder's or an encoder-decoder's
        self.vocab_size: int = config.vocab_size
        #: What ``/metrics`` reports: this application's own registry.
        self.metrics = Metrics(engine, self.models)
        #: An encoder-decoder's requests (``None`` for a decoder): the prompt is the source.
        self.sources: SourcePrompts | None = None
        self._source_settings: dict[str, Any] = {}
        if engine.encoder_decoder:
            self._source_settings = source_settings(engine.model, tokenizer)
            self.sources = SourcePrompts(
                tokenizer,
                engine.max_len,
                engine.capacity,
                config.source_vocab,
                self.check,
            )

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

    # -- preparation: in a thread of the pool, never on the event loop -----------------------
    def prepare_completion(self, body: bytes, content_type: str | None) -> Prepared:
        """A ``/v1/completions`` body parsed and checked, its prompts encoded (each counted
        only as far as the context allows). An encoder-decoder's prompts are its sources
        (:mod:`zoo.serve.source_prompts`)."""
        if self.sources is not None:
            request, sources, tokens = self.sources.completion(body, content_type)
            return Prepared(request, sources, tokens, list(self.tokenizer.end_ids))
        parts = completion_prompt(self.engine.max_len, self.engine.capacity)
        request = parse_body(body, content_type, CompletionRequest, parts=parts)
        self.check(request)
        max_tokens = request.max_tokens or 16
        prompts = self._prompts(request.prompt, max_tokens)
        for i, ids in enumerate(prompts):
            self.check_prompt(ids, max_tokens, f"prompt {i}" if len(prompts) > 1 else "the prompt")
        return Prepared(request, prompts, max_tokens, list(self.tokenizer.end_ids))

    def prepare_chat(self, body: bytes, content_type: str | None) -> Prepared:
        """A ``/v1/chat/completions`` body parsed and checked (no more messages than the
        context has positions), its conversation rendered and encoded (counted only as far
        as the context allows). An encoder-decoder's conversation, rendered, is its source."""
        if self.sources is not None:
            chat, sources, tokens = self.sources.chat(body, content_type, self.chat.render)
            return Prepared(chat, sources, tokens, list(self.tokenizer.end_ids))
        limit = self.engine.max_len
        request = parse_body(body, content_type, ChatRequest, parts=conversation(limit))
        self.check(request)
        max_tokens = request.max_completion_tokens or request.max_tokens
        room = self._room(max_tokens or 1)
        text = self.chat.render([m.plain() for m in request.messages])
        try:
            prompt = encode_within(self.tokenizer, text, room, special=True)
        except PromptTooLong as exc:
            raise self._too_long("the conversation", exc, max_tokens or 1) from None
        if max_tokens is None:  # as OpenAI: up to the end of the context
            max_tokens = max(1, limit - len(prompt))
        self.check_prompt(prompt, max_tokens, "the conversation")
        return Prepared(request, [prompt], max_tokens, list(self.tokenizer.end_ids))

    def _prompts(self, prompt: Prompt, max_tokens: int) -> list[list[int]]:
        """A completion prompt as id lists: text encoded, ids as given; no more prompts than
        the engine takes at once."""
        if isinstance(prompt, str):
            return [self.encode(prompt, max_tokens)]
        if not prompt:
            raise ApiError(400, "prompt is an empty list; give text or token ids", param="prompt")
        ids = [item for item in prompt if isinstance(item, int)]
        if len(ids) == len(prompt):  # a list of ids: one prompt
            return [ids]
        self._check_count(len(prompt))
        rows = []
        for i, item in enumerate(prompt):
            if isinstance(item, str):
                rows.append(self.encode(item, max_tokens, f"prompt {i}"))
            else:
                rows.append(list(item))  # type: ignore[call-overload]
        return rows

    def encode(self, text: str, max_tokens: int, what: str = "the prompt") -> list[int]:
        """A text prompt's ids, counted only until it cannot fit with ``max_tokens`` after
        it (a 400 for text that is not Unicode, or too long)."""
        try:
            return encode_within(self.tokenizer, text, self._room(max_tokens))
        except PromptTooLong as exc:
            raise self._too_long(what, exc, max_tokens) from None
        except ValueError as exc:
            raise ApiError(400, f"{what}: {exc}", param="prompt") from None

    def _room(self, max_tokens: int) -> int:
        """The prompt tokens the context leaves beside ``max_tokens`` new ones (a 400 when
        it leaves none)."""
        limit = self.engine.max_len
        if max_tokens >= limit:
            raise ApiError(
                400,
                f"this model's maximum context length is {limit} tokens, the prompt included; "
                f"max_tokens asks for {max_tokens} new ones. Lower max_tokens",
                code="context_length_exceeded",
                param="max_tokens",
            )
        return limit - max_tokens

    def _too_long(self, what: str, exc: PromptTooLong, max_tokens: int) -> ApiError:
        return ApiError(
            400,
            f"this model's maximum context length is {self.engine.max_len} tokens; {what} "
            f"has more than {exc.limit} (counting stopped at {exc.counted}) and max_tokens "
            f"asks for {max_tokens} more. Shorten the prompt or lower max_tokens",
            code="context_length_exceeded",
            param="messages" if what == "the conversation" else "prompt",
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
        """The generation settings of a request (a 400 for values out of range); an
        encoder-decoder's with its start token and its checkpoint's constraints."""
        try:
            config = GenerationConfig(
                max_new_tokens=max_tokens,
                temperature=1.0 if body.temperature is None else body.temperature,
                top_k=body.top_k,
                top_p=body.top_p,
                seed=body.seed,
                stop=body.stops(),
                eos_id=self.tokenizer.eos_id,
                vocab_limit=self.tokenizer.vocab_size,
            )
            if self.sources is None:
                return config
            return with_source_settings(config, self._source_settings)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

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

    def _check_count(self, prompts: int) -> None:
        capacity = self.engine.capacity
        if prompts > capacity:
            raise ApiError(
                400,
                f"{prompts} prompts in one request; this server takes at most {capacity} "
                "(--max-batch plus --max-queue)",
                param="prompt",
            )

    # -- on the event loop ----------------------------------------------------------------------
    def cache_salt(self, client: bytes, salt: str | None) -> bytes:
        """Who may reuse a request's prompt in the prefix cache: its client's key (unless the
        cache is shared across keys) and its ``cache_salt``, as one digest."""
        owner = b"" if self.shared_prefix_cache else client
        if not owner and salt is None:
            return b""
        given = b"" if salt is None else b"s" + salt.encode("utf-8", "surrogatepass")
        # the owner at a fixed width, so that no salt can pass for another owner's
        return hashlib.blake2b(owner.ljust(32, b"\x00") + given, digest_size=16).digest()

    def run(self, prepared: Prepared, client: bytes) -> Run:
        """A request's sequences, counted under its model's name."""
        body = prepared.body
        run = Run(
            prepared.prompts,
            self.config(body, prepared.max_tokens),
            self.tokenizer,
            prepared.end_ids,
            self.models[body.model],
            self.metrics.model(body.model),
            self.cache_salt(client, body.cache_salt),
        )
        return run if self.sources is None else target_only(run, self.tokenizer)

    def submit(self, run: Run) -> None:
        """Hand a request's sequences to the engine (429 when it is full)."""
        self._check_count(len(run.sequences))
        try:
            run.submit(self.engine)
        except QueueFull as exc:
            raise ApiError(429, str(exc), type="rate_limit_error", code="server_busy") from None
        except EngineStopped as exc:
            raise ApiError(503, str(exc), type="server_error", code="shutting_down") from None
