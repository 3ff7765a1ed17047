"""A trainable subword tokenizer: byte-level BPE (``tokenizers`` library), one vocabulary
shared by source and target, as the encoder-decoder Transformer uses.

    >>> tok = SubwordBPE.train(texts, vocab_size=8000)
    >>> tok.save("run/tokenizer")          # tokenizer.json + zoo_tokenizer.json
    >>> tok = zoo.tokenizers.load_directory("run/tokenizer")

Byte-level means every string round-trips exactly and ``<unk>`` is never produced; it is there
so the model's special ids are the usual four.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from .errors import TokenizerError, TokenizerInputError
from .hf_backend import HFTokenizer

__all__ = ["MAX_VOCAB", "SPECIAL_TOKENS", "SubwordBPE"]

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
#: The special tokens, in id order (``<pad>`` = 0, ``<unk>`` = 1, ``<s>`` = 2, ``</s>`` = 3).
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, BOS, EOS)
_ROLES = {"pad": PAD, "unk": UNK, "bos": BOS, "eos": EOS}
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)
#: The most ids :meth:`SubwordBPE.train` accepts (2**24 = 16,777,216). The ``tokenizers``
#: trainer reserves memory for every id asked for before it reads any text (2**28 ids take
#: 0.5 GB, 2**31 abort the process in its allocator), and an embedding of 2**24 rows is
#: already 50 GB at width 768; the largest vocabularies in use are about 2**18.
MAX_VOCAB = 1 << 24


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
    ) -> SubwordBPE:
        """Learn a vocabulary of (at most) ``vocab_size`` ids from ``texts``.

        Args:
            texts: training text (source and target sentences alike), any iterable of str.
            vocab_size: ids wanted, special tokens and the 256 byte tokens included, at most
                :data:`MAX_VOCAB`. A small corpus may give fewer: size the model with the
                trained tokenizer's :attr:`vocab_size`.
            min_frequency: pairs seen fewer times are not merged.
            name: registry name stored with the tokenizer.

        Raises:
            TokenizerError: ``vocab_size`` too small or above :data:`MAX_VOCAB`, or no text
                to learn from.
            TokenizerInputError: an item of ``texts`` that is not a str.
        """
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
        if isinstance(texts, str):
            raise TokenizerInputError("train takes an iterable of texts, not one str; wrap it")
        seen = [0]

        def checked() -> Iterator[str]:
            for i, text in enumerate(texts):
                if not isinstance(text, str):
                    raise TokenizerInputError(
                        f"training text {i} is {type(text).__name__}, expected str"
                    )
                seen[0] += 1
                yield text

        tokenizer = tokenizers.Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(checked(), trainer=trainer)
        if seen[0] == 0:
            raise TokenizerError("train got no texts: pass the corpus as an iterable of str")
        return cls(tokenizer, name=name)
