"""Tokenizers backed by tiktoken (byte-level BPE from a ranks file, e.g. GPT-2)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import tiktoken

from .base import Tokenizer
from .chat_files import chat_from_manifest, chat_manifest
from .chunking import CUT_WORDS, pieces
from .errors import TokenizerError, VocabularyFileError
from .vocab_files import MANIFEST, read_verified, sha256_bytes, write_manifest

__all__ = ["RANKS_FILE", "TiktokenTokenizer", "parse_tiktoken_ranks"]

#: Name of the ranks file in a saved tokenizer directory.
RANKS_FILE = "tokenizer.tiktoken"

#: Long texts are encoded in pieces of about this many characters (when the split pattern is
#: one :mod:`~zoo.tokenizers.chunking` knows to keep word boundaries).
CHUNK_CHARS = 1 << 16

#: GPT-2's split patterns (tiktoken's r50k/p50k and the GPT-2 release's): their words end at
#: the cuts of :data:`~zoo.tokenizers.chunking.CUT_WORDS`. Others (cl100k's ``\p{N}{1,3}``,
#: its punctuation that takes the newlines after it) are not cut.
_GPT2_PATTERNS = frozenset(
    {
        r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    }
)


def parse_tiktoken_ranks(data: bytes, *, source: str, expected_size: int | None = None) -> dict:
    """Parse tiktoken's ranks format (``base64(token) rank`` per line) into ``{bytes: rank}``.

    Raises:
        VocabularyFileError: a malformed line, duplicate ranks, or (with ``expected_size``) the
            wrong number of tokens.
    """
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as exc:
            raise VocabularyFileError(
                f"{source}: line {number} is not 'base64-token rank' ({exc})"
            ) from None
    if expected_size is not None and len(ranks) != expected_size:
        raise VocabularyFileError(
            f"{source} holds {len(ranks)} tokens, expected {expected_size}: it is the wrong "
            "vocabulary for this tokenizer"
        )
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise VocabularyFileError(f"{source}: ranks are not exactly 0 .. {len(ranks) - 1}")
    return ranks


class TiktokenTokenizer(Tokenizer):
    """A :class:`~zoo.tokenizers.Tokenizer` over a ``tiktoken.Encoding``.

    Args:
        encoding: the tiktoken encoding (ranks, split pattern, special tokens).
        **kwargs: ``name``, ``roles``, ``wrap``, ``description``, ``by_name`` as in
            :class:`~zoo.tokenizers.Tokenizer`.
    """

    #: Tag of this class in a saved tokenizer's manifest.
    kind = "tiktoken"

    def __init__(self, encoding: tiktoken.Encoding, **kwargs: Any) -> None:
        self.encoding = encoding
        self._specials: dict[str, int] = dict(encoding._special_tokens)
        self._n_vocab = encoding.n_vocab
        super().__init__(**kwargs)

    @classmethod
    def from_ranks_file(
        cls,
        path: str | Path,
        *,
        pattern: str,
        special_tokens: Mapping[str, int],
        sha256: str | None = None,
        expected_size: int | None = None,
        what: str = "tiktoken ranks",
        fix: str = "",
        **kwargs: Any,
    ) -> TiktokenTokenizer:
        """Build from a ``.tiktoken`` ranks file, checking its sha256 and size first."""
        data = read_verified(path, sha256=sha256, what=what, fix=fix)
        ranks = parse_tiktoken_ranks(data, source=str(path), expected_size=expected_size)
        encoding = tiktoken.Encoding(
            name=kwargs.get("name", "zoo"),
            pat_str=pattern,
            mergeable_ranks=ranks,
            special_tokens=dict(special_tokens),
        )
        return cls(encoding, **kwargs)

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    @property
    def backend(self) -> str:
        return "tiktoken"

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._specials)

    def token_to_id(self, token: str) -> int | None:
        if token in self._specials:
            return self._specials[token]
        return self.encoding._mergeable_ranks.get(token.encode("utf-8"))

    def id_to_token(self, token_id: int) -> str:
        self._check_ids([token_id])
        return self.encoding.decode_single_token_bytes(token_id).decode("utf-8", "replace")

    def _encode(self, text: str, allowed: frozenset[str]) -> list[int]:
        return self.encoding.encode(text, allowed_special=set(allowed), disallowed_special=())

    def _encode_batch(self, texts: list[str], allowed: frozenset[str]) -> list[list[int]]:
        return self.encoding.encode_batch(
            texts, allowed_special=set(allowed), disallowed_special=()
        )

    def _encode_iter(self, text: str, allowed: frozenset[str]) -> Iterator[list[int]]:
        rule = CUT_WORDS if self.encoding._pat_str in _GPT2_PATTERNS else None
        for piece in pieces(text, CHUNK_CHARS, rule, tuple(self._specials)):
            yield self._encode(piece, allowed)

    def _content(self) -> Iterator[bytes]:
        yield self.encoding._pat_str.encode("utf-8")
        ranks = sorted(self.encoding._mergeable_ranks.items(), key=lambda item: item[1])
        yield b"".join(base64.b64encode(token) + b" %d\n" % rank for token, rank in ranks)

    def _token_bytes(self, ids: list[int]) -> list[bytes]:
        """The bytes of each of ``ids`` (ids :meth:`decode` takes): tiktoken's ``decode`` of
        the first ``k`` ids is the first ``k`` of these joined, decoded as UTF-8 with errors
        replaced. :mod:`.chat_replies` places tokens with it."""
        try:
            return self.encoding.decode_tokens_bytes(ids)
        except KeyError as exc:  # an id inside the range that the ranks leave out
            raise TokenizerError(f"id {exc.args[0]} is not a token of {self.name}") from None

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        if skip_special_tokens:
            specials = set(self._specials.values())
            ids = [i for i in ids if i not in specials]
        try:
            return self.encoding.decode(ids)
        except KeyError as exc:  # an id inside the range that the ranks leave out
            raise TokenizerError(f"id {exc.args[0]} is not a token of {self.name}") from None

    def save(self, directory: str | Path) -> list[str]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        ranks = sorted(self.encoding._mergeable_ranks.items(), key=lambda item: item[1])
        data = b"".join(base64.b64encode(token) + b" %d\n" % rank for token, rank in ranks)
        (directory / RANKS_FILE).write_bytes(data)
        write_manifest(
            directory,
            {
                "name": self.name,
                "kind": self.kind,
                "backend": self.backend,
                "description": self.description,
                "roles": self._roles,
                "wrap": list(self._wrap),
                "pattern": self.encoding._pat_str,
                "special_tokens": self._specials,
                "files": {RANKS_FILE: sha256_bytes(data)},
                **chat_manifest(self),
            },
        )
        return [RANKS_FILE, MANIFEST]

    @classmethod
    def from_manifest(cls, directory: Path, manifest: Mapping[str, Any]) -> TiktokenTokenizer:
        """Rebuild from a directory written by :meth:`save` (manifest already verified)."""
        return cls.from_ranks_file(
            directory / RANKS_FILE,
            pattern=manifest["pattern"],
            special_tokens=manifest["special_tokens"],
            name=manifest["name"],
            roles=manifest.get("roles", {}),
            wrap=tuple(manifest.get("wrap", (None, None))),
            description=manifest.get("description", ""),
            chat=chat_from_manifest(directory, manifest),
        )
