"""A trainable subword tokenizer: byte-level BPE (``tokenizers`` library), one vocabulary
shared by source and target, as the encoder-decoder Transformer uses.

    >>> tok = SubwordBPE.train(texts, vocab_size=8000)
    >>> tok.save("run/tokenizer")          # tokenizer.json + zoo_tokenizer.json
    >>> tok = zoo.tokenizers.load_directory("run/tokenizer")

Byte-level means every string round-trips exactly and ``<unk>`` is never produced; it is there
so the model's special ids are the usual four.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

from ..options import MAX_DISTINCT_BYTES
from .chunking import CUT_WORDS, pieces
from .errors import TokenizerError, TokenizerInputError
from .hf_backend import HFTokenizer

__all__ = [
    "MAX_DISTINCT_BYTES",
    "MAX_VOCAB",
    "MAX_WORD_CHARS",
    "SPECIAL_TOKENS",
    "TRAIN_PIECE_CHARS",
    "SubwordBPE",
]

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
#: The special tokens, in id order (``<pad>`` = 0, ``<unk>`` = 1, ``<s>`` = 2, ``</s>`` = 3).
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, BOS, EOS)
_ROLES = {"pad": PAD, "unk": UNK, "bos": BOS, "eos": EOS}
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)
#: The most ids :meth:`SubwordBPE.train` accepts (2**24 = 16,777,216). The ``tokenizers``
#: trainer reserves memory for every id asked for before it reads any text (a large share of
#: a gigabyte for 2**28 ids; 2**31 abort the process in its allocator), and an embedding of
#: 2**24 rows is already 50 GB at width 768; the largest vocabularies in use are about 2**18.
MAX_VOCAB = 1 << 24

#: Training text reaches the trainer in pieces of about this many characters, cut where the
#: pre-tokenizer always ends a word (:mod:`~zoo.tokenizers.chunking`, as encoding cuts), so
#: the trainer counts the words of the whole text (a run with no such place is cut at twice
#: this length). Splitting one large piece into words takes the trainer many times the
#: piece's size in memory (docs/benchmarks.md, "Figures behind design choices").
TRAIN_PIECE_CHARS = 1 << 16
#: The longest piece: text with no place to cut for this long is cut anyway.
_MOST_PIECE_CHARS = 1 << 17
#: The longest word the trainer sees, in characters: a longer run of letters, digits,
#: punctuation or whitespace is learnt as words of this length. Each merge rewrites a word
#: once per occurrence of its pair, so one long word cost time in the square of its length
#: (a few MB of letters without a break stalled training for minutes:
#: docs/benchmarks.md, "Figures behind design choices"). Encoding is not affected.
MAX_WORD_CHARS = 256
#: Memory of a distinct word in the trainer beyond its bytes, counted against the budget.
_WORD_OVERHEAD = 8

#: GPT-2's split pattern (the ``ByteLevel`` pre-tokenizer's) with every run bounded by
#: :data:`MAX_WORD_CHARS`: the same words wherever they are shorter.
_BOUNDED_WORDS = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}{1,@}| ?\p{N}{1,@}| ?[^\s\p{L}\p{N}]{1,@}"
    r"|\s{1,@}(?!\S)|\s{1,@}"
).replace("@", str(MAX_WORD_CHARS))
#: What ``str.splitlines`` and ``split("\t")`` split at: with ``split_lines`` they end a text.
_LINE_BREAKS = "\t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
#: ``str.split()`` splits at ``\x1c``-``\x1f`` as well, which GPT-2's ``\s`` does not.
_NOT_SPACE = str.maketrans(dict.fromkeys("\x1c\x1d\x1e\x1f", "\x1a"))
#: Runs of whitespace (after :data:`_NOT_SPACE`): GPT-2's whitespace words.
_SPACE_RUNS = re.compile(r"\s\s+")


class SubwordBPE(HFTokenizer):
    """A trained byte-level BPE tokenizer with ``<pad> <unk> <s> </s>`` (ids 0-3).

    Create one with :meth:`train`, or load a saved one with
    :func:`zoo.tokenizers.load_directory` (or ``zoo.tokenizer("transformer-encdec",
    directory=...)``). ``encode(text, add_special_tokens=True)`` gives ``<s> ... </s>``.
    """

    kind = "subword-bpe"

    def __init__(self, tokenizer: tokenizers.Tokenizer, **kwargs: Any) -> None:
        kwargs.setdefault("name", "subword-bpe")
        kwargs.setdefault("roles", _ROLES)
        kwargs.setdefault("wrap", ("bos", "eos"))
        kwargs.setdefault("description", "byte-level BPE trained on your corpus (tokenizers)")
        kwargs["by_name"] = False  # a trained vocabulary always travels with its files
        super().__init__(tokenizer, **kwargs)

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        *,
        min_frequency: int = 2,
        name: str = "subword-bpe",
        split_lines: bool = False,
        max_distinct_bytes: int | None = MAX_DISTINCT_BYTES,
    ) -> SubwordBPE:
        """Learn a vocabulary of (at most) ``vocab_size`` ids from ``texts``.

        Texts of any length and shape train in bounded memory and time: they reach the
        trainer in pieces cut between words (:data:`TRAIN_PIECE_CHARS`), runs longer than
        :data:`MAX_WORD_CHARS` are learnt in words of that length, and reading stops (with a
        warning) once the distinct words seen reach ``max_distinct_bytes``.

        Args:
            texts: training text (source and target sentences alike), any iterable of str.
            vocab_size: ids wanted, special tokens and the 256 byte tokens included, at most
                :data:`MAX_VOCAB`. A small corpus may give fewer: size the model with the
                trained tokenizer's :attr:`vocab_size`.
            min_frequency: pairs seen fewer times are not merged.
            name: registry name stored with the tokenizer.
            split_lines: learn each line, and each tab-separated column of a line, as a text
                of its own: line breaks and tabs are dropped, as ``str.splitlines`` and
                ``split("\\t")`` would (what ``zoo train --train-tokenizer`` does with files).
            max_distinct_bytes: stop reading ``texts`` before the distinct
                whitespace-separated strings and runs of whitespace seen exceed this many
                UTF-8 bytes (plus 8 each): the trainer's memory grows with them, by up to
                ~120 bytes per byte (random words or Unicode). Ordinary text stays below the
                default (tinyshakespeare's 1.1 MB: 0.39 MB); varied prose of many MB can
                reach it, and is then learnt from its beginning. ``None``: no limit.

        Raises:
            TokenizerError: ``vocab_size`` too small or above :data:`MAX_VOCAB`,
                ``max_distinct_bytes`` not a positive int or None, or no text to learn from.
            TokenizerInputError: an item of ``texts`` that is not a str.
        """
        _check_vocab_size(vocab_size)
        if max_distinct_bytes is not None and (
            isinstance(max_distinct_bytes, bool)
            or not isinstance(max_distinct_bytes, int)
            or max_distinct_bytes < 1
        ):
            raise TokenizerError(
                f"max_distinct_bytes must be a positive int or None, got {max_distinct_bytes!r}"
            )
        if isinstance(texts, str):
            raise TokenizerInputError("train takes an iterable of texts, not one str; wrap it")
        feed = _Feed(texts, _DistinctWords(max_distinct_bytes))
        tokenizer = tokenizers.Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = _training_pre_tokenizer(split_lines)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(feed, trainer=trainer)
        if feed.texts == 0:
            raise TokenizerError("train got no texts: pass the corpus as an iterable of str")
        if feed.stopped:
            warnings.warn(
                f"SubwordBPE.train learnt from the first {feed.chars:,} characters of text "
                f"only: there its distinct words reached max_distinct_bytes="
                f"{max_distinct_bytes:,} and the rest was not read. Pass a larger "
                "max_distinct_bytes to SubwordBPE.train (zoo train --tokenizer-max-distinct; "
                "the trainer takes up to ~120 bytes of memory per byte of it), or None for no "
                "limit",
                stacklevel=2,
            )
        # Encoding splits words with the plain pre-tokenizer: the same words up to
        # MAX_WORD_CHARS, and the saved tokenizer.json is what it always was.
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        return cls(tokenizer, name=name)


def _check_vocab_size(vocab_size: int) -> None:
    """Refuse a ``vocab_size`` that is not an int in ``[_MIN_VOCAB, MAX_VOCAB]``."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TokenizerError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if vocab_size < _MIN_VOCAB:
        raise TokenizerError(
            f"vocab_size={vocab_size} is too small: a byte-level BPE needs at least "
            f"{_MIN_VOCAB} ids (256 bytes + {len(SPECIAL_TOKENS)} special tokens)"
        )
    if vocab_size > MAX_VOCAB:
        raise TokenizerError(
            f"vocab_size={vocab_size} is too large: at most {MAX_VOCAB:,} (2**24) ids. The "
            "tokenizers trainer reserves memory for every id before reading any text (2**31 "
            "abort the process), and a model's embedding of that many rows would not fit; "
            "real vocabularies have 30,000-260,000 ids"
        )


def _training_pre_tokenizer(split_lines: bool) -> pre_tokenizers.PreTokenizer:
    """GPT-2's byte-level split with runs bounded by :data:`MAX_WORD_CHARS`, after dropping
    line breaks and tabs when ``split_lines``."""
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(_BOUNDED_WORDS), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    if split_lines:
        steps.insert(0, pre_tokenizers.Split(Regex(f"[{_LINE_BREAKS}]"), behavior="removed"))
    return pre_tokenizers.Sequence(steps)


class _DistinctWords:
    """The UTF-8 bytes (plus :data:`_WORD_OVERHEAD` each) of the distinct
    whitespace-separated strings and runs of whitespace of the pieces admitted so far, at
    most ``limit``.

    The pre-tokenizer's words never cross whitespace (but for a leading space), so each
    distinct word is a leading space and part of one of these strings, or part of a run of
    whitespace: the trainer's distinct words are bounded by them, whatever the text's shape.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.size = 0
        self._seen: set[str] = set()

    def admit(self, piece: str) -> bool:
        """Count ``piece``'s new strings and say yes, or say no when they would pass the
        limit (counting nothing)."""
        if self.limit is None:
            return True
        text = piece.translate(_NOT_SPACE)
        fresh = set(text.split())
        fresh.update(_SPACE_RUNS.findall(text))  # (one character: at most ~25 words)
        fresh -= self._seen
        size = self.size + sum(
            len(word.encode("utf-8", "surrogatepass")) + _WORD_OVERHEAD for word in fresh
        )
        if size > self.limit:
            return False
        self.size = size
        self._seen |= fresh
        return True


class _Feed:
    """The trainer's input: ``texts`` checked and cut into pieces (:func:`_bounded_pieces`),
    until ``budget`` admits no more."""

    def __init__(self, texts: Iterable[str], budget: _DistinctWords) -> None:
        self._texts = texts
        self._budget = budget
        #: Texts read, characters passed on, and whether the budget stopped the reading.
        self.texts = 0
        self.chars = 0
        self.stopped = False

    def __iter__(self) -> Iterator[str]:
        for i, text in enumerate(self._texts):
            if not isinstance(text, str):
                raise TokenizerInputError(
                    f"training text {i} is {type(text).__name__}, expected str"
                )
            self.texts += 1
            for piece in _bounded_pieces(text):
                if not self._budget.admit(piece):
                    self.stopped = True
                    return
                self.chars += len(piece)
                yield piece


def _bounded_pieces(text: str) -> Iterator[str]:
    """``text`` in pieces of about :data:`TRAIN_PIECE_CHARS` cut between words, a piece with
    no such cut cut every ``_MOST_PIECE_CHARS`` characters."""
    most = _MOST_PIECE_CHARS
    for piece in pieces(text, TRAIN_PIECE_CHARS, CUT_WORDS):
        if len(piece) <= most:
            yield piece
            continue
        for start in range(0, len(piece), most):
            yield piece[start : start + most]
