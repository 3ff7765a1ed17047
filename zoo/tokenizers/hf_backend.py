"""Tokenizers backed by the Hugging Face ``tokenizers`` library (BPE, WordPiece, byte-level
BPE...): the algorithm, normalisation and pre-tokenisation all run in that library."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tokenizers

from .base import Tokenizer
from .errors import VocabularyFileError
from .files import MANIFEST, sha256_bytes, write_manifest

__all__ = ["TOKENIZER_FILE", "HFTokenizer"]

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

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

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
            tokenizer = tokenizers.Tokenizer.from_file(str(directory / TOKENIZER_FILE))
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
