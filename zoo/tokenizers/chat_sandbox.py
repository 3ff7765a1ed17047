"""The sandbox a chat template is compiled in: ``transformers``' environment (an immutable
Jinja sandbox with ``trim_blocks``, ``lstrip_blocks``, loop controls and the ``{% generation
%}`` tag; the globals ``raise_exception``, ``strftime_now``, a ``dict`` and a ``namespace``
that refuse private names), compiled so that every step, value and output passes through the
budgets of :mod:`.chat_limits` (loop bodies count steps, texts and literal containers are
measured before they are built, operators, calls, filters and tests are checked by
:mod:`.chat_operations`)."""

from __future__ import annotations

import contextvars
import dataclasses
import functools
from collections.abc import Callable, Sized
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
from . import chat_operations as operations
from .errors import ChatTemplateError

__all__ = ["GENERATION", "GenerationSpans", "compile_template"]


@dataclasses.dataclass
class GenerationSpans:
    """Where the ``{% generation %}`` blocks of one render fall: ``size`` is the length of
    the output so far (kept by the renderer), ``spans`` the ``(start, end)`` character
    offsets of each block's text, as ``transformers`` records them for
    ``return_assistant_tokens_mask``."""

    size: int = 0
    spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)


#: The spans of the render under way, when its caller asked for them (else ``None``).
GENERATION: contextvars.ContextVar[GenerationSpans | None] = contextvars.ContextVar(
    "zoo_generation_spans", default=None
)

#: Filters replaced by bounded equivalents (same results).
_REPLACED_FILTERS: dict[str, Callable[..., Any]] = {
    "sum": operations.do_sum,
    "wordcount": operations.do_wordcount,
    "tojson": operations.tojson,
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
    masks (as in ``transformers``); renders its body unchanged, and records where it falls
    when a :class:`GenerationSpans` is active (:data:`GENERATION`)."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's own class attribute)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        text = caller()
        tracker = GENERATION.get()
        if tracker is not None:  # the output so far ends where this block's text starts
            tracker.spans.append((tracker.size, tracker.size + len(text)))
        return text


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
        operations.check_binop(operator, left, right)
        result = super().call_binop(context, operator, left, right)
        return operations.after_binop(operator, left, right, result)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        """A call from the template (macro, method, global, ``caller``, ``loop``): a step and
        a level of nesting, refused when a string's method would build too much (``ljust``,
        ``replace``...)."""
        meter = limits.enter_call()
        try:
            args = operations.prepare_call(__obj, args, kwargs)
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
        """``str.format`` and ``format_map`` through :class:`.chat_operations.BoundedFormatter`."""
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        owner = value.__self__
        formatter: operations.BoundedFormatter
        if isinstance(owner, markupsafe.Markup):
            formatter = operations.BoundedEscapeFormatter(self, escape=owner.escape)
        else:
            formatter = operations.BoundedFormatter(self)
        is_format_map = value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> str:
            if not is_format_map:
                return type(owner)(formatter.vformat(owner, args, kwargs))
            if kwargs or len(args) != 1:
                return wrapper(*args, **kwargs)  # the error str.format_map raises
            return type(owner)(formatter.vformat(owner, (), args[0]))

        return functools.update_wrapper(bounded, value)


#: The most characters of a template's own error message passed on (to a log, an HTTP body).
MAX_MESSAGE = 1000


def _raise_exception(message: str) -> None:
    text = str(message)
    if len(text) > MAX_MESSAGE:
        text = f"{text[:MAX_MESSAGE]}... (cut: {len(text):,} characters in all)"
    raise jinja2.exceptions.TemplateError(text)


def _strftime_now(format: str) -> str:
    limits.check_text(operations.strftime_size(format), "strftime_now() would write a string of")
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict`` in a template: builds dictionaries, exposes nothing of the type; refuses
    one of more than :data:`.chat_limits.MAX_ITEMS` items before it is built."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        first = args[0] if args else ()
        items = len(first) if isinstance(first, Sized) else 0
        limits.check_items(items + len(kwargs), "dict() would build a dict of")
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        if args and isinstance(args[0], Sized):
            limits.check_items(len(args[0]), "dict.fromkeys() would build a dict of")
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
    env.filters = {name: operations.bounded_filter(name, f) for name, f in env.filters.items()}
    env.tests = {name: operations.bounded_test(test) for name, test in env.tests.items()}
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
