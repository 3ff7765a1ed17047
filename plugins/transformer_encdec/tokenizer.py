"""The encoder-decoder Transformer's tokenizer: a trainable byte-level BPE
(:class:`zoo.tokenizers.SubwordBPE`) shared by source and target. It has no fixed vocabulary:
train one, or load the one saved next to a trained model's weights.
"""

from __future__ import annotations

from pathlib import Path

from zoo.tokenizers.errors import TokenizerUnavailableError, VocabularyFileError
from zoo.tokenizers.serialization import load_directory
from zoo.tokenizers.subword import SubwordBPE

__all__ = ["DESCRIPTION", "load"]

DESCRIPTION = (
    "trainable byte-level BPE shared by source and target (tokenizers), "
    "<pad> <unk> <s> </s>; saved with the weights"
)


def load(directory: str | Path | None = None) -> SubwordBPE:
    """The subword tokenizer saved in ``directory`` (by ``tokenizer.save(directory)`` or with
    a model's weights).

    Raises:
        zoo.tokenizers.TokenizerUnavailableError: no directory given (nothing trained yet).
        zoo.tokenizers.VocabularyFileError: the directory holds no subword tokenizer.
    """
    if directory is None:
        raise TokenizerUnavailableError(
            "the subword-bpe tokenizer has no fixed vocabulary: train one with "
            "zoo.tokenizers.SubwordBPE.train(texts, vocab_size) and save it with "
            "tokenizer.save(directory), or load a saved one with "
            "zoo.tokenizer('transformer-encdec', directory=...); a model loaded with its "
            "weights brings its own"
        )
    tokenizer = load_directory(directory)
    if not isinstance(tokenizer, SubwordBPE):
        raise VocabularyFileError(
            f"{directory} holds a {tokenizer.kind!r} tokenizer ({tokenizer.name}), not a trained "
            "subword-bpe tokenizer"
        )
    return tokenizer
