"""An encoder-decoder's requests, checked and prepared: a completion's prompt is the source (as
TGI serves T5), its completion the target, decoded alone.

A source is bounded by itself, not together with the reply: it may have up to ``max_len``
tokens (``--max-model-len``; default the context length) and the reply up to ``max_len - 1``
new tokens (the target's start token takes the first position). ``/v1/chat/completions`` has
a conversation rendered through the tokenizer's chat template as the source; a tokenizer
without one (every translation and summarisation model's) is refused with a 400 that says to
send the source to ``/v1/completions``. Beam search is not served: a request that asks for it
(``num_beams`` above 1, a field OpenAI's API does not have) is refused instead of being
decoded greedily. The preparation runs in the application's preparation pool, as the
decoder's does (:mod:`zoo.serve.prepare`), counted only as far as the bounds allow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..generation.reply import Reply
from .prepare import (
    _IDS,
    Parts,
    PromptTooLong,
    _validated,
    check_depth,
    conversation,
    encode_within,
    parse_body,
)
from .protocol import ApiError, ChatRequest, CompletionRequest, Prompt, _Sampling

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer
    from .runs import Run

__all__ = ["DEFAULT_MAX_TOKENS", "SourcePrompts", "TargetText", "check_no_beams", "target_only"]

#: New tokens of a completion that does not say (OpenAI's default).
DEFAULT_MAX_TOKENS = 16


def check_no_beams(data: dict[str, Any]) -> None:
    """A 400 for a body that asks for beam search (``num_beams`` above 1)."""
    beams = data.get("num_beams")
    if beams is None or (isinstance(beams, int) and not isinstance(beams, bool) and beams == 1):
        return
    raise ApiError(
        400,
        f"num_beams={beams!r}: zoo serve decodes greedily (temperature 0) or samples, one "
        "sequence per prompt, and does not run beam search; leave num_beams out (or 1), or "
        "translate with beam search through zoo.generate(model, text, num_beams=N) or "
        "zoo generate NAME TEXT --num-beams N",
        code="unsupported_parameter",
        param="num_beams",
    )


class TargetText:
    """A tokenizer's decoding with its special tokens left out: the text of a target."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, special tokens skipped."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def target_only(run: Run, tokenizer: Tokenizer) -> Run:
    """``run`` with each sequence's text the target's alone (not decoded after its source,
    special tokens skipped); returns ``run``."""
    for sequence in run.sequences:
        end_ids = sequence.reply.end_ids
        sequence.reply = Reply(TargetText(tokenizer), [], sequence.config, end_ids)
    return run


class SourcePrompts:
    """The checks and preparation of an encoder-decoder's requests.

    Args:
        tokenizer: encodes the sources (and renders a conversation, where it has a template).
        max_len: the most source tokens, and the target's positions (start token included).
        capacity: the most prompts one request may send (``--max-batch`` plus
            ``--max-queue``).
        source_vocab: the source's vocabulary (ids at or above it are refused).
        check: the model name's and the unsupported fields' checks every request passes
            (:meth:`Served.check <zoo.serve.served.Served.check>`).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_len: int,
        capacity: int,
        source_vocab: int,
        check: Callable[[_Sampling], int],
    ) -> None:
        self.tokenizer = tokenizer
        self.max_len = max_len
        self.capacity = capacity
        self.source_vocab = source_vocab
        self.check = check

    def completion(
        self, body: bytes, content_type: str | None
    ) -> tuple[CompletionRequest, list[list[int]], int]:
        """A ``/v1/completions`` body parsed and checked: the request, its sources' ids and
        the new tokens each may take."""
        request = parse_body(body, content_type, CompletionRequest, parts=self._completion_parts)
        self.check(request)
        max_tokens = self._max_tokens(request.max_tokens or DEFAULT_MAX_TOKENS, "max_tokens")
        sources = self._sources(request.prompt)
        for i, ids in enumerate(sources):
            self._check_source(ids, f"source {i}" if len(sources) > 1 else "the source")
        return request, sources, max_tokens

    def chat(
        self, body: bytes, content_type: str | None, render: Callable[[list[Any]], str]
    ) -> tuple[ChatRequest, list[list[int]], int]:
        """A ``/v1/chat/completions`` body parsed and checked, its conversation rendered by
        ``render`` (the chat template) as the source: the request, the source's ids and the
        new tokens it may take."""
        if self.tokenizer.chat_template is None:
            raise ApiError(
                400,
                "this is an encoder-decoder (a translation or summarisation model) and its "
                f"tokenizer ({self.tokenizer.name}) has no chat template, so there is no "
                "conversation format to give it: send the text to translate or summarise as "
                "the prompt of /v1/completions (the completion is the model's output)",
                code="no_chat_template",
                param="messages",
            )
        messages = conversation(self.max_len)

        def parts(data: dict[str, Any]) -> Parts:
            check_no_beams(data)
            return messages(data)

        request = parse_body(body, content_type, ChatRequest, parts=parts)
        self.check(request)
        asked = request.max_completion_tokens or request.max_tokens
        field = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
        max_tokens = self._max_tokens(asked or self.max_len - 1, field)
        text = render([m.plain() for m in request.messages])
        source = self._encode(text, "the conversation", special=True)
        self._check_source(source, "the conversation")
        return request, [source], max_tokens

    def _completion_parts(self, data: dict[str, Any]) -> Parts:
        """A completion body's ``prompt`` of id lists counted (before anything is validated)
        and validated one list at a time; ``num_beams`` refused."""
        check_no_beams(data)
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) > max(self.max_len, self.capacity):
            raise ApiError(
                400,
                f"prompt is a list of {len(prompt)} items: more ids than a source may have "
                f"({self.max_len}), and more sources than this server takes at once "
                f"({self.capacity}: --max-batch plus --max-queue)",
                code="context_length_exceeded",
                param="prompt",
            )
        check_depth(data)
        if not isinstance(prompt, list) or not all(isinstance(row, list) for row in prompt):
            return data, {}
        self._check_count(len(prompt))
        rows = []
        for i, row in enumerate(prompt):
            self._check_length(len(row), f"source {i}")
            rows.append(_validated(_IDS, row, ("prompt", i)))
        return {**data, "prompt": [[0]]}, {"prompt": rows}

    def _sources(self, prompt: Prompt) -> list[list[int]]:
        """A completion prompt as the sources' ids: text encoded, ids as given."""
        if isinstance(prompt, str):
            return [self._encode(prompt, "the source")]
        if not prompt:
            raise ApiError(400, "prompt is an empty list; give text or token ids", param="prompt")
        ids = [item for item in prompt if isinstance(item, int)]
        if len(ids) == len(prompt):  # a list of ids: one source
            return [ids]
        self._check_count(len(prompt))
        return [
            self._encode(item, f"source {i}") if isinstance(item, str) else list(item)  # type: ignore[call-overload]
            for i, item in enumerate(prompt)
        ]

    def _encode(self, text: str, what: str, *, special: bool = False) -> list[int]:
        """A source text's ids, counted only up to the most a source may have; with the
        sequence tokens where the tokenizer encodes sources so (``source_special_tokens``:
        a Hugging Face folder's, as transformers encodes Marian's, BART's and T5's sources)."""
        try:
            ids = encode_within(self.tokenizer, text, self.max_len, special=special)
            if not getattr(self.tokenizer, "source_special_tokens", False):
                return ids
            allowed: Any = "all" if special else False
            return self.tokenizer.encode(text, add_special_tokens=True, allowed_special=allowed)
        except PromptTooLong as exc:
            raise self._too_long(what, f"more than {exc.limit} (counting stopped at "
                                 f"{exc.counted})") from None  # fmt: skip
        except ValueError as exc:
            raise ApiError(400, f"{what}: {exc}", param="prompt") from None

    def _check_length(self, length: int, what: str) -> None:
        if length > self.max_len:
            raise self._too_long(what, str(length))

    def _too_long(self, what: str, has: str) -> ApiError:
        return ApiError(
            400,
            f"{what} has {has} tokens; this encoder-decoder reads sources of at most "
            f"{self.max_len} tokens (--max-model-len, at most the context length). Send a "
            "shorter text (split a document into sentences or paragraphs)",
            code="context_length_exceeded",
            param="messages" if what == "the conversation" else "prompt",
        )

    def _check_source(self, ids: Sequence[int], what: str) -> None:
        """Ids in the source vocabulary, at least one, at most :attr:`max_len`."""
        if not ids:
            raise ApiError(400, f"{what} is empty; give at least one token", param="prompt")
        bad = next((i for i in ids if not 0 <= i < self.source_vocab), None)
        if bad is not None:
            raise ApiError(
                400,
                f"{what} holds token id {bad}, outside the source vocabulary "
                f"[0, {self.source_vocab})",
                param="prompt",
            )
        self._check_length(len(ids), what)

    def _max_tokens(self, asked: int, field: str) -> int:
        """The new tokens a target may take: ``asked``, if the target's positions hold them
        after its start token."""
        if asked >= self.max_len:
            raise ApiError(
                400,
                f"{field} asks for {asked} new tokens; this encoder-decoder's target holds at "
                f"most {self.max_len - 1} (--max-model-len {self.max_len}, the start token "
                f"included). Lower {field}",
                code="context_length_exceeded",
                param=field,
            )
        return asked

    def _check_count(self, prompts: int) -> None:
        if prompts > self.capacity:
            raise ApiError(
                400,
                f"{prompts} prompts in one request; this server takes at most {self.capacity} "
                "(--max-batch plus --max-queue)",
                param="prompt",
            )
