"""A sequence's new tokens as text, piece by piece, as a server streams them.

The text is decoded the way :func:`zoo.generate` decodes it (the new tokens after their
prompt's, so the tokenizer's rules for joining tokens apply across the boundary), but
incrementally: each token decodes a short window, not the whole sequence. A piece is held
back while it ends inside a character split across tokens, or could be the start of a stop
string; the text ends before the first stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer

__all__ = ["CONTEXT_TOKENS", "TextStream"]

#: Prompt tokens decoded before the first new one (what joining rules look back at).
CONTEXT_TOKENS = 6


class TextStream:
    """The text of new tokens as they arrive, cut at the first stop string.

    Args:
        tokenizer: decodes the ids.
        context: the prompt's ids (its last :data:`CONTEXT_TOKENS` are decoded with the
            first new tokens and their text dropped).
        stops: stop strings; the text ends before the first one found.

    :meth:`push` takes one token and returns the text that is ready to send; :meth:`finish`
    returns the rest. Joined, the pieces are the whole text.
    """

    def __init__(self, tokenizer: Tokenizer, context: Sequence[int], stops: Sequence[str]) -> None:
        self._tok = tokenizer
        self._ids = list(context[-CONTEXT_TOKENS:])
        self._prefix = 0  # window start: ids before it are spelled out in self.text
        self._read = len(self._ids)  # ids up to here are spelled out in self.text
        self._stops = tuple(stops)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        #: The text decoded so far (up to the first stop string once :attr:`stopped`).
        self.text = ""
        self._sent = 0
        #: Whether a stop string ended the text.
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one new token; return the text now ready to send (often ``""``)."""
        if self.stopped:
            return ""
        self._ids.append(token)
        head = self._tok.decode(self._ids[self._prefix : self._read])
        whole = self._tok.decode(self._ids[self._prefix :])
        if len(whole) <= len(head) or whole.endswith("\ufffd"):
            return ""  # nothing new yet, or a character split across tokens: wait for the rest
        self.text += whole[len(head) :]
        self._prefix, self._read = self._read, len(self._ids)
        return self._ready(final=False)

    def finish(self) -> str:
        """The text not sent yet (a held-back tail, a character left incomplete)."""
        if not self.stopped and self._read < len(self._ids):
            head = self._tok.decode(self._ids[self._prefix : self._read])
            whole = self._tok.decode(self._ids[self._prefix :])
            self.text += whole[len(head) :]
            self._read = len(self._ids)
        return self._ready(final=True)

    def _ready(self, *, final: bool) -> str:
        if not self.stopped and self._stops:
            start = max(0, self._sent - self._hold)  # a stop string may begin in held text
            cuts = [i for i in (self.text.find(s, start) for s in self._stops) if i >= 0]
            if cuts:
                self.text = self.text[: min(cuts)]
                self.stopped = True
        end = len(self.text) if final or self.stopped else len(self.text) - self._hold
        if end <= self._sent:
            return ""
        piece = self.text[self._sent : end]
        self._sent = end
        return piece
