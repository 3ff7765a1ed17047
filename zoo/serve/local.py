"""One conversation's turns on the calling thread: an :class:`~zoo.serve.engine.Engine` of
one slot, stepped by whoever reads the reply, so each turn's prompt reuses the keys and values
of the conversation so far (its prefix cache) and computes only the new turn. ``zoo chat``
uses it; no HTTP, no thread."""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from ..runtime.session import context_overflow
from .engine import Engine
from .request import Event, Finish, Request

if TYPE_CHECKING:
    from ..generation import GenerationConfig
    from ..nn.decoder import DecoderLM
    from ..runtime.prefix_cache import PrefixCacheStats
    from ..tokenizers import Tokenizer

__all__ = ["Turns"]


class Turns:
    """Replies to prompts one at a time, keeping what each computed for the next.

    Args:
        model: the decoder (see :func:`zoo.runtime.slots.check_batchable`).
        tokenizer: decodes the replies.
        prefix_cache_bytes: memory for the kept keys and values (default: one whole
            context's, what a conversation needs).
        decode_threads, compile, cuda_graphs: the CPU threads of each step, and whether it
            is compiled or replays CUDA graphs (see :class:`~zoo.serve.engine.Engine`).
    """

    def __init__(
        self,
        model: DecoderLM,
        tokenizer: Tokenizer,
        *,
        prefix_cache_bytes: int | None = None,
        decode_threads: int | None = None,
        compile: bool = False,
        cuda_graphs: bool = True,
    ) -> None:
        self.engine = Engine(
            model,
            max_batch=1,
            max_queue=0,
            prefix_cache_bytes=prefix_cache_bytes,
            decode_threads=decode_threads,
            compile=compile,
            cuda_graphs=cuda_graphs,
        )
        self.tokenizer = tokenizer

    def stats(self) -> PrefixCacheStats | None:
        """What the prefix cache holds and has done."""
        return self.engine.prefix_cache_stats()

    def stream(self, prompt: Sequence[int], config: GenerationConfig) -> Iterator[str]:
        """The text that follows ``prompt`` (ids) in pieces as its tokens are picked, as
        :func:`zoo.generation.stream_continuation` gives it (``config`` with the tokenizer's
        end ids, :func:`zoo.generation.text.with_tokenizer`). The prompt is checked now: a
        ``ValueError`` when it leaves no room for ``config.max_new_tokens``."""
        if not prompt or len(prompt) + config.max_new_tokens > self.engine.max_len:
            raise context_overflow(len(prompt), config.max_new_tokens, self.engine.max_len)
        events: collections.deque[Event] = collections.deque()
        request = Request(prompt, config, self.tokenizer, events.append, config.end_ids)
        self.engine.submit([request])
        return self._pieces(request, events)

    def _pieces(self, request: Request, events: collections.deque[Event]) -> Iterator[str]:
        try:
            with torch.inference_mode():
                while not request.finished:
                    self.engine.step()
                    while events:
                        event = events.popleft()
                        if isinstance(event, Finish):
                            _check(event)
                        else:
                            yield event
        finally:  # closed before the end: the slot is freed at once
            if not request.finished:
                request.cancel()
                with torch.inference_mode():
                    self.engine.step()


def _check(finish: Finish) -> None:
    if finish.reason == "error":
        raise RuntimeError(f"decoding failed: {finish.error}")
