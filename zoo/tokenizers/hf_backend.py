"""Tokenizers backed by the Hugging Face ``tokenizers`` library (BPE, WordPiece, byte-level
BPE...): the algorithm, normalisation and pre-tokenisation all run in that library."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import tokenizers

from .base import Tokenizer
from .errors import TokenizerError, VocabularyFileError
from .files import MANIFEST, sha256_bytes, write_manifest

T = TypeVar("T")

__all__ = ["CHUNK_CHARS", "TOKENIZER_FILE", "HFTokenizer"]

#: Long texts are encoded in pieces of about this many characters, this many pieces at a
#: time: the memory an encode needs stays near CHUNK_CHARS * CHUNKS_AT_ONCE * ~70 bytes.
CHUNK_CHARS = 1 << 16
CHUNKS_AT_ONCE = 16

#: Where a text may be cut: between a non-space character and a single space followed by a
#: non-space character ("word| next"). No pre-tokenizer zoo uses joins characters across such
#: a boundary (whitespace splits words; byte-level BPE starts a token at " next").
_CUT = re.compile(r"(?<=\S)(?= \S)")


def _pieces(text: str, size: int) -> Iterator[str]:
    """``text`` cut into pieces of about ``size`` characters at :data:`_CUT` boundaries (a
    piece grows past ``size`` when no boundary comes sooner)."""
    start = 0
    while len(text) - start > size:
        match = _CUT.search(text, start + size)
        if match is None:
            break
        yield text[start : match.start()]
        start = match.start()
    yield text[start:]


def _library(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call into the Rust library; a panic there (``pyo3_runtime.PanicException``, which is a
    ``BaseException``: e.g. a hostile regex in a tokenizer.json) becomes a TokenizerError."""
    try:
        return call(*args, **kwargs)
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise TokenizerError(
            f"the tokenizers library failed ({str(exc).splitlines()[0] if str(exc) else 'panic'}); "
            "the tokenizer or its input is not one it can handle"
        ) from None


#: Name of the ``tokenizers`` serialisation in a saved tokenizer directory (the Hugging Face
#: convention, so other tools can read it too).
TOKENIZER_FILE = "tokenizer.json"


class HFTokenizer(Tokenizer):
    """A :class:`~zoo.tokenizers.Tokenizer` over a ``tokenizers.Tokenizer``.

    Args:
        tokenizer: the configured ``tokenizers.Tokenizer`` (model, normalizer, pre-tokenizer,
            decoder, special tokens). Its post-processor is not used: sequence tokens are added
            by ``wrap``.
        **kwargs: ``name``, ``roles``, ``wrap``, ``description``, ``by_name`` as in
            :class:`~zoo.tokenizers.Tokenizer`.
    """

    #: Tag of this class in a saved tokenizer's manifest.
    kind = "tokenizers"

    def __init__(self, tokenizer: tokenizers.Tokenizer, **kwargs: Any) -> None:
        self.tokenizer = tokenizer
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._specials = {
            added.content: token_id
            for token_id, added in tokenizer.get_added_tokens_decoder().items()
            if added.special
        }
        super().__init__(**kwargs)
        for token in self._roles.values():
            self._specials.setdefault(token, self._role_ids_by_token(token))

    def _role_ids_by_token(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        assert token_id is not None  # checked by Tokenizer.__init__
        return token_id

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def backend(self) -> str:
        return "tokenizers"

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._specials)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        self._check_ids([token_id])
        token = self.tokenizer.id_to_token(token_id)
        if token is None:
            raise VocabularyFileError(f"{self.name}: id {token_id} has no token")
        return token

    @functools.cached_property
    def _as_text(self) -> tokenizers.Tokenizer:
        """A copy of the library tokenizer that encodes special-token strings as text
        (``encode_special_tokens``: the library's ``split_special_tokens``)."""
        copy = tokenizers.Tokenizer.from_str(self.tokenizer.to_str())
        copy.encode_special_tokens = True
        return copy

    def _encode(self, text: str, allowed: frozenset[str]) -> list[int]:
        return self._encode_batch([text], allowed)[0]

    def _encode_batch(self, texts: list[str], allowed: frozenset[str]) -> list[list[int]]:
        if allowed and allowed != frozenset(self._specials):  # only some: split at them
            as_text = functools.partial(self._encode_pieces, self._as_text)
            return [self._encode_with_specials(text, allowed, as_text) for text in texts]
        library = self.tokenizer if allowed else self._as_text
        return [self._encode_pieces(library, text) for text in texts]

    @staticmethod
    def _encode_pieces(library: tokenizers.Tokenizer, text: str) -> list[int]:
        """Long texts are cut into pieces of about :data:`CHUNK_CHARS` at boundaries no token
        crosses and encoded a few pieces at a time: the library builds a full ``Encoding``
        (offsets, strings) per token, about 600 bytes each, so one 50 MB text took 6.5 GB."""
        pieces = list(_pieces(text, CHUNK_CHARS))
        ids: list[int] = []
        for start in range(0, len(pieces), CHUNKS_AT_ONCE):
            batch = pieces[start : start + CHUNKS_AT_ONCE]
            for encoding in _library(library.encode_batch_fast, batch, add_special_tokens=False):
                ids.extend(encoding.ids)
        return ids

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return _library(self.tokenizer.decode, ids, skip_special_tokens=skip_special_tokens)

    def save(self, directory: str | Path) -> list[str]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        data = self.tokenizer.to_str(pretty=True).encode("utf-8")
        (directory / TOKENIZER_FILE).write_bytes(data)
        write_manifest(
            directory,
            {
                "name": self.name,
                "kind": self.kind,
                "backend": self.backend,
                "description": self.description,
                "roles": self._roles,
                "wrap": list(self._wrap),
                "files": {TOKENIZER_FILE: sha256_bytes(data)},
            },
        )
        return [TOKENIZER_FILE, MANIFEST]

    @classmethod
    def from_manifest(cls, directory: Path, manifest: Mapping[str, Any]) -> Any:
        """Rebuild from a directory written by :meth:`save` (manifest already verified)."""
        try:
            tokenizer = _library(tokenizers.Tokenizer.from_file, str(directory / TOKENIZER_FILE))
        except Exception as exc:  # the library raises plain Exception on a bad file
            raise VocabularyFileError(
                f"{directory / TOKENIZER_FILE} is not a valid tokenizers file: {exc}"
            ) from exc
        return cls(
            tokenizer,
            name=manifest["name"],
            roles=manifest.get("roles", {}),
            wrap=tuple(manifest.get("wrap", (None, None))),
            description=manifest.get("description", ""),
        )
