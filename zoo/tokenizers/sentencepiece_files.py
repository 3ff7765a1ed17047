"""The files of a SentencePiece pair tokenizer, as ``transformers``' ``MarianTokenizer``
writes them with ``save_pretrained``: read checked, and written back.

A folder holds

- ``source.spm`` and ``target.spm``: the two SentencePiece models (source and target
  language), read by the ``sentencepiece`` library itself;
- ``vocab.json``: piece -> id, the model's embedding rows (not the SentencePiece models'
  own ids), shared by both sides; with ``separate_vocabs`` the source's, and
  ``target_vocab.json`` the target's;
- ``tokenizer_config.json``: the special tokens by role (``eos_token``, ``unk_token``,
  ``pad_token``), ``added_tokens_decoder``, ``separate_vocabs``, ``source_lang`` and
  ``target_lang``, ``clean_up_tokenization_spaces``.

Only JSON and the SentencePiece models' bytes are read; nothing is imported or unpickled. The
``sentencepiece`` library is needed (``pip install 'torch-zoo[marian]'``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import TokenizerUnavailableError, VocabularyFileError
from .vocab_files import read_json_object, special_token

__all__ = [
    "FILES",
    "PairFiles",
    "is_sentencepiece_pair",
    "load_processor",
    "write_pair",
]

TOKENIZER_CONFIG = "tokenizer_config.json"
SOURCE_SPM = "source.spm"
TARGET_SPM = "target.spm"
VOCAB = "vocab.json"
TARGET_VOCAB = "target_vocab.json"

#: The files every such folder holds.
FILES = (SOURCE_SPM, TARGET_SPM, VOCAB)

#: A SentencePiece model is a few megabytes; a file past this is not one.
_MAX_MODEL_BYTES = 256 << 20

#: A vocabulary or config JSON file past this is refused.

#: The settings of ``tokenizer_config.json`` zoo reads (the rest is bookkeeping:
#: ``tokenizer_class``, ``model_max_length``, ``name_or_path``...).
_FLAGS = ("single_word", "lstrip", "rstrip")


def is_sentencepiece_pair(directory: str | Path) -> bool:
    """Whether ``directory`` holds a SentencePiece pair: ``source.spm``, ``target.spm`` and
    ``vocab.json``."""
    directory = Path(directory)
    return all((directory / name).is_file() for name in FILES)


def load_processor(data: bytes, where: str) -> Any:
    """A ``sentencepiece.SentencePieceProcessor`` of the serialised model ``data``.

    Raises:
        TokenizerUnavailableError: the ``sentencepiece`` library is not installed.
        VocabularyFileError: ``data`` is not a SentencePiece model.
    """
    try:
        import sentencepiece
    except ImportError:
        raise TokenizerUnavailableError(
            f"{where} is a SentencePiece model, and reading it needs the sentencepiece "
            "library: pip install 'torch-zoo[marian]' (or pip install sentencepiece)"
        ) from None
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(data)
    except (RuntimeError, OSError, ValueError, TypeError) as exc:
        raise VocabularyFileError(
            f"{where} is not a SentencePiece model the sentencepiece library reads: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    if processor.GetPieceSize() <= 0:
        raise VocabularyFileError(f"{where} is a SentencePiece model without pieces")
    return processor


def _read_model(path: Path) -> bytes:
    try:
        if not path.is_file():
            raise VocabularyFileError(f"{path} is missing")
        if path.stat().st_size > _MAX_MODEL_BYTES:
            raise VocabularyFileError(f"{path} is larger than {_MAX_MODEL_BYTES >> 20} MiB")
        return path.read_bytes()
    except OSError as exc:
        raise VocabularyFileError(f"cannot read {path}: {exc}") from None


def _vocabulary(path: Path) -> dict[str, int]:
    """``vocab.json``: piece -> id, every id a distinct non-negative integer."""
    vocab = read_json_object(path, required=True)
    ids: dict[int, str] = {}
    for piece, token_id in vocab.items():
        if type(token_id) is not int or token_id < 0:
            raise VocabularyFileError(
                f"{path}: {piece!r} has id {token_id!r}; ids are non-negative integers"
            )
        if token_id in ids:
            raise VocabularyFileError(
                f"{path}: {ids[token_id]!r} and {piece!r} share id {token_id}; each piece "
                "needs an id of its own"
            )
        ids[token_id] = piece
    if not vocab:
        raise VocabularyFileError(f"{path} holds no pieces")
    return vocab


def _added(config: Mapping[str, Any], where: Path) -> dict[str, int]:
    """``added_tokens_decoder``: token -> id. zoo reads special tokens without context
    rules (as ``MarianTokenizer`` writes them); any other is refused by name."""
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, Mapping):
        raise VocabularyFileError(f"{where}: added_tokens_decoder must be an object")
    added: dict[str, int] = {}
    for key, entry in decoder.items():
        content = special_token(entry, f"{where}: added_tokens_decoder[{key}]")
        if not (isinstance(key, str) and key.isdigit()) or content is None:
            raise VocabularyFileError(f"{where}: bad added_tokens_decoder entry {key!r}")
        flags = entry if isinstance(entry, Mapping) else {}
        rules = [flag for flag in _FLAGS if flags.get(flag)]
        if rules or flags.get("special") is False:
            raise VocabularyFileError(
                f"{where}: added token {content!r} is "
                + (f"{', '.join(rules)}" if rules else "not special")
                + "; zoo reads a SentencePiece pair's special tokens without context rules "
                "(as transformers' MarianTokenizer writes them). Remove it from "
                "added_tokens_decoder, or save the tokenizer as a tokenizer.json"
            )
        added[content] = int(key)
    return added


class PairFiles:
    """What a SentencePiece pair folder holds, read and checked (the models' bytes, not yet
    loaded into the library).

    Attributes:
        source, target: the two SentencePiece models' bytes.
        vocab: piece -> id (the source's when ``target_vocab`` is given, else both sides').
        target_vocab: the target's own piece -> id, or ``None`` (one vocabulary).
        added: special token -> id (``added_tokens_decoder``, and the roles' tokens).
        roles: role -> token (``eos``, ``unk``, ``pad``).
        extra_specials: further special tokens (``additional_special_tokens``).
        languages: ``(source_lang, target_lang)``, each ``None`` when not given.
        clean_up: ``clean_up_tokenization_spaces``.
    """

    def __init__(self, directory: Path) -> None:
        where = directory / TOKENIZER_CONFIG
        config = read_json_object(where)
        options = config.get("sp_model_kwargs") or {}
        if options:
            raise VocabularyFileError(
                f"{where}: sp_model_kwargs {options!r} ask sentencepiece to sample pieces "
                "(subword regularisation), and zoo encodes text one way only; remove them"
            )
        separate = config.get("separate_vocabs", False)
        if not isinstance(separate, bool):
            raise VocabularyFileError(f"{where}: separate_vocabs must be true or false")
        self.source = _read_model(directory / SOURCE_SPM)
        self.target = _read_model(directory / TARGET_SPM)
        self.vocab = _vocabulary(directory / VOCAB)
        self.target_vocab = _vocabulary(directory / TARGET_VOCAB) if separate else None
        self.roles: dict[str, str] = {}
        for role, default in (("eos", "</s>"), ("unk", "<unk>"), ("pad", "<pad>")):
            token = special_token(config.get(f"{role}_token", default), f"{where}: {role}_token")
            if token is not None:
                self.roles[role] = token
        if self.roles.get("unk") not in self.vocab:
            raise VocabularyFileError(
                f"{directory / VOCAB} lacks the unknown token {self.roles.get('unk')!r}, "
                "which every piece outside the vocabulary becomes"
            )
        extra = config.get("additional_special_tokens") or config.get("extra_special_tokens")
        self.extra_specials = [
            special_token(t, f"{where}: additional_special_tokens") for t in extra or ()
        ]
        self.added = _added(config, where)
        self.languages = (config.get("source_lang"), config.get("target_lang"))
        self.clean_up = bool(config.get("clean_up_tokenization_spaces", False))


def write_pair(tokenizer: Any, *, model_max_length: int | None = None) -> dict[str, bytes]:
    """The files of ``tokenizer`` (a :class:`~zoo.tokenizers.sentencepiece_pair.
    SentencePiecePair`) by name, as ``MarianTokenizer.save_pretrained`` writes them:
    ``transformers``' ``AutoTokenizer`` reads the folder back as the same tokenizer."""
    vocab, target_vocab = tokenizer.vocabularies
    files = {
        SOURCE_SPM: tokenizer.source_model,
        TARGET_SPM: tokenizer.target_model,
        VOCAB: _json(vocab),
    }
    if target_vocab is not None:
        files[TARGET_VOCAB] = _json(target_vocab)
    source, target = tokenizer.languages
    config: dict[str, Any] = {
        "added_tokens_decoder": {
            str(token_id): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for token, token_id in sorted(tokenizer.added_tokens.items(), key=lambda t: t[1])
        },
        "clean_up_tokenization_spaces": tokenizer.clean_up,
        "model_max_length": model_max_length or 512,
        "separate_vocabs": target_vocab is not None,
        "source_lang": source,
        "sp_model_kwargs": {},
        "target_lang": target,
        "tokenizer_class": "MarianTokenizer",
    }
    for role, token in tokenizer.roles.items():
        config[f"{role}_token"] = token
    if tokenizer.extra_specials:
        config["additional_special_tokens"] = list(tokenizer.extra_specials)
    files[TOKENIZER_CONFIG] = (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode()
    return files


def _json(value: Mapping[str, int]) -> bytes:
    return (json.dumps(dict(value), indent=2, ensure_ascii=False) + "\n").encode("utf-8")
