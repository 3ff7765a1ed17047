"""A chat request's conversation as prompt text, through the model's chat template."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..tokenizers import ChatTemplateError
from .protocol import ApiError

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer

__all__ = ["ChatTemplates"]


class ChatTemplates:
    """Renders conversations with ``tokenizer``'s chat template
    (:meth:`zoo.tokenizers.Tokenizer.apply_chat_template`); a model without one, or a
    conversation its template refuses, is a 400."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    @property
    def available(self) -> bool:
        """Whether the model has a chat template."""
        return self.tokenizer.chat_template is not None

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The prompt text of ``messages``, ending in the start of the assistant's turn (the
        caller encodes it with every special token's string as its id)."""
        if not self.available:
            raise ApiError(
                400,
                f"this model has no chat template (its tokenizer, {self.tokenizer.name}, "
                "defines none), so /v1/chat/completions cannot format a conversation for it; "
                "send text to /v1/completions instead, or serve an instruct model",
                code="no_chat_template",
                param="messages",
            )
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except ChatTemplateError as exc:
            raise ApiError(400, str(exc), param="messages") from None
