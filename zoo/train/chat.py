"""Chat fine-tuning data (``zoo train --task chat``): conversations, one per line in OpenAI's
messages format, rendered through the tokenizer's chat template, packed into rows of
``context + 1`` tokens, with the loss on the assistant's replies only.

A line is one JSON object: ``{"messages": [{"role": "user", "content": "Hi"}, {"role":
"assistant", "content": "Hello!"}]}``, optionally with ``"tools"`` (JSON schemas the template
renders). Roles are ``system``, ``developer``, ``user``, ``assistant`` and ``tool``; a message
has a string ``content`` (an assistant's may be ``null`` beside ``tool_calls``) and may have
``name``, ``tool_calls`` and ``tool_call_id``. Every line is checked before training starts;
a bad one is refused with its line number. Blank lines are skipped.

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

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .data import IGNORE, Batch, _read_text
from .files import DataError

if TYPE_CHECKING:
    from ..nn.base import ZooModel
    from .task import DataRequest

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_MESSAGES",
    "ChatData",
    "for_chat",
    "read_conversations",
]

#: The largest conversations file, one conversation (line) and one conversation's messages.
MAX_FILE_BYTES = 1 << 30
MAX_LINE_BYTES = 1 << 20
MAX_MESSAGES = 1024
#: The roles a message may have, and the keys a message and a line may hold.
ROLES = ("system", "developer", "user", "assistant", "tool")
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
_LINE_KEYS = frozenset({"messages", "tools"})


@dataclasses.dataclass(frozen=True)
class Conversation:
    """One checked line: its number, its messages and its tools (``None``: none)."""

    line: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


def _message(message: Any, index: int) -> dict[str, Any]:
    """Message ``index`` of a line, checked (the reason it is refused, else the message)."""
    if not isinstance(message, dict):
        raise ValueError(f"message {index} is not an object with 'role' and 'content'")
    unknown = sorted(set(message) - _MESSAGE_KEYS)
    if unknown:
        raise ValueError(
            f"message {index} has unknown key(s) {', '.join(map(repr, unknown))}; a message "
            f"holds {', '.join(sorted(_MESSAGE_KEYS))}"
        )
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise ValueError(f"message {index} has role {role!r}; roles are {', '.join(ROLES)}")
    tool_call = role == "assistant" and content is None and message.get("tool_calls")
    if not isinstance(content, str) and not tool_call:
        raise ValueError(f"message {index} ({role}) needs a string 'content'")
    return message


def _conversation(record: Any, line: int) -> Conversation:
    """A parsed line, checked (a ``ValueError`` says why it is refused)."""
    if not isinstance(record, dict):
        raise ValueError('a line is one JSON object: {"messages": [...]}')
    unknown = sorted(set(record) - _LINE_KEYS)
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(map(repr, unknown))}; a line holds 'messages' (and "
            "optionally 'tools')"
        )
    messages, tools = record.get("messages"), record.get("tools")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of messages")
    if len(messages) > MAX_MESSAGES:
        raise ValueError(f"{len(messages)} messages, more than {MAX_MESSAGES} in one line")
    checked = [_message(m, i) for i, m in enumerate(messages)]
    if not any(m["role"] == "assistant" for m in checked):
        raise ValueError("no assistant message: there is no reply to learn")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise ValueError("'tools' must be a list of JSON schemas (objects)")
    return Conversation(line, checked, tools)


def read_conversations(path: str | os.PathLike[str]) -> list[Conversation]:
    """The conversations of a ``.jsonl`` file, every line checked.

    Raises:
        DataError: a folder, a file over :data:`MAX_FILE_BYTES`, not UTF-8, no
            conversation, or a line that is not a conversation (its number and why).
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path} is a folder; chat fine-tuning reads one .jsonl file")
    if path.is_file() and path.stat().st_size > MAX_FILE_BYTES:
        raise DataError(f"{path} is over {MAX_FILE_BYTES:,} bytes; split it or sample it")
    conversations = []
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            if len(line.encode("utf-8")) > MAX_LINE_BYTES:
                raise ValueError(f"longer than {MAX_LINE_BYTES:,} bytes")
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"not JSON ({exc})") from None
            conversations.append(_conversation(record, number))
        except ValueError as exc:
            raise DataError(f"{path}, line {number}: {exc}") from None
    if not conversations:
        raise DataError(f"{path} holds no conversation")
    return conversations


def _encoded(
    conversation: Conversation, tokenizer: Any, context: int, where: str
) -> tuple[list[int], list[int]]:
    """A conversation's ids and reply mask, checked to fit a row and to hold a target."""
    from ..tokenizers import ChatTemplateError
    from ..tokenizers.chat_replies import reply_tokens

    at = f"{where}, line {conversation.line}"
    try:
        replies = reply_tokens(tokenizer, conversation.messages, tools=conversation.tools)
    except ChatTemplateError as exc:
        raise DataError(f"{at}: {exc}") from None
    if len(replies.ids) > context + 1:
        raise DataError(
            f"{at}: {len(replies.ids)} tokens rendered, more than a row of {context + 1} "
            "(context + 1); shorten the conversation or train with a longer context_length"
        )
    if not any(replies.mask[1:]):
        raise DataError(f"{at}: the template renders no token of the assistant's replies")
    return replies.ids, replies.mask


def _pack(
    encoded: list[tuple[list[int], list[int]]], length: int, pad: int
) -> tuple[Tensor, Tensor]:
    """Whole conversations, in order, into rows of ``length`` tokens (a conversation that
    does not fit what is left of a row starts the next): the ids ``(N, length)`` and whether
    each token is a reply's ``(N, length)``; the rest of a row is ``pad``, not a reply."""
    rows: list[tuple[list[int], list[int]]] = []
    for ids, mask in encoded:
        if not rows or len(rows[-1][0]) + len(ids) > length:
            rows.append(([], []))
        rows[-1][0].extend(ids)
        rows[-1][1].extend(mask)
    tokens = torch.full((len(rows), length), pad, dtype=torch.long)
    replies = torch.zeros(len(rows), length, dtype=torch.bool)
    for i, (ids, mask) in enumerate(rows):
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        replies[i, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
    return tokens, replies


@dataclasses.dataclass(frozen=True)
class ChatData:
    """Packed conversations, ready to draw batches from.

    Attributes:
        tokens: the rows' ids ``(N, context + 1)``, the training rows first.
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
        conversations: list[Conversation],
        tokenizer: Any,
        context: int,
        val_fraction: float,
        where: str,
    ) -> ChatData:
        """Render, encode, check and pack ``conversations`` (the last ``val_fraction`` held
        out, packed apart).

        Raises:
            DataError: a conversation the template refuses, longer than a row, without a
                reply token, or too few conversations to hold some out.
        """
        split = int(len(conversations) * (1 - val_fraction))
        if split < 1 or split == len(conversations):
            raise DataError(
                f"{where}: {len(conversations)} conversation(s) are too few to hold some out "
                f"(val_fraction {val_fraction}); give more"
            )
        encoded = [_encoded(c, tokenizer, context, where) for c in conversations]
        pad = next((i for i in (tokenizer.pad_id, tokenizer.eos_id) if i is not None), 0)
        train = _pack(encoded[:split], context + 1, pad)
        held = _pack(encoded[split:], context + 1, pad)
        tokens, replies = (torch.cat([a, b]) for a, b in zip(train, held, strict=True))
        return cls(tokens, replies, len(train[0]), len(conversations))

    def batch(self, part: str, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` random rows of ``part``: input ids ``(B, context)`` and next-token
        targets ``(B, context)``, ``IGNORE`` where the next token is not a reply's."""
        low, high = (0, self.split) if part == "train" else (self.split, len(self.tokens))
        picks = torch.randint(low, high, (batch_size,), generator=generator)
        rows, replies = self.tokens[picks], self.replies[picks]  # (B, context + 1)
        targets = torch.where(replies[:, 1:], rows[:, 1:], torch.full_like(rows[:, 1:], IGNORE))
        return {"input_ids": rows[:, :-1]}, targets


def read_chat(model: ZooModel, request: DataRequest) -> ChatData:
    """The ``"chat"`` task's data (:data:`zoo.train.task.TASKS`): ``request.data`` read as
    conversations and packed with the request's tokenizer and context."""
    if model.is_encoder_decoder:
        raise DataError(
            f"chat fine-tuning trains a decoder; {type(model).__name__} is an encoder-decoder"
        )
    conversations = read_conversations(request.data)
    tokenizer, where = request.tokenizer, str(request.data)
    return ChatData.build(conversations, tokenizer, request.context, request.val_fraction, where)


def for_chat(model: ZooModel, tokenizer: Any = None, template: str | None = None) -> Any:
    """Set ``model`` to train on conversations (its ``train_task`` becomes ``"chat"``) and
    return the tokenizer that renders them: ``tokenizer`` (default: the model's own, else its
    named model's), given ``template`` (Jinja source) in place of its own template when one
    is given. :func:`zoo.train.train` saves that tokenizer, template included, with the
    result, so ``zoo chat`` on it renders what it was trained on.

    Raises:
        DataError: no tokenizer, or a tokenizer without a chat template and none given.
    """
    from ..plugin.registry import get_registry
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
