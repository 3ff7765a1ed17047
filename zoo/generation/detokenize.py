"""New tokens as text, piece by piece as they arrive: the one incremental detokeniser of
:func:`zoo.generate` (``stream=True``), ``zoo chat`` and ``zoo serve``.

The text is the new tokens decoded after their prompt's (the tokenizer's rules for joining
tokens apply across the boundary: a WordPiece ``##`` piece, a SentencePiece leading space),
but each token decodes a short window, not the whole sequence, so a reply of ``n`` tokens
costs ``O(n)`` characters of decoding. A piece is held back while it ends inside a character
split across tokens, or could be the start of a stop string; the text ends before the first
stop string. Plain Python: importing it imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["CONTEXT_TOKENS", "MAX_PENDING", "Decoder", "TextStream", "cut_at_stop"]

#: Prompt tokens decoded before the first new one (what joining rules look back at).
CONTEXT_TOKENS = 6

#: Tokens held back at most while their text ends in an unfinished character (U+FFFD); past
#: that, the text of all but the last 3 is settled (a UTF-8 character has at most 4 bytes, so
#: bytes that wait for more are in the last 3 tokens), keeping every window short.
MAX_PENDING = 8

_REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    """What the detokeniser needs of a tokenizer."""

    def decode(self, ids: list[int]) -> str: ...


def cut_at_stop(text: str, stops: Sequence[str], start: int = 0) -> tuple[str, bool]:
    """``text`` up to the first of ``stops`` to appear in it at or after ``start`` (the one
    that ends first, as the text grows character by character; of two that end together,
    the longer), and whether one was found. Where it is cut does not depend on how the text
    arrives: in one piece, or token by token."""
    found = [(i + len(s), i) for i, s in ((text.find(s, start), s) for s in stops) if i >= 0]
    return (text[: min(found)[1]], True) if found else (text, False)


class TextStream:
    """The text of new tokens as they arrive, cut at the first stop string.

    Args:
        tokenizer: decodes the ids.
        context: the prompt's ids (its last :data:`CONTEXT_TOKENS` are decoded with the
            first new tokens and their text dropped); empty for a text that stands alone
            (an encoder-decoder's target).
        stops: stop strings; the text ends before the first one found.

    :meth:`push` takes one token and returns the text that is ready to send; :meth:`finish`
    returns the rest. Joined, the pieces are the whole text: the new tokens decoded after
    the context, up to the first stop string.
    """

    def __init__(self, tokenizer: Decoder, context: Sequence[int], stops: Sequence[str]) -> None:
        self._tok = tokenizer
        self._ids = list(context[-CONTEXT_TOKENS:])
        self._prefix = 0  # window start: the ids before it are spelled out in self.text
        self._read = len(self._ids)  # the ids up to here are spelled out in self.text
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
        if self._spell(final=False):
            return self._ready(final=False)
        return ""

    def finish(self) -> str:
        """The text not sent yet (a held-back tail, a character left incomplete)."""
        if not self.stopped and self._read < len(self._ids):
            self._spell(final=True)
        return self._ready(final=True)

    def _spell(self, *, final: bool) -> bool:
        """Add the text of the ids after ``_read`` to :attr:`text` (decoding the window from
        ``_prefix``, so joining rules see the token before); whether any was added. Unless
        ``final``, text that ends in an unfinished character waits for the rest."""
        head = self._tok.decode(self._ids[self._prefix : self._read])
        whole = self._tok.decode(self._ids[self._prefix :])
        if final or (len(whole) > len(head) and not whole.endswith(_REPLACEMENT)):
            self._take(whole[len(head) :], len(self._ids))
            return True
        if len(self._ids) - self._read > MAX_PENDING:
            return self._settle(head, whole)
        return False  # nothing new yet, or a character split across tokens

    def _settle(self, head: str, whole: str) -> bool:
        """Take the text of all the pending ids but the last 3 (or fewer) whose text no
        later id can change: the window's text starts with it. Bytes that never form a
        character (U+FFFD for good) are sent that way, and the window stays short."""
        for end in range(len(self._ids) - 3, self._read, -1):
            text = self._tok.decode(self._ids[self._prefix : end])
            if len(text) >= len(head) and whole.startswith(text):
                self._take(text[len(head) :], end)
                return True
        return False

    def _take(self, new: str, read: int) -> None:
        """Append ``new`` (the text of the ids up to ``read``) and move the window on."""
        self.text += new
        self._prefix, self._read = self._read, read

    def _ready(self, *, final: bool) -> str:
        if not self.stopped and self._stops:
            start = max(0, self._sent - self._hold)  # a stop string may begin in held text
            self.text, self.stopped = cut_at_stop(self.text, self._stops, start)
        end = len(self.text) if final or self.stopped else len(self.text) - self._hold
        if end <= self._sent:
            return ""
        piece = self.text[self._sent : end]
        self._sent = end
        return piece
