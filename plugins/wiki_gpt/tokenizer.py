"""The wiki-gpt tokenizer: BERT WordPiece uncased (30,522 ids), built with the ``tokenizers``
library exactly as ``transformers.BertTokenizerFast`` builds it, from the vocabulary shipped in
this plugin (``data/bert-uncased-vocab.txt``; see ``data/LICENSE-bert-vocab.txt``).

The go / separator / padding roles of the wiki-gpt recipe are BERT's ``[CLS]`` / ``[SEP]`` /
``[PAD]``:
``bos`` = ``cls`` = ``[CLS]``, ``eos`` = ``sep`` = ``[SEP]``, ``pad`` = ``[PAD]``, so
``encode(text, add_special_tokens=True)`` gives ``[CLS] ... [SEP]``.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import WordPiece

from zoo.tokenizers.errors import VocabularyFileError
from zoo.tokenizers.hf_backend import HFTokenizer
from zoo.tokenizers.vocab_files import read_verified

__all__ = ["DESCRIPTION", "VOCAB_SHA256", "VOCAB_SIZE", "from_vocab_file", "load"]

#: sha256 of BERT's uncased ``vocab.txt`` (bert-base-uncased).
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
VOCAB_SIZE = 30522
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
ROLES = {
    "bos": "[CLS]",
    "cls": "[CLS]",
    "eos": "[SEP]",
    "sep": "[SEP]",
    "pad": "[PAD]",
    "unk": "[UNK]",
}
DESCRIPTION = "BERT WordPiece uncased (tokenizers), 30522 ids, shipped with zoo"
_FIX = "Reinstall zoo (pip install --force-reinstall torch-zoo) to restore the shipped file."


def _vocab_path() -> Path:
    vocab = resources.files("zoo_plugins.wiki_gpt").joinpath("data/bert-uncased-vocab.txt")
    return Path(str(vocab))


def from_vocab_file(path: str | Path, *, sha256: str | None = VOCAB_SHA256) -> HFTokenizer:
    """BERT WordPiece uncased from a ``vocab.txt`` (one token per line, id = line number).

    Args:
        path: the vocabulary file.
        sha256: its expected hash (BERT uncased by default); ``None`` skips the check.

    Raises:
        zoo.tokenizers.VocabularyFileError: missing, corrupted, duplicate tokens or wrong size.
    """
    data = read_verified(path, sha256=sha256, what="BERT uncased vocab.txt", fix=_FIX)
    lines = data.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    vocab = {token: i for i, token in enumerate(lines)}
    if len(vocab) != len(lines):
        raise VocabularyFileError(f"{path} repeats tokens: it is not a WordPiece vocabulary")
    if len(vocab) != VOCAB_SIZE:
        raise VocabularyFileError(
            f"{path} holds {len(vocab)} tokens, expected {VOCAB_SIZE} (BERT uncased)"
        )
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return HFTokenizer(
        tokenizer,
        name="bert-wordpiece-uncased",
        roles=ROLES,
        wrap=("cls", "sep"),
        description=DESCRIPTION,
        by_name=True,
    )


@functools.lru_cache(maxsize=1)
def load() -> HFTokenizer:
    """The BERT WordPiece uncased tokenizer from the vocabulary shipped with zoo (sha256
    checked).

    Built once per process and shared: treat it as read-only.

    Raises:
        zoo.tokenizers.VocabularyFileError: the shipped vocabulary is missing or corrupted.
    """
    return from_vocab_file(_vocab_path())
