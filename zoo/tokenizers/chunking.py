"""Where a long text may be cut so that encoding the pieces one by one gives exactly the ids
of encoding it whole: what keeps a tokenizer's memory bounded on long text of any shape.

A cut at position ``p`` is safe when the tokenizer's pre-tokenisation always ends a word at
``p`` and nothing before ``p`` depends on what comes after it (and the reverse). Two kinds of
position are safe for every pre-tokenizer zoo cuts for:

* *before ASCII whitespace* (space, tab, newline, carriage return) that follows a character
  that is not whitespace: ``word|\\nnext``, ``word|  next``. BERT's pre-tokenizer splits
  there and drops the whitespace; GPT-2's regex (``'s| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|
  \\s+(?!\\S)|\\s+``) ends every word at its first whitespace and has no look-behind. A cut
  inside a run of whitespace is *not* safe for GPT-2 (``"\\n\\n"`` is one token before a
  word's end and two before a word), nor is a cut after one.
* *between a letter or digit and a punctuation mark* (``fox|,42``, ``don|'t``), for text
  without whitespace: BERT isolates punctuation; GPT-2's letter, digit and punctuation words
  each end where the class changes, and a contraction (``'t``) starts at the mark.

No cut falls inside a string the library extracts before pre-tokenising (special and added
tokens). A tokenizer whose normalizer or pre-tokenizer is not known to keep these guarantees
(Llama's ``Prepend("▁")``, a byte-level BPE that adds a prefix space, no pre-tokenizer) is
not cut: its text is encoded whole, as exact but unbounded.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator

__all__ = ["CUT_ANYWHERE", "CUT_WORDS", "pieces"]

#: Safe cut before ASCII whitespace that follows a non-whitespace character.
_BEFORE_SPACE = re.compile(r"(?<=\S)(?=[ \t\n\r])")
#: Candidates of a cut between a word character and a mark (checked by :func:`_letter_mark`).
_BEFORE_MARK = re.compile(r"(?<=\w)(?=[^\w\s])")
_ASCII_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
#: Unicode 3.2's character database (characters it lacks are unassigned, ``Cn``), and with
#: Python's own the two a cut's categories must agree in.
_OLD_UNICODE = unicodedata.ucd_3_2_0
_TABLES = (unicodedata, _OLD_UNICODE)

#: Cut at word boundaries (the two kinds above): BERT's and GPT-2's pre-tokenizers.
CUT_WORDS = "words"
#: Cut between any two characters: the byte tokenizer (each byte its own id).
CUT_ANYWHERE = "anywhere"


def _letter_mark(text: str, p: int) -> bool:
    """Whether ``text[p - 1]`` is a letter or digit (Unicode ``L*`` / ``N*``) and ``text[p]``
    punctuation as BERT defines it (``P*`` or ASCII punctuation) and GPT-2 does (not a letter,
    digit or whitespace), in both Python's Unicode tables and Unicode 3.2's
    (:data:`_OLD_UNICODE`): the tokenizers library's tables may be of any version between,
    and a category that changed (U+00AD, punctuation in 3.2, a format character since) or a
    character newer than its tables (U+2E52, Unicode 14: BERT kept ``00000⹒`` one word) is
    no word boundary to rely on."""
    before, after = text[p - 1], text[p]
    if any(table.category(before)[0] not in "LN" for table in _TABLES):
        return False
    return after in _ASCII_PUNCTUATION or all(
        table.category(after).startswith("P") for table in _TABLES
    )


def _inside(text: str, p: int, protected: Iterable[str]) -> bool:
    """Whether ``p`` falls strictly inside an occurrence of one of the ``protected`` strings."""
    for token in protected:
        n = len(token)
        if n < 2:
            continue
        found = text.find(token, max(0, p - n + 1), p + n - 1)
        while found != -1 and found < p:
            if found + n > p:
                return True
            found = text.find(token, found + 1, p + n - 1)
    return False


def _next_cut(text: str, at: int, rule: str, protected: tuple[str, ...]) -> int | None:
    """The first safe cut at or after ``at``, or ``None``. Searched window by window, so
    finding every cut of a text reads it about once."""
    if rule == CUT_ANYWHERE:
        for p in range(at, len(text)):
            if not _inside(text, p, protected):
                return p
        return None
    window = 1 << 12
    start = at
    while start < len(text):
        end = min(len(text), start + window)
        cuts = [
            m.start()
            for pattern in (_BEFORE_SPACE, _BEFORE_MARK)
            for m in pattern.finditer(text, start, end)
            if pattern is _BEFORE_SPACE or _letter_mark(text, m.start())
        ]
        for p in sorted(cuts):
            if p > 0 and not _inside(text, p, protected):
                return p
        start, window = end, window * 2
    return None


def pieces(text: str, size: int, rule: str | None, protected: Iterable[str] = ()) -> Iterator[str]:
    """``text`` in consecutive pieces of about ``size`` characters, cut only where ``rule``
    (:data:`CUT_WORDS`, :data:`CUT_ANYWHERE`, or ``None``: never) allows and never inside a
    ``protected`` string. A piece grows past ``size`` when no safe cut comes sooner."""
    if rule is None or len(text) <= size:
        yield text
        return
    keep = tuple(protected)
    start = 0
    while len(text) - start > size:
        cut = _next_cut(text, start + size, rule, keep)
        if cut is None or cut >= len(text):
            break
        yield text[start:cut]
        start = cut
    yield text[start:]
