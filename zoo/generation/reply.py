"""When a reply ends, and its text so far: the one end-of-sequence and stop check of
:func:`zoo.generate`'s text forms, ``zoo chat`` and ``zoo serve``.

A reply ends at the first end id (end-of-text, end-of-turn: not part of its text), at the
first stop string (its text ends before it) or after ``max_new_tokens``. The core that
decodes batches of ids (:mod:`zoo.generation.core`) stops a batch once every row has picked
an end id; a reply's text is decided here. Plain Python: importing it imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .detokenize import Decoder, TextStream

if TYPE_CHECKING:
    from .config import GenerationConfig

__all__ = ["Reply", "until_eos"]


class Reply:
    """One reply as its tokens are picked: :meth:`push` each one, send what it returns,
    and stop once :attr:`reason` is set; :meth:`finish` returns the rest of the text.

    Args:
        tokenizer: decodes the new tokens.
        context: the prompt's ids the text follows (empty for a text that stands alone).
        config: ``stop``, ``max_new_tokens`` and (unless ``end_ids`` is given) the end ids.
        end_ids: the ids that end the reply, instead of ``config.end_ids``.
    """

    def __init__(
        self,
        tokenizer: Decoder,
        context: Sequence[int],
        config: GenerationConfig,
        end_ids: Iterable[int] | None = None,
    ) -> None:
        self.text = TextStream(tokenizer, context, config.stop)
        self.end_ids = frozenset(config.end_ids if end_ids is None else end_ids)
        self.max_new_tokens = config.max_new_tokens
        #: Tokens taken (an end id included).
        self.generated = 0
        #: Why the reply ended: ``"stop"`` (an end id or a stop string), ``"length"``
        #: (``max_new_tokens``), or ``None`` while it goes on.
        self.reason: str | None = None

    def push(self, token: int) -> str:
        """Take a picked token; return the text now ready to send (often ``""``)."""
        self.generated += 1
        if token in self.end_ids:
            self.reason = "stop"
            return ""
        piece = self.text.push(token)
        if self.text.stopped:
            self.reason = "stop"
        elif self.generated >= self.max_new_tokens:
            self.reason = "length"
        return piece

    def finish(self) -> str:
        """The text not sent yet (held back for a stop string, or an unfinished character)."""
        return self.text.finish()


def until_eos(tokens: list[int], end_ids: int | Sequence[int] | None) -> list[int]:
    """New tokens up to and including the first end id (one id, or any of several)."""
    ends = {end_ids} if isinstance(end_ids, int) else set(end_ids or ())
    for i, token in enumerate(tokens):
        if token in ends:
            return tokens[: i + 1]
    return tokens
