"""One request's prompt as the engine decodes it, and the events it emits: plain Python
(the scheduler handles requests without importing torch)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..generation.reply import Reply

if TYPE_CHECKING:
    import torch

    from ..generation import GenerationConfig
    from ..tokenizers import Tokenizer

__all__ = ["Event", "Finish", "Observer", "Request"]


@dataclasses.dataclass(frozen=True)
class Finish:
    """The last event of a request.

    Attributes:
        reason: ``"stop"`` (an end-of-text id or a stop string), ``"length"``
            (``max_new_tokens`` reached), ``"cancelled"`` or ``"error"``.
        prompt_tokens: the prompt's length.
        completion_tokens: tokens generated (an end-of-text id included).
        error: what went wrong, for ``"error"``.
    """

    reason: str
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None


#: What a request emits: a piece of its text, then one :class:`Finish`.
Event = str | Finish


class Observer(Protocol):
    """What a request tells as it decodes (from the engine's thread; must be cheap and must
    not block): :class:`zoo.serve.metrics.ModelMetrics` counts and times it."""

    def received(self, requests: int) -> None:
        """``requests`` were queued (from the thread that queued them)."""

    def first_token(self, prompt_tokens: int, seconds: float) -> None:
        """The first new token, ``seconds`` after the request was queued (its prompt of
        ``prompt_tokens`` ids is prefilled)."""

    def next_token(self, seconds: float) -> None:
        """Another new token, ``seconds`` after the one before."""

    def finished(self, reason: str, seconds: float) -> None:
        """The request ended (:attr:`Finish.reason`), ``seconds`` after it was queued."""


class Request:
    """One prompt to continue, and where its text goes.

    Args:
        prompt: the prompt's ids.
        config: the settings (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``,
            ``seed``, ``stop``, ``vocab_limit``).
        tokenizer: decodes the new tokens.
        emit: called from the engine's thread with each :data:`Event`; must not block.
        end_ids: ids that end the request (not part of its text).
        flush: called from the engine's thread after a burst of events (a step's, an
            admission's), once per burst however many requests share it: lets ``emit``
            only queue its events and ``flush`` hand a whole step's on at once.
        adapter: the LoRA adapter its row applies, by index in the engine's
            (:attr:`Engine.adapter_ids <zoo.serve.engine.Engine.adapter_ids>`); 0: none.
        observer: told of its first token, each later one and its end, with the times
            between (``time.perf_counter()`` seconds; see :meth:`queued`).
        cache_salt: who may reuse the keys and values of its prompt in the prefix cache:
            requests of different salts never share a block (``zoo serve`` derives it from
            the client's API key and the request's ``cache_salt``); empty: no one in
            particular.
    """

    def __init__(
        self,
        prompt: Sequence[int],
        config: GenerationConfig,
        tokenizer: Tokenizer,
        emit: Callable[[Event], None],
        end_ids: Sequence[int] = (),
        flush: Callable[[], None] | None = None,
        adapter: int = 0,
        observer: Observer | None = None,
        cache_salt: bytes = b"",
    ) -> None:
        self.prompt = list(prompt)
        self.adapter = adapter
        #: The prefix cache's salt of its blocks: its adapter and its ``cache_salt``.
        self.cache_key = adapter.to_bytes(8, "little", signed=True) + cache_salt
        self.observer = observer
        #: When it was queued (``time.perf_counter()``): made, until :meth:`queued`.
        self.arrival = time.perf_counter()
        #: When its latest token was taken (``None`` before the first).
        self.last_token_at: float | None = None
        self.config = config
        self.emit = emit
        self.flush = flush
        self.reply = Reply(tokenizer, self.prompt, config, end_ids)
        #: The generator its samples draw from (set by the runner when it joins the batch).
        self.generator: torch.Generator | None = None
        #: The last token picked that is part of its text: the next step's input.
        self.last: int | None = None
        self.finished = False
        self._cancelled = threading.Event()

    def queued(self) -> None:
        """Mark now as its arrival, from which its time to first token and its latency
        count: call it as it is handed to the engine (:meth:`Run.submit
        <zoo.serve.runs.Run.submit>` does)."""
        self.arrival = time.perf_counter()

    def cancel(self) -> None:
        """Ask the engine to drop this request (from any thread); it finishes with
        ``"cancelled"`` before the next step, freeing its slot."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def generated(self) -> int:
        """Tokens picked so far (an end id included)."""
        return self.reply.generated

    def take(self, token: int) -> bool:
        """Record a picked token and emit its text; return whether the request ended."""
        now = time.perf_counter()
        if self.observer is not None:
            if self.last_token_at is None:
                self.observer.first_token(len(self.prompt), now - self.arrival)
            else:
                self.observer.next_token(now - self.last_token_at)
        self.last_token_at = now
        piece = self.reply.push(token)
        if piece:
            self.emit(piece)
        if self.reply.reason is not None:
            self.end(self.reply.reason)
            return True
        self.last = token
        return False

    def end(self, reason: str, error: str | None = None) -> None:
        """Emit the rest of the text (unless cancelled or failed) and the :class:`Finish`."""
        if self.finished:
            return
        self.finished = True
        if reason in ("stop", "length"):
            rest = self.reply.finish()
            if rest:
                self.emit(rest)
        if self.observer is not None:
            self.observer.finished(reason, time.perf_counter() - self.arrival)
        self.emit(Finish(reason, len(self.prompt), self.generated, error))
