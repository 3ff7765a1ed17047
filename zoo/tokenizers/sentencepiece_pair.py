"""A SentencePiece pair: one SentencePiece model for the source language, one for the
target, and a vocabulary that maps their pieces to the model's ids, as an encoder-decoder
translation model (Marian's OPUS-MT) is tokenized.

The pieces come from the ``sentencepiece`` library itself; this module maps them to ids and
back exactly as ``transformers``' ``MarianTokenizer`` does:

- :meth:`~SentencePiecePair.encode` is the source side: the source model's pieces, each
  looked up in the vocabulary (a piece outside it is ``<unk>``); a text that starts with a
  language code ``>>xx<<`` keeps the code as one token. ``add_special_tokens=True`` appends
  ``</s>``, as ``tokenizer(text)`` does, and an encoder-decoder's source is encoded that way
  (:attr:`~zoo.tokenizers.Tokenizer.source_special_tokens`).
- :meth:`~SentencePiecePair.encode_target` is the target side (``tokenizer(text_target=...)``):
  the target model's pieces, in the target's vocabulary when the folder has one of its own.
- :meth:`~SentencePiecePair.decode` turns target ids into text: special tokens are written
  as they are, each run of pieces between them is joined by the SentencePiece model
  (``transformers`` 5 joins with the source model when both sides share one vocabulary, with
  the target's otherwise; so does zoo), and ``▁`` becomes a space.

The files are read by :mod:`~zoo.tokenizers.sentencepiece_files`. Needs the
``sentencepiece`` library (``pip install 'torch-zoo[marian]'``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import Tokenizer
from .errors import TokenizerUnavailableError, VocabularyFileError
from .sentencepiece_files import (
    FILES,
    SOURCE_SPM,
    TARGET_SPM,
    PairFiles,
    is_sentencepiece_pair,
    load_processor,
    write_pair,
)
from .vocab_files import MANIFEST, sha256_bytes, write_manifest

__all__ = ["SentencePiecePair", "pair_tokenizer", "read_pair"]

#: SentencePiece's word-boundary mark, which decoding turns into a space.
SPIECE_UNDERLINE = "\u2581"

#: ``transformers``' ``clean_up_tokenization``: the spaces a word tokenizer leaves before
#: punctuation and English contractions, taken out.
_CLEAN_UP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def _language_code(text: str) -> tuple[list[str], str]:
    """A leading ``>>xx<<`` split off the text (``MarianTokenizer.remove_language_code``)."""
    if text.startswith(">>"):
        end = text.find("<<")
        if end != -1:
            return [text[: end + 2]], text[end + 2 :]
    return [], text


class SentencePiecePair(Tokenizer):
    """Source and target SentencePiece models with the vocabulary of an encoder-decoder.

    Args:
        source, target: the two ``sentencepiece.SentencePieceProcessor`` objects.
        vocab: piece -> id of the source side (and of the target side when
            ``target_vocab`` is ``None``).
        target_vocab: the target side's own piece -> id, or ``None``.
        added: special token -> id (``added_tokens_decoder``): matched before the
            vocabulary, never cut into pieces.
        extra_specials: special tokens besides the roles' (skipped in decoding with
            ``skip_special_tokens=True``, as the roles' are).
        languages: ``(source_lang, target_lang)``, for the description and the saved files.
        clean_up: apply ``transformers``' ``clean_up_tokenization`` after decoding.
        **kwargs: ``name``, ``roles`` (``eos``, ``unk``, ``pad``), ``description`` as in
            :class:`~zoo.tokenizers.Tokenizer`; sequences end with ``eos``.

    Raises:
        VocabularyFileError: a role or special token with no id.
    """

    #: Tag of this class in a saved tokenizer's manifest.
    kind = "sentencepiece-pair"

    def __init__(
        self,
        source: Any,
        target: Any,
        vocab: Mapping[str, int],
        target_vocab: Mapping[str, int] | None = None,
        *,
        added: Mapping[str, int] | None = None,
        extra_specials: Sequence[str] = (),
        languages: tuple[str | None, str | None] = (None, None),
        clean_up: bool = False,
        **kwargs: Any,
    ) -> None:
        self._source, self._target = source, target
        self._vocab = dict(vocab)
        self._target_vocab = dict(target_vocab) if target_vocab is not None else None
        decoder_vocab = self._vocab if self._target_vocab is None else self._target_vocab
        self._pieces = {token_id: piece for piece, token_id in decoder_vocab.items()}
        self._added = dict(added or {})
        roles = dict(kwargs.get("roles") or {})
        for token in [*roles.values(), *extra_specials]:
            if token not in self._added:
                token_id = self._vocab.get(token)
                if token_id is None or decoder_vocab.get(token, token_id) != token_id:
                    raise VocabularyFileError(
                        f"special token {token!r} has no id of its own: it is in neither "
                        "added_tokens_decoder nor both vocabularies at one id"
                    )
                self._added[token] = token_id
        self._added_ids = {token_id: token for token, token_id in self._added.items()}
        self._specials = {
            t: self._added[t] for t in dict.fromkeys([*roles.values(), *extra_specials])
        }
        self.extra_specials = tuple(extra_specials)
        self.languages = languages
        self.clean_up = clean_up
        ids = [*decoder_vocab.values(), *self._added.values()]
        self._vocab_size = max(ids) + 1
        self._source_size = max([*self._vocab.values(), *self._added.values()]) + 1
        kwargs.setdefault("wrap", (None, "eos"))
        super().__init__(**kwargs)

    # -- what Tokenizer asks of a backend ---------------------------------------------------
    #: An encoder-decoder's source ends with ``</s>`` (``encode(..., add_special_tokens=True)``).
    source_special_tokens = True

    @property
    def vocab_size(self) -> int:
        """The target side's ids (the decoder's vocabulary, which generation picks from)."""
        return self._vocab_size

    @property
    def source_vocab_size(self) -> int:
        """The source side's ids (the encoder's vocabulary)."""
        return self._source_size

    @property
    def backend(self) -> str:
        return "sentencepiece"

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._specials)

    @property
    def added_tokens(self) -> dict[str, int]:
        """Every added (special) token -> its id."""
        return dict(self._added)

    @property
    def vocabularies(self) -> tuple[dict[str, int], dict[str, int] | None]:
        """The vocabulary (the source's, when the target has its own) and the target's own
        vocabulary or ``None``."""
        target = dict(self._target_vocab) if self._target_vocab is not None else None
        return dict(self._vocab), target

    @property
    def source_model(self) -> bytes:
        """The source SentencePiece model, serialised."""
        return bytes(self._source.serialized_model_proto())

    @property
    def target_model(self) -> bytes:
        """The target SentencePiece model, serialised."""
        return bytes(self._target.serialized_model_proto())

    def token_to_id(self, token: str) -> int | None:
        if token in self._added:
            return self._added[token]
        vocab = self._vocab if self._target_vocab is None else self._target_vocab
        return vocab.get(token)

    def id_to_token(self, token_id: int) -> str:
        self._check_ids([token_id])
        return self._token(token_id)

    def _token(self, token_id: int) -> str:
        """The target side's token of ``token_id``: an added token, a vocabulary piece, else
        the SentencePiece model's own piece of that id (as ``MarianTokenizer`` falls back)."""
        if token_id in self._added_ids:
            return self._added_ids[token_id]
        if token_id in self._pieces:
            return self._pieces[token_id]
        model = self._decoding_model
        piece = model.IdToPiece(token_id) if token_id < model.GetPieceSize() else ""
        return piece or self.roles["unk"]

    @property
    def _decoding_model(self) -> Any:
        """The model that joins pieces into text: the source's when both sides share one
        vocabulary, else the target's (``transformers`` 5's ``use_source_tokenizer``)."""
        return self._source if self._target_vocab is None else self._target

    def _content(self) -> Iterator[bytes]:
        yield self.source_model
        yield self.target_model
        yield json.dumps(self._vocab, sort_keys=True, ensure_ascii=False).encode("utf-8")
        yield json.dumps(self._target_vocab, sort_keys=True, ensure_ascii=False).encode("utf-8")
        yield json.dumps(sorted(self._added.items()), ensure_ascii=False).encode("utf-8")
        yield json.dumps([self.clean_up], ensure_ascii=False).encode("utf-8")

    # -- encoding -----------------------------------------------------------------------------
    def _encode(self, text: str, allowed: frozenset[str]) -> list[int]:
        return self._encode_side(text, allowed, target=False)

    def _encode_batch(self, texts: list[str], allowed: frozenset[str]) -> list[list[int]]:
        return [self._encode(text, allowed) for text in texts]

    def _encode_side(self, text: str, allowed: frozenset[str], *, target: bool) -> list[int]:
        model = self._target if target else self._source
        vocab = self._target_vocab if target and self._target_vocab is not None else self._vocab
        unk = self._added.get(self.roles["unk"], vocab.get(self.roles["unk"], 0))

        def pieces(part: str) -> list[int]:
            code, rest = _language_code(part)
            found = [*code, *model.encode(rest, out_type=str)]
            return [self._added.get(p, vocab.get(p, unk)) for p in found]

        if allowed:
            return self._encode_with_specials(text, allowed, pieces)
        return pieces(text)

    def encode_target(
        self,
        text: str,
        *,
        add_special_tokens: bool = False,
        allowed_special: bool | str | frozenset[str] | set[str] = False,
    ) -> list[int]:
        """The target side's ids of ``text`` (``tokenizer(text_target=text)`` with
        ``add_special_tokens=True``: the ids end with ``</s>``), e.g. a translation's
        reference for training. Arguments as :meth:`encode`."""
        from .inputs import check_text

        ids = self._encode_side(
            check_text(text, "encode_target"), self._allowed(allowed_special), target=True
        )
        return [*ids, *self._suffix] if add_special_tokens else ids

    # -- decoding -----------------------------------------------------------------------------
    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        skip = set(self._specials.values()) if skip_special_tokens else set()
        model = self._decoding_model
        text, run = "", list[str]()
        for token_id in ids:
            if token_id in skip:
                continue
            token = self._token(token_id)
            if token in self._specials:
                text += model.decode_pieces(run) + token + " "
                run = []
            else:
                run.append(token)
        text += model.decode_pieces(run)
        text = text.replace(SPIECE_UNDERLINE, " ").strip()
        if self.clean_up:
            for before, after in _CLEAN_UP:
                text = text.replace(before, after)
        return text

    # -- files --------------------------------------------------------------------------------
    def hf_files(self, *, model_max_length: int | None = None) -> dict[str, bytes]:
        """The files ``transformers``' ``MarianTokenizer`` reads, by name (what
        :func:`zoo.export` writes beside the weights)."""
        return write_pair(self, model_max_length=model_max_length)

    def save(self, directory: str | Path) -> list[str]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        files = self.hf_files()
        for file_name, data in files.items():
            (directory / file_name).write_bytes(data)
        manifest = {
            "name": self.name,
            "kind": self.kind,
            "backend": self.backend,
            "description": self.description,
            "roles": self._roles,
            "files": {file_name: sha256_bytes(data) for file_name, data in files.items()},
        }
        write_manifest(directory, manifest)
        return [*files, MANIFEST]

    @classmethod
    def from_manifest(cls, directory: Path, manifest: Mapping[str, Any]) -> Any:
        """Rebuild from a directory written by :meth:`save` (manifest already verified)."""
        tokenizer = read_pair(directory, name=manifest["name"])
        tokenizer.description = manifest.get("description", tokenizer.description)
        return tokenizer

    def __repr__(self) -> str:
        digest = hashlib.sha256(self.source_model).hexdigest()[:8]
        return f"<SentencePiecePair {self.name!r} vocab_size={self.vocab_size} source={digest}>"


def read_pair(directory: str | Path, *, name: str | None = None) -> SentencePiecePair:
    """The SentencePiece pair tokenizer of ``directory`` (see the module's description).

    Raises:
        TokenizerUnavailableError: the ``sentencepiece`` library is not installed.
        VocabularyFileError: a file missing, unreadable or out of line with the others.
    """
    directory = Path(directory)
    files = PairFiles(directory)
    source, target = files.languages
    pair = f"{source or '?'} -> {target or '?'}"
    return SentencePiecePair(
        load_processor(files.source, str(directory / SOURCE_SPM)),
        load_processor(files.target, str(directory / TARGET_SPM)),
        files.vocab,
        files.target_vocab,
        added=files.added,
        extra_specials=[t for t in files.extra_specials if t is not None],
        languages=files.languages,
        clean_up=files.clean_up,
        name=name or directory.resolve().name,
        roles=files.roles,
        description=f"SentencePiece source/target pair ({pair}) from {directory}",
    )


def pair_tokenizer(directory: str | Path | None = None) -> SentencePiecePair:
    """A tokenizer factory (``TokenizerSpec(..., reads_checkpoint=True)``): the SentencePiece
    pair of ``directory``, a checkpoint or tokenizer folder.

    Raises:
        TokenizerUnavailableError: no directory given (the pair has no fixed vocabulary),
            or the ``sentencepiece`` library is not installed.
        VocabularyFileError: the folder holds no SentencePiece pair, or a bad one.
    """
    if directory is None:
        raise TokenizerUnavailableError(
            "a SentencePiece pair tokenizer is read from its files: give the folder that "
            f"holds {', '.join(FILES)} (directory=...), e.g. a Marian (OPUS-MT) checkpoint; "
            "zoo.load of such a checkpoint attaches it by itself"
        )
    if not is_sentencepiece_pair(directory):
        missing = [name for name in FILES if not (Path(directory) / name).is_file()]
        raise VocabularyFileError(
            f"{directory} holds no SentencePiece pair: {', '.join(missing)} missing. Save one "
            "there with transformers' MarianTokenizer.save_pretrained(DIR)"
        )
    return read_pair(directory)
