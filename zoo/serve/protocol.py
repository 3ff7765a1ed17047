"""The OpenAI HTTP API's requests and errors, as ``zoo serve`` reads and writes them.

Requests are pydantic models in strict mode (``"5"`` is not a number of tokens) that ignore
fields they do not know (clients send more than a server uses) but refuse the known ones
``zoo serve`` cannot honour (``n`` other than 1, ``logprobs``, penalties, tools...) instead of
silently ignoring them. Every error is an :class:`ApiError`, written as OpenAI writes it:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ApiError",
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "StreamOptions",
    "TextPart",
    "error_body",
]


class ApiError(Exception):
    """An error answered in the OpenAI shape.

    Args:
        status: the HTTP status (4xx for the client's mistakes).
        message: what was wrong and how to fix it.
        type: OpenAI's error type (``invalid_request_error``...).
        code: a short machine-readable code, or ``None``.
        param: the request field at fault, or ``None``.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {...}}``."""
        return error_body(self.message, type=self.type, code=self.code, param=self.param)


def error_body(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``, OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Request):
    """``stream_options``: ``include_usage`` adds a last chunk with the token counts."""

    include_usage: bool = False


PositiveInt = Annotated[int, Field(ge=1)]
Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(gt=0, le=1)]
Stop = str | Annotated[list[str], Field(max_length=16)]
#: Most characters in a request's ``cache_salt``.
MAX_CACHE_SALT = 1024
#: ``cache_salt`` (vLLM's): requests share prefix-cache blocks only with requests of the same
#: salt (and, unless the server shares its cache across keys, of the same API key).
CacheSalt = Annotated[str, Field(min_length=1, max_length=MAX_CACHE_SALT)]


class _Sampling(_Request):
    """The settings both endpoints share (``None`` means the default, as in OpenAI's API)."""

    model: str
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: PositiveInt | None = None  # not OpenAI's; vLLM and llama.cpp take it too
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: Stop | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    cache_salt: CacheSalt | None = None

    def unsupported(self) -> list[str]:
        """The fields set to something ``zoo serve`` does not do."""
        found = []
        if self.n not in (None, 1):
            found.append("n (only n = 1)")
        if self.presence_penalty not in (None, 0):
            found.append("presence_penalty")
        if self.frequency_penalty not in (None, 0):
            found.append("frequency_penalty")
        if self.logit_bias:
            found.append("logit_bias")
        return found

    def stops(self) -> tuple[str, ...]:
        """``stop`` as a tuple."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


#: A completion prompt: text, a list of texts, token ids, or a list of id lists.
Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    prompt: Prompt
    max_tokens: PositiveInt | None = 16
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[str]:
        found = super().unsupported()
        if self.echo:
            found.append("echo")
        if self.logprobs is not None:
            found.append("logprobs")
        if self.best_of not in (None, 1):
            found.append("best_of")
        if self.suffix:
            found.append("suffix")
        return found


class TextPart(_Request):
    """One part of a message's content; only text parts are read."""

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a conversation. Fields beyond ``role`` and ``content`` (``name``,
    ``tool_calls``...) are kept and passed on to the chat template."""

    model_config = ConfigDict(strict=True, extra="allow")

    role: str
    content: str | list[TextPart] | None = None

    def plain(self) -> dict[str, Any]:
        """The message as the chat template sees it: text parts joined into one string."""
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            message["content"] = "\n".join(part.text for part in self.content)
        return message


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> list[str]:
        found = super().unsupported()
        if self.logprobs:
            found.append("logprobs")
        if self.top_logprobs is not None:
            found.append("top_logprobs")
        if self.tools:
            found.append("tools")
        if self.response_format and self.response_format.get("type") != "text":
            found.append("response_format (only text)")
        return found
