"""Chat templates: a conversation rendered as the prompt an instruct model was trained on.

A template is the Jinja source a model ships in ``tokenizer_config.json`` (``chat_template``)
or ``chat_template.jinja``. It is rendered exactly as ``transformers`` renders it
(``transformers/utils/chat_template_utils.py``, 5.x): the same sandboxed environment
(``ImmutableSandboxedEnvironment`` with ``trim_blocks``, ``lstrip_blocks``, loop controls and
the ``{% generation %}`` tag), the same globals (``raise_exception``, ``strftime_now``, a
``dict`` and a ``namespace`` that refuse private names), the same ``tojson`` filter
(:mod:`.chat_sandbox`), and the same preparation of the messages (``None`` values dropped,
message objects made plain data, reasoning copied under the names templates read:
:mod:`.chat_messages`). The template's variables are the messages,
``tools``, ``documents``, ``add_generation_prompt``, the special-token strings
(``bos_token``, ``eos_token``...) and any extra keyword (``enable_thinking=False``).

A template is code from the Hub, so it renders within budgets that ``transformers`` does not
set, and which change no output of a template that keeps to them (:mod:`.chat_limits`):
:data:`MAX_STEPS` steps (loop iterations, calls, filters, tests, operators), :data:`MAX_SECONDS`
seconds, :data:`MAX_SIZE` characters in any string, output or value's text and
:data:`MAX_ITEMS` items in any list (both checked before the value is built),
:data:`MAX_ALLOCATED` bytes built in all, and :data:`MAX_POWER_BITS` bits in an integer.
Whatever breaks the sandbox or a limit is a :class:`~zoo.tokenizers.ChatTemplateError`,
before anything runs away.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jinja2

from . import chat_limits as limits
from .chat_limits import (
    MAX_ALLOCATED,
    MAX_ITEMS,
    MAX_POWER_BITS,
    MAX_SECONDS,
    MAX_SIZE,
    MAX_STEPS,
)
from .chat_messages import REASONING_FIELDS, plain, plain_messages
from .chat_sandbox import GENERATION, GenerationSpans, compile_template
from .errors import ChatTemplateError

__all__ = [
    "MAX_ALLOCATED",
    "MAX_ITEMS",
    "MAX_LOOP_STEPS",
    "MAX_POWER_BITS",
    "MAX_SECONDS",
    "MAX_SIZE",
    "MAX_STEPS",
    "ChatTemplate",
    "compile_template",
    "plain_messages",
]

#: The former name of :data:`MAX_STEPS`, when only loop iterations were counted.
MAX_LOOP_STEPS = MAX_STEPS

#: Appended to the final message with ``continue_final_message`` to find where it ends.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


# -- rendering -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A tokenizer's chat template(s) and the special-token strings its template sees.

    Args:
        templates: template name -> Jinja source; a model with one template has only
            ``"default"``. With several, ``"tool_use"`` is picked when tools are given and
            ``"default"`` otherwise (as ``transformers`` picks).
        tokens: the variables ``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``,
            ``pad_token``, ``cls_token``, ``mask_token`` that the tokenizer defines.

    Raises:
        ChatTemplateError: no template, or a name or source that is not a string.
    """

    templates: Mapping[str, str]
    tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        templates = dict(self.templates)
        if not templates or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in templates.items()
        ):
            raise ChatTemplateError(
                f"a chat template is a non-empty mapping of names to Jinja sources, got "
                f"{self.templates!r:.200}"
            )
        tokens = dict(self.tokens)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in tokens.items()):
            raise ChatTemplateError(f"special-token variables must be strings, got {tokens!r:.200}")
        object.__setattr__(self, "templates", templates)
        object.__setattr__(self, "tokens", tokens)

    @property
    def source(self) -> str | dict[str, str]:
        """The template as ``transformers`` keeps it: a string, or a dict of named ones."""
        templates = dict(self.templates)
        return templates["default"] if list(templates) == ["default"] else templates

    def pick(self, chat_template: str | None = None, *, tools: bool = False) -> str:
        """The Jinja source to render: ``chat_template`` (a template's name, or a source),
        else the one for tools or the default."""
        if chat_template is not None:
            return self.templates.get(chat_template, chat_template)
        if tools and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        raise ChatTemplateError(
            "this tokenizer has several chat templates and none is the default; pass "
            f"chat_template=NAME, one of {', '.join(sorted(self.templates))}"
        )

    def render(
        self,
        messages: Any,
        *,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        **extra: Any,
    ) -> str:
        """The conversation rendered as the prompt text (see
        :meth:`zoo.tokenizers.Tokenizer.apply_chat_template`)."""
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message and add_generation_prompt do not go together: the "
                "first continues the last message, the second starts a new assistant turn"
            )
        source = self.pick(chat_template, tools=tools is not None)
        tools_data = plain(_tool_schemas(tools))
        if documents is not None and not all(isinstance(d, Mapping) for d in documents):
            raise ChatTemplateError("documents must be dicts (e.g. with 'title' and 'text')")
        chat = plain_messages(messages)
        final = None
        if continue_final_message:
            final = _tag_final(chat, continue_final_message, source)
        variables = {**self.tokens, **plain(extra)}
        text = _render(
            compile_template(source),
            messages=chat,
            tools=tools_data,
            documents=plain(documents),
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
        return text if final is None else _cut_final(text, final)

    def render_opening(self, *, tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The generation prompt before any message (``messages=[]``, the prompt asked for):
        what the template writes before a reply that opens the conversation."""
        source = self.pick(tools=tools is not None)
        variables = {**self.tokens, "tools": plain(_tool_schemas(tools))}
        template = compile_template(source)
        return _render(template, messages=[], add_generation_prompt=True, **variables)

    def render_spans(
        self,
        messages: Any,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        **extra: Any,
    ) -> tuple[str, list[tuple[int, int]]]:
        """The whole conversation rendered (as :meth:`render`, no generation prompt), and the
        ``(start, end)`` character offsets of the text of each ``{% generation %}`` block in
        it, in order: what ``transformers`` reads for ``return_assistant_tokens_mask``. A
        template without the tag gives no spans."""
        tracker = GenerationSpans()
        token = GENERATION.set(tracker)
        try:
            text = self.render(messages, tools=tools, chat_template=chat_template, **extra)
        finally:
            GENERATION.reset(token)
        return text, list(tracker.spans)


def _tool_schemas(tools: Sequence[Any] | None) -> list[Any] | None:
    if tools is None:
        return None
    if isinstance(tools, (str, Mapping)) or not isinstance(tools, Sequence):
        raise ChatTemplateError("tools must be a list of JSON schemas (dicts)")
    for tool in tools:
        if not isinstance(tool, Mapping):
            raise ChatTemplateError(
                f"each tool must be a JSON schema (a dict), got {type(tool).__name__}; "
                "describe a Python function as {'type': 'function', 'function': {'name': ..., "
                "'description': ..., 'parameters': {...}}}"
            )
    return list(tools)


def _tag_final(chat: list[dict[str, Any]], field: bool | str, source: str) -> str:
    """Append the continuation tag to the final message (as ``transformers`` does) and
    return that message's text."""
    name = field if isinstance(field, str) else "content"
    final = chat[-1].get(name)
    if final is None:
        raise ChatTemplateError(
            f"continue_final_message is set but the final message has no {name!r} to continue"
        )
    fields = [name]
    if name in REASONING_FIELDS:
        fields = [f for f in REASONING_FIELDS if chat[-1].get(f) == final]
    if not any(f in source for f in fields):
        raise ChatTemplateError(
            f"continue_final_message is set to {name!r}, which the chat template never reads"
        )
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if isinstance(block, dict) and "text" in block:
                text = block["text"]
                block["text"] = text + _CONTINUE_TAG
                return str(text)
        raise ChatTemplateError(
            "continue_final_message is set but the final message has no text to continue"
        )
    for f in fields:
        chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    return str(final)


def _cut_final(text: str, final: str) -> str:
    """``text`` cut where the tagged final message ends."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise ChatTemplateError(
            "continue_final_message is set but the final message does not appear in the "
            "rendered chat: the template changes or drops it"
        )
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()


def _render(template: jinja2.Template, **variables: Any) -> str:
    """Render within the budgets of :mod:`.chat_limits`, the output's size among them."""
    token = limits.start()
    pieces: list[str] = []
    size = 0
    tracker = GENERATION.get()  # where {% generation %} blocks fall, when asked
    try:
        parts: Iterator[str] = template.generate(**variables)
        for piece in parts:
            size += len(piece)
            limits.check_text(size, "the template's output reached")
            pieces.append(piece)
            if tracker is not None:
                tracker.size = size
    except jinja2.exceptions.SecurityError as exc:
        raise ChatTemplateError(f"the chat template was stopped by the sandbox: {exc}") from None
    except jinja2.exceptions.TemplateError as exc:  # raise_exception(...) and undefined names
        raise ChatTemplateError(f"the chat template refused the conversation: {exc}") from None
    except (RecursionError, MemoryError) as exc:  # what the budgets did not foresee
        raise ChatTemplateError(
            f"the chat template was stopped: {type(exc).__name__}: {exc or 'out of memory'} "
            "(calls nested too deeply, or a value too large for this machine)"
        ) from None
    except OverflowError as exc:  # range() beyond MAX_RANGE, a float too large
        raise ChatTemplateError(f"the chat template was stopped: {exc}") from None
    except Exception as exc:  # TypeError, ZeroDivisionError...: the template's own failure
        raise ChatTemplateError(
            f"the chat template failed on this conversation ({type(exc).__name__}: {exc}); "
            "check the messages' roles and content"
        ) from None
    finally:
        limits.stop(token)
    return "".join(pieces)
