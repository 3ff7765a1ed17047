"""Which tokens of a rendered conversation are the assistant's replies: what chat fine-tuning
learns (the loss covers them and nothing else).

The conversation is rendered whole through the chat template (no generation prompt) and
encoded as :meth:`~zoo.tokenizers.Tokenizer.apply_chat_template` encodes it (special-token
text becomes its id). The replies are found in one of two ways:

- **Marked**: a template with ``{% generation %}`` ... ``{% endgeneration %}`` around the
  assistant's text says so itself. The mask is ``transformers``' ``assistant_masks``
  (``apply_chat_template(..., return_assistant_tokens_mask=True, return_dict=True)``): every
  token whose characters overlap a marked block.
- **By prefix**: otherwise, each assistant message's reply is what rendering the
  conversation up to and including it adds to rendering the messages before it with the
  generation prompt (``add_generation_prompt=True``): the reply and whatever the template
  writes after it (its end-of-turn token), which the model learns to write. A template whose
  renders do not grow by appending (one that rewrites earlier turns) is refused: mark its
  replies with ``{% generation %}``.

A token's characters are found by decoding the ids before it (a byte-level token that holds
part of a character covers the whole character, as the ``tokenizers`` library's offsets do).
Only the tokens a binary search probes are placed, a few per reply. Where the tokenizer gives
each id's bytes (``_token_bytes``: the byte tokenizer, tiktoken), decoding the first ``k``
ids is decoding the first ``k`` tokens' bytes, so each probe is one C-speed UTF-8 decode of a
slice; otherwise the backend decodes the prefix (the ids checked once, not at every probe).
Either way the mask is the one decoding each prefix through :meth:`~zoo.tokenizers.Tokenizer.
decode` gives (those decodes, each checking every id in Python, were once half the time of
``zoo train --task chat`` before its first step).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .errors import ChatTemplateError

if TYPE_CHECKING:
    from .base import Tokenizer
    from .chat import ChatTemplate

__all__ = [
    "Replies",
    "encoded_replies",
    "has_generation_markers",
    "reply_mask",
    "reply_spans",
    "reply_tokens",
]

#: The tag ``transformers`` looks for before it trusts a template's assistant masks.
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_markers(source: str) -> bool:
    """Whether a template's Jinja source marks the assistant's text with ``{% generation %}``."""
    return bool(_GENERATION_TAG.search(source))


@dataclasses.dataclass(frozen=True)
class Replies:
    """A conversation as training sees it.

    Attributes:
        ids: the token ids of the whole rendered conversation.
        mask: 1 for each token of an assistant reply, else 0 (as long as ``ids``).
        marked: whether the replies came from ``{% generation %}`` blocks (else from prefix
            renders).
    """

    ids: list[int]
    mask: list[int]
    marked: bool


def _template(tokenizer: Tokenizer) -> ChatTemplate:
    chat: ChatTemplate | None = getattr(tokenizer, "_chat", None)
    if chat is None:
        raise ChatTemplateError(
            f"{tokenizer.name} has no chat template, so conversations cannot be rendered for "
            "training: use an instruct model's tokenizer, or give a template (zoo train "
            "--chat-template FILE; zoo.tokenizers.with_chat_template(tokenizer, SOURCE))"
        )
    return chat


def reply_spans(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[str, list[tuple[int, int]], bool]:
    """The rendered conversation, the ``(start, end)`` character offsets of each assistant
    reply in it, and whether they came from ``{% generation %}`` markers (see the module's
    docstring).

    Raises:
        ChatTemplateError: the template refuses the conversation, or (without markers) its
            renders do not grow by appending.
    """
    if has_generation_markers(template.pick(tools=tools is not None)):
        text, spans = template.render_spans(messages, tools=tools)
        return text, spans, True
    full = template.render(messages, tools=tools)
    spans = []
    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = (
            template.render(messages[:k], add_generation_prompt=True, tools=tools)
            if k
            else template.render_opening(tools=tools)
        )
        last = k + 1 == len(messages)  # (the whole conversation: rendered already)
        upto = full if last else template.render(messages[: k + 1], tools=tools)
        if not upto.startswith(before) or not full.startswith(upto):
            raise ChatTemplateError(
                f"the chat template does not render message {k} (an assistant reply) by "
                "appending it to the messages before it and the generation prompt, so its "
                "reply cannot be told from the rest; mark the assistant's text in the "
                "template with {% generation %} ... {% endgeneration %}"
            )
        spans.append((len(before), len(upto)))
    return full, spans, False


def reply_mask(
    tokenizer: Tokenizer, ids: Sequence[int], text: str, spans: Sequence[tuple[int, int]]
) -> list[int]:
    """1 for each token of ``ids`` (the encoding of ``text``) whose characters overlap one of
    ``spans``, else 0: ``transformers``' ``assistant_masks`` rule.

    Raises:
        TokenizerInputError, TokenizerError: ids that are not ids of this tokenizer.
        ChatTemplateError: the tokenizer does not decode ``ids`` back to ``text``, so its
            tokens cannot be placed in it.
    """
    return _mask(tokenizer, tokenizer._check_ids(ids), text, spans)


def encoded_replies(
    tokenizer: Tokenizer, text: str, spans: Sequence[tuple[int, int]]
) -> tuple[list[int], list[int]]:
    """``text`` encoded as a chat template's output is (special-token text becomes its id),
    and :func:`reply_mask` of ``spans`` on it."""
    ids = tokenizer.encode(text, allowed_special="all")
    return ids, _mask(tokenizer, ids, text, spans)


def _mask(
    tokenizer: Tokenizer, ids: list[int], text: str, spans: Sequence[tuple[int, int]]
) -> list[int]:
    """:func:`reply_mask` of ``ids``, already checked to be ids of ``tokenizer``."""
    decoded = _prefix_decoder(tokenizer, ids, text)
    if decoded(len(ids)) != text:
        raise ChatTemplateError(
            f"{tokenizer.name} does not decode the rendered conversation back to the same text, "
            "so zoo cannot tell which of its tokens are the replies"
        )

    def start(i: int) -> int:  # the first character token i covers
        before = decoded(i)
        return len(before) if text.startswith(before) else len(before) - 1  # inside a character

    def end(i: int) -> int:  # one past the last character token i covers
        return len(decoded(i + 1))

    mask = [0] * len(ids)
    positions = range(len(ids))
    for low, high in spans:
        first = bisect.bisect_right(positions, low, key=end)  # the first token ending past low
        stop = bisect.bisect_left(positions, high, key=start)  # the first starting at high
        mask[first:stop] = [1] * max(0, stop - first)
    return mask


def _prefix_decoder(tokenizer: Tokenizer, ids: list[int], text: str) -> Callable[[int], str]:
    """``count -> decode(ids[:count])`` for checked ``ids``, each count decoded once: from the
    tokens' bytes where the tokenizer gives them and they are ``text``'s UTF-8 (decoding a
    prefix is then decoding its bytes, errors replaced), else through the backend."""
    token_bytes: Callable[[list[int]], list[bytes]] | None = getattr(
        tokenizer, "_token_bytes", None
    )
    if token_bytes is not None:
        pieces = token_bytes(ids)
        data = b"".join(pieces)
        if data == text.encode("utf-8"):
            ends = [0, *itertools.accumulate(map(len, pieces))]

            @functools.cache
            def from_bytes(count: int) -> str:
                return data[: ends[count]].decode("utf-8", "replace")

            return from_bytes

    @functools.cache
    def from_backend(count: int) -> str:
        return tokenizer._decode(ids[:count], False)

    return from_backend


def reply_tokens(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> Replies:
    """A conversation's token ids and the mask of its assistant replies, through the
    tokenizer's chat template (see the module's docstring).

    Raises:
        ChatTemplateError: the tokenizer has no chat template, the template refuses the
            conversation, or the replies cannot be found in it.
    """
    text, spans, marked = reply_spans(_template(tokenizer), messages, tools=tools)
    return Replies(*encoded_replies(tokenizer, text, spans), marked)
