"""Chat templates: a conversation rendered as the prompt an instruct model was trained on.

A template is the Jinja source a model ships in ``tokenizer_config.json`` (``chat_template``)
or ``chat_template.jinja``. It is rendered exactly as ``transformers`` renders it
(``transformers/utils/chat_template_utils.py``, 5.x): the same sandboxed environment
(``ImmutableSandboxedEnvironment`` with ``trim_blocks``, ``lstrip_blocks``, loop controls and
the ``{% generation %}`` tag), the same globals (``raise_exception``, ``strftime_now``, a
``dict`` and a ``namespace`` that refuse private names), the same ``tojson`` filter, and the
same preparation of the messages (``None`` values dropped, message objects made plain data,
reasoning copied under the names templates read). The template's variables are the messages,
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
import functools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
import jinja2.utils
import markupsafe
from jinja2.sandbox import ImmutableSandboxedEnvironment

from . import chat_limits as limits
from .chat_limits import (
    MAX_ALLOCATED,
    MAX_ITEMS,
    MAX_POWER_BITS,
    MAX_SECONDS,
    MAX_SIZE,
    MAX_STEPS,
)
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

#: Reasoning is passed under these names; templates read the first (transformers 5).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
#: Appended to the final message with ``continue_final_message`` to find where it ends.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
#: Filters replaced by bounded equivalents (same results).
_REPLACED_FILTERS: dict[str, Callable[..., Any]] = {
    "sum": limits.do_sum,
    "wordcount": limits.do_wordcount,
    "tojson": limits.tojson,
}


def _plain_output(frame: jinja2.compiler.Frame) -> bool:
    """Whether output in ``frame`` is plain ``str`` (no autoescape, which chat templates
    never turn on)."""
    return not (frame.eval_ctx.volatile or frame.eval_ctx.autoescape)


class _CodeGenerator(jinja2.compiler.CodeGenerator):
    """Jinja's compiler, with the budgets' hooks: each pass through a ``for`` loop's body
    counts a step (``environment.loop_step()``); every ``~``, ``{{ value }}`` and literal
    list, tuple or dict is measured before it is built (``environment.join_texts``,
    ``environment.text``, ``environment.built``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop_bodies: list[Any] = []  # the bodies of the for loops being compiled

    def visit_For(self, node: jinja2.nodes.For, frame: jinja2.compiler.Frame) -> None:
        self._loop_bodies.append(node.body)
        try:
            super().visit_For(node, frame)
        finally:
            self._loop_bodies.pop()

    def blockvisit(self, nodes: Any, frame: jinja2.compiler.Frame) -> None:
        if frame.loop_frame and self._loop_bodies and nodes is self._loop_bodies[-1]:
            self.writeline("environment.loop_step()")
        super().blockvisit(nodes, frame)

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: jinja2.compiler.Frame) -> None:
        if not _plain_output(frame):
            super().visit_Concat(node, frame)
            return
        self.write("environment.join_texts((")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write("))")

    def _output_child_pre(
        self, node: jinja2.nodes.Expr, frame: jinja2.compiler.Frame, finalize: Any
    ) -> None:
        if not _plain_output(frame) or finalize.src is not None:
            super()._output_child_pre(node, frame, finalize)
        else:
            self.write("environment.text(")

    def _built(self, visit: Callable[..., None], node: Any, frame: Any) -> None:
        if getattr(node, "ctx", "load") != "load":  # an assignment's target
            visit(node, frame)
            return
        self.write("environment.built(")
        visit(node, frame)
        self.write(")")

    def visit_List(self, node: jinja2.nodes.List, frame: jinja2.compiler.Frame) -> None:
        self._built(super().visit_List, node, frame)

    def visit_Tuple(self, node: jinja2.nodes.Tuple, frame: jinja2.compiler.Frame) -> None:
        self._built(super().visit_Tuple, node, frame)

    def visit_Dict(self, node: jinja2.nodes.Dict, frame: jinja2.compiler.Frame) -> None:
        self._built(super().visit_Dict, node, frame)


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: marks the assistant's text for training
    masks in ``transformers``; renders its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's own class attribute)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _Sandbox(ImmutableSandboxedEnvironment):
    """``transformers``' environment (an immutable sandbox) with the budgets of
    :mod:`.chat_limits`: every operator, call, filter and test is a step, measured before it
    runs and checked after."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})
    concat = staticmethod(limits.concat)  # macro, block and {% set %} bodies

    loop_step = staticmethod(limits.step)
    built = staticmethod(limits.built)
    text = staticmethod(limits.text)
    join_texts = staticmethod(limits.join_texts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """``left operator right``: a step, refused when the result would be too large."""
        limits.step()
        if operator == "+" and type(left) is str and type(right) is str:  # most, made fast
            limits.check_text(len(left) + len(right))
            return limits.built(left + right)
        limits.check_binop(operator, left, right)
        result = super().call_binop(context, operator, left, right)
        return limits.after_binop(operator, left, right, result)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        """A call from the template (macro, method, global, ``caller``, ``loop``): a step and
        a level of nesting, refused when a string's method would build too much (``ljust``,
        ``replace``...)."""
        meter = limits.enter_call()
        try:
            args = limits.prepare_call(__obj, args, kwargs)
            return limits.built(super().call(__context, __obj, *args, **kwargs))
        finally:
            limits.leave_call(meter)

    def getitem(self, obj: Any, argument: Any) -> Any:
        """``obj[argument]``; a slice is a new value, charged."""
        value = super().getitem(obj, argument)
        if isinstance(argument, slice):
            limits.step()
            return limits.built(value)
        return value

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format`` and ``format_map`` through :class:`.chat_limits.BoundedFormatter`."""
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        owner = value.__self__
        formatter: limits.BoundedFormatter
        if isinstance(owner, markupsafe.Markup):
            formatter = limits.BoundedEscapeFormatter(self, escape=owner.escape)
        else:
            formatter = limits.BoundedFormatter(self)
        is_format_map = value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> str:
            if not is_format_map:
                return type(owner)(formatter.vformat(owner, args, kwargs))
            if kwargs or len(args) != 1:
                return wrapper(*args, **kwargs)  # the error str.format_map raises
            return type(owner)(formatter.vformat(owner, (), args[0]))

        return functools.update_wrapper(bounded, value)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:
    limits.check_text(limits.strftime_size(format), "strftime_now() would write a string of")
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict`` in a template: builds dictionaries, exposes nothing of the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace`` in a template, refusing names that start with ``_``."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # (Jinja's trick: namespace(self=...))
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"got {name!r}"
            )


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template of ``source`` (cached), in the sandbox described above.

    Raises:
        ChatTemplateError: ``source`` is not valid Jinja, or is longer than
            :data:`.chat_limits.MAX_SOURCE` characters or :data:`.chat_limits.MAX_NODES`
            syntax nodes.
    """
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_Generation, jinja2.ext.loopcontrols],
    )
    env.filters.update(_REPLACED_FILTERS)
    env.filters = {name: limits.bounded_filter(name, f) for name, f in env.filters.items()}
    env.tests = {name: limits.bounded_test(test) for name, test in env.tests.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        limits.check_source(source)
        tree = env.parse(source)
        limits.check_nodes(tree)
        return env.from_string(tree)
    except limits.LimitError as exc:
        raise ChatTemplateError(f"the chat template is refused before it compiles: {exc}") from None
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"the chat template is not valid Jinja (line {exc.lineno}: {exc.message})"
        ) from None
    except (RecursionError, MemoryError) as exc:  # a source nested beyond the parser's stack
        raise ChatTemplateError(
            f"the chat template could not be compiled ({type(exc).__name__}): it is nested too "
            "deeply or too large"
        ) from None


# -- the messages, as transformers prepares them ---------------------------------------------
def _as_dicts(value: Any) -> Any:
    """Message objects (dataclasses, pydantic models such as the OpenAI client's) as dicts,
    everything else as it is."""
    if isinstance(value, Mapping):
        return {key: _as_dicts(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_dicts(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_as_dicts(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _as_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _as_dicts(value.model_dump())
    return value


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types only, so a template sees no object's methods;
    anything else becomes ``"<TypeName>"`` (as ``transformers`` does)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def plain_messages(messages: Any) -> list[dict[str, Any]]:
    """The conversation as a template sees it: each message a dict of plain data, keys whose
    value is ``None`` dropped (an OpenAI ``content=None``), and the reasoning copied under
    ``reasoning_content`` and ``thinking`` when given under any of their names.

    Raises:
        ChatTemplateError: not a list of messages (dicts, dataclasses or pydantic models).
    """
    messages = _as_dicts(getattr(messages, "messages", messages))
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ChatTemplateError(
            "messages must be a list of messages such as "
            f"[{{'role': 'user', 'content': 'Hi'}}], got {type(messages).__name__}"
        )
    if not messages:
        raise ChatTemplateError("the conversation is empty: give at least one message")
    chat = []
    for i, message in enumerate(messages):
        if isinstance(message, (list, tuple)):
            raise ChatTemplateError(
                "one conversation at a time: messages is a list of messages, not a batch of "
                "conversations (render each conversation on its own)"
            )
        if not isinstance(message, dict):
            raise ChatTemplateError(
                f"message {i} must be a dict with 'role' and 'content', got "
                f"{type(message).__name__}"
            )
        message = _plain({key: value for key, value in message.items() if value is not None})
        reasoning = next(
            (message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None
        )
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat


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
        tools_data = _plain(_tool_schemas(tools))
        if documents is not None and not all(isinstance(d, Mapping) for d in documents):
            raise ChatTemplateError("documents must be dicts (e.g. with 'title' and 'text')")
        chat = plain_messages(messages)
        final = None
        if continue_final_message:
            final = _tag_final(chat, continue_final_message, source)
        variables = {**self.tokens, **_plain(extra)}
        text = _render(
            compile_template(source),
            messages=chat,
            tools=tools_data,
            documents=_plain(documents),
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
        return text if final is None else _cut_final(text, final)


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
    if name in _REASONING_FIELDS:
        fields = [f for f in _REASONING_FIELDS if chat[-1].get(f) == final]
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
    try:
        parts: Iterator[str] = template.generate(**variables)
        for piece in parts:
            size += len(piece)
            limits.check_text(size, "the template's output reached")
            pieces.append(piece)
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
