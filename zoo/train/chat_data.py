"""Chat fine-tuning data (``zoo train --task chat``): conversations, one per line in OpenAI's
messages format, rendered through the tokenizer's chat template, packed into rows of
``context + 1`` tokens, with the loss on the assistant's replies only.

A line is one JSON object: ``{"messages": [{"role": "user", "content": "Hi"}, {"role":
"assistant", "content": "Hello!"}]}``, optionally with ``"tools"`` (JSON schemas the template
renders). Roles are ``system``, ``developer``, ``user``, ``assistant`` and ``tool``; a message
has a string ``content`` (an assistant's may be ``null`` beside ``tool_calls``) and may have
``name``, ``tool_calls``, ``tool_call_id`` and ``weight``, each of the type OpenAI's
fine-tuning format gives it (:mod:`zoo.train.chat_lines`). Every line is checked before
training starts, in one streaming pass that holds one line at a time; a bad one is refused
with its line number. Blank lines are skipped. The conversations are then read again, one at
a time, each rendered, encoded and packed as it comes (the whole file, every parsed line and
every encoding were once held at once, many times the file's size: docs/benchmarks.md,
"Figures behind design choices").

Which tokens are the replies is :mod:`zoo.tokenizers.chat_replies`' rule: the template's
``{% generation %}`` blocks when it has them (``transformers``' assistant mask), otherwise
what each assistant message adds to the render of the messages before it. A target is kept
where the token it predicts is a reply token, and is ``IGNORE`` (-100) elsewhere.

Conversations are packed whole, in file order, into rows of ``context + 1`` tokens (the
causal-LM task's windows): attention runs across the conversations of a row, as it runs
across the documents of a text window, and the end of a row is padding, never a target. The
last ``val_fraction`` of the conversations is held out, packed apart.
"""

from __future__ import annotations

import array
import dataclasses
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .chat_lines import (
    MAX_FILE_BYTES,
    MAX_LINE_BYTES,
    MAX_MESSAGES,
    ROLES,
    Conversation,
    count_conversations,
    iter_conversations,
)
from .data import IGNORE, Batch
from .data_files import DataError

if TYPE_CHECKING:
    from ..nn.base import ZooModel
    from .task import DataRequest

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_MESSAGES",
    "ROLES",
    "ChatData",
    "Conversation",
    "count_conversations",
    "for_chat",
    "iter_conversations",
    "read_conversations",
]


def read_conversations(path: str | os.PathLike[str]) -> list[Conversation]:
    """The conversations of a ``.jsonl`` file, every line checked, as a list (training
    streams them instead: :func:`iter_conversations`).

    Raises:
        DataError: as :func:`iter_conversations`, or no conversation.
    """
    conversations = list(iter_conversations(path))
    if not conversations:
        raise DataError(f"{path} holds no conversation")
    return conversations


def _encoded(
    conversation: Conversation, tokenizer: Any, context: int, where: str
) -> tuple[list[int], list[int]]:
    """A conversation's ids and reply mask (without the replies of its ``weight`` 0
    messages), checked to fit a row and to hold a target."""
    from ..tokenizers import ChatTemplateError

    at = f"{where}, line {conversation.line}"
    try:
        ids, mask = _replies(tokenizer, conversation)
    except ChatTemplateError as exc:
        raise DataError(f"{at}: {exc}") from None
    if len(ids) > context + 1:
        raise DataError(
            f"{at}: {len(ids)} tokens rendered, more than a row of {context + 1} "
            "(context + 1); shorten the conversation or train with a longer context_length"
        )
    if not any(mask[1:]):
        raise DataError(f"{at}: the template renders no token of the assistant's replies")
    return ids, mask


def _replies(tokenizer: Any, conversation: Conversation) -> tuple[list[int], list[int]]:
    """The ids and reply mask of :func:`zoo.tokenizers.chat_replies.reply_tokens`, less the
    replies of the assistant messages with ``weight`` 0 (OpenAI's rule: not learned)."""
    from ..tokenizers import ChatTemplateError
    from ..tokenizers.chat_replies import _template, encoded_replies, reply_spans, reply_tokens

    messages, tools = conversation.messages, conversation.tools
    weights = [m.get("weight", 1) for m in messages if m["role"] == "assistant"]
    if any("weight" in m for m in messages):  # OpenAI's, not the template's
        messages = [{k: v for k, v in m.items() if k != "weight"} for m in messages]
    if all(weights):
        replies = reply_tokens(tokenizer, messages, tools=tools)
        return replies.ids, replies.mask
    text, spans, _ = reply_spans(_template(tokenizer), messages, tools=tools)
    if len(spans) != len(weights):
        raise ChatTemplateError(
            f"the template marks {len(spans)} replies for {len(weights)} assistant messages, "
            "so 'weight' cannot tell which to leave out; drop 'weight', or the messages"
        )
    kept = [span for span, weight in zip(spans, weights, strict=True) if weight]
    return encoded_replies(tokenizer, text, kept)


class _Rows:
    """Whole conversations, in order, packed into rows of ``length`` tokens (a conversation
    that does not fit what is left of a row starts the next), the rest of a row ``pad`` and
    not a reply; held compactly (``typecode`` ids, a byte a reply flag), a row at a time."""

    def __init__(self, length: int, pad: int, typecode: str) -> None:
        self.length, self.pad = length, pad
        self.ids = array.array(typecode)
        self.mask = bytearray()
        self.row: list[int] = []
        self.row_mask: list[int] = []

    def add(self, ids: list[int], mask: list[int]) -> None:
        if self.row and len(self.row) + len(ids) > self.length:
            self._flush()
        self.row.extend(ids)
        self.row_mask.extend(mask)

    def _flush(self) -> None:
        padding = self.length - len(self.row)
        self.ids.extend(self.row)
        self.ids.extend([self.pad] * padding)
        self.mask.extend(bytes(self.row_mask))
        self.mask.extend(bytes(padding))
        self.row, self.row_mask = [], []

    def end_row(self) -> int:
        """End the row being filled (the next conversation starts a new one); returns the
        rows so far."""
        if self.row:
            self._flush()
        return len(self.mask) // self.length

    def tensors(self) -> tuple[Tensor, Tensor]:
        """The ids ``(N, length)`` and whether each token is a reply's ``(N, length)``."""
        self.end_row()
        dtype = torch.int32 if self.ids.typecode == "i" else torch.int16
        tokens = torch.frombuffer(self.ids, dtype=dtype).view(-1, self.length)
        replies = torch.frombuffer(self.mask, dtype=torch.bool).view(-1, self.length)
        return tokens, replies


@dataclasses.dataclass(frozen=True)
class ChatData:
    """Packed conversations, ready to draw batches from.

    Attributes:
        tokens: the rows' ids ``(N, context + 1)``, the training rows first (int16 where
            the vocabulary fits, else int32; a batch is int64).
        replies: whether each token is part of a reply ``(N, context + 1)``.
        split: index of the first held-out row.
        conversations: how many conversations the rows hold.
    """

    tokens: Tensor
    replies: Tensor
    split: int
    conversations: int

    @classmethod
    def build(
        cls,
        conversations: Iterable[Conversation],
        tokenizer: Any,
        context: int,
        val_fraction: float,
        where: str,
        count: int | None = None,
    ) -> ChatData:
        """Render, encode, check and pack ``conversations`` one at a time (the last
        ``val_fraction`` held out, packed apart); ``count``: how many there are (default:
        ``len(conversations)``), so that a stream is read once.

        Raises:
            DataError: a conversation the template refuses, longer than a row, without a
                reply token, or too few conversations to hold some out.
        """
        total = len(conversations) if count is None else count  # type: ignore[arg-type]
        split = int(total * (1 - val_fraction))
        if split < 1 or split == total:
            raise DataError(
                f"{where}: {total} conversation(s) are too few to hold some out "
                f"(val_fraction {val_fraction}); give more"
            )
        pad = next((i for i in (tokenizer.pad_id, tokenizer.eos_id) if i is not None), 0)
        typecode = "h" if getattr(tokenizer, "vocab_size", 1 << 31) <= 1 << 15 else "i"
        rows, held_from = _Rows(context + 1, pad, typecode), 0
        for index, one in enumerate(conversations):
            if index == split:  # the held-out conversations are packed apart
                held_from = rows.end_row()
            rows.add(*_encoded(one, tokenizer, context, where))
        tokens, replies = rows.tensors()
        return cls(tokens, replies, held_from, total)

    def batch(self, part: str, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` random rows of ``part``: input ids ``(B, context)`` and next-token
        targets ``(B, context)``, ``IGNORE`` where the next token is not a reply's."""
        low, high = (0, self.split) if part == "train" else (self.split, len(self.tokens))
        picks = torch.randint(low, high, (batch_size,), generator=generator)
        rows, replies = self.tokens[picks].long(), self.replies[picks]  # (B, context + 1)
        targets = torch.where(replies[:, 1:], rows[:, 1:], torch.full_like(rows[:, 1:], IGNORE))
        return {"input_ids": rows[:, :-1]}, targets


def read_chat(model: ZooModel, request: DataRequest) -> ChatData:
    """The ``"chat"`` task's data (:data:`zoo.train.task.TASKS`): ``request.data`` checked in
    one streaming pass (every line, before anything is rendered: a bad line is said within
    seconds), then read again, each conversation rendered, encoded and packed as it comes."""
    if model.is_encoder_decoder:
        raise DataError(
            f"chat fine-tuning trains a decoder; {type(model).__name__} is an encoder-decoder"
        )
    count = count_conversations(request.data)
    tokenizer, where = request.tokenizer, str(request.data)
    conversations = iter_conversations(request.data)
    return ChatData.build(
        conversations, tokenizer, request.context, request.val_fraction, where, count
    )


def for_chat(model: ZooModel, tokenizer: Any = None, template: str | None = None) -> Any:
    """Set ``model`` to train on conversations (its ``train_task`` becomes ``"chat"``) and
    return the tokenizer that renders them: ``tokenizer`` (default: the model's own, else its
    named model's), given ``template`` (Jinja source) in place of its own template when one
    is given. :func:`zoo.train.train` saves that tokenizer, template included, with the
    result, so ``zoo chat`` on it renders what it was trained on.

    Raises:
        DataError: no tokenizer, or a tokenizer without a chat template and none given.
    """
    from ..plugin.current import get_registry
    from ..tokenizers import with_chat_template

    tokenizer = tokenizer or model.tokenizer  # (zoo.train.start's choice, made before it)
    if tokenizer is None and model.name:
        tokenizer = get_registry().model_tokenizer(model.name).load()
    if tokenizer is None:
        raise DataError("chat fine-tuning needs a tokenizer: pass tokenizer=...")
    if template is not None:
        tokenizer = with_chat_template(tokenizer, template)
    if tokenizer.chat_template is None:
        raise DataError(
            f"{tokenizer.name} has no chat template to render conversations with: give one "
            "(zoo train --chat-template FILE; for shakespeare-byte, "
            "plugins/shakespeare/data/chat_template.jinja)"
        )
    vars(model)["train_task"] = "chat"  # an instance attribute: zoo.train.task.task_of reads it
    return tokenizer
