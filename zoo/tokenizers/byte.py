"""A byte-level tokenizer: the 256 byte values, plus ``<|endoftext|>``. No data files.

Any text round-trips exactly (its UTF-8 bytes are the ids), and so do any bytes through
:meth:`ByteTokenizer.encode_bytes` / :meth:`ByteTokenizer.decode_bytes`; for small models
trained on character-level data, such as the shipped ``shakespeare-byte``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import jsonfile
from .base import Tokenizer
from .chat_files import chat_from_manifest, chat_manifest
from .chunking import CUT_ANYWHERE, pieces
from .errors import TokenizerError, TokenizerInputError, VocabularyFileError
from .vocab_files import MANIFEST, sha256_bytes, write_manifest

if TYPE_CHECKING:
    from .chat import ChatTemplate

__all__ = ["ENDOFTEXT", "ByteTokenizer"]

ENDOFTEXT = "<|endoftext|>"
#: The file a byte tokenizer with a chat template saves it in (with its special-token strings).
CHAT_FILE = "byte_chat_template.json"
#: :meth:`ByteTokenizer.iter_encode` yields the ids of this many characters at a time.
CHUNK_CHARS = 1 << 16
#: The bytes of each id: the 256 bytes, then ``<|endoftext|>``'s UTF-8.
_TOKEN_BYTES = (*(bytes([i]) for i in range(256)), ENDOFTEXT.encode("utf-8"))


class ByteTokenizer(Tokenizer):
    """Ids 0-255 are the bytes of the UTF-8 text; 256 is ``<|endoftext|>`` (bos and eos).

    Rebuilt from its registered name (``byte``), so a checkpoint stores no file for it.
    """

    kind = "byte"

    def __init__(
        self, *, name: str = "byte", description: str = "", chat: ChatTemplate | None = None
    ) -> None:
        self._specials = {ENDOFTEXT: 256}
        super().__init__(
            name=name,
            roles={"bos": ENDOFTEXT, "eos": ENDOFTEXT},
            description=description or "UTF-8 bytes (256 ids) + <|endoftext|>, no data files",
            by_name=chat is None,
            chat=chat,
        )

    @property
    def vocab_size(self) -> int:
        return 257

    @property
    def backend(self) -> str:
        return "zoo"

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._specials)

    def token_to_id(self, token: str) -> int | None:
        if token in self._specials:
            return self._specials[token]
        data = token.encode("utf-8", "surrogatepass")
        return data[0] if len(data) == 1 else None

    def id_to_token(self, token_id: int) -> str:
        self._check_ids([token_id])
        if token_id == 256:
            return ENDOFTEXT
        return bytes([token_id]).decode("latin-1")

    def _encode(self, text: str, allowed: frozenset[str]) -> list[int]:
        if not allowed:
            return list(text.encode("utf-8"))
        return self._encode_with_specials(text, allowed, lambda part: list(part.encode("utf-8")))

    def _encode_batch(self, texts: list[str], allowed: frozenset[str]) -> list[list[int]]:
        return [self._encode(text, allowed) for text in texts]

    def _encode_iter(self, text: str, allowed: frozenset[str]) -> Iterator[list[int]]:
        for piece in pieces(text, CHUNK_CHARS, CUT_ANYWHERE, allowed):  # never inside a special
            yield self._encode(piece, allowed)

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        pieces: list[str] = []
        run = bytearray()
        for i in ids:
            if i < 256:
                run.append(i)
                continue
            pieces.append(run.decode("utf-8", "replace"))
            run.clear()
            if not skip_special_tokens:
                pieces.append(ENDOFTEXT)
        pieces.append(run.decode("utf-8", "replace"))
        return "".join(pieces)

    def _token_bytes(self, ids: list[int]) -> list[bytes]:
        """The bytes of each of ``ids`` (checked ids): :meth:`decode` of the first ``k`` ids
        is the first ``k`` of these joined, decoded as UTF-8 with errors replaced (the end
        token's text is ASCII, so no error crosses it). :mod:`.chat_replies` places tokens
        with it."""
        return list(map(_TOKEN_BYTES.__getitem__, ids))

    def encode_bytes(self, data: bytes | bytearray | memoryview) -> list[int]:
        """Ids of raw bytes, UTF-8 or not: each byte is its own id (no special tokens).

        Raises:
            TokenizerInputError: ``data`` is not bytes-like (text goes to :meth:`encode`).
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            hint = "; text goes to encode()" if isinstance(data, str) else ""
            raise TokenizerInputError(f"encode_bytes takes bytes, got {type(data).__name__}{hint}")
        return list(bytes(data))

    def decode_bytes(self, ids: Sequence[int] | Any, *, skip_special_tokens: bool = False) -> bytes:
        """The exact bytes of ``ids`` (a list, or a 1-D tensor), the inverse of
        :meth:`encode_bytes` for any bytes. Unlike :meth:`decode`, bytes that are not valid
        UTF-8 come back unchanged instead of as U+FFFD; ``<|endoftext|>`` becomes its UTF-8
        text unless ``skip_special_tokens``.

        Raises:
            TokenizerInputError: ids that are not integers.
            TokenizerError: an id outside ``0 .. 256``.
        """
        special = b"" if skip_special_tokens else ENDOFTEXT.encode("utf-8")
        out = bytearray()
        for i in self._check_ids(ids):
            if i < 256:
                out.append(i)
            else:
                out += special
        return bytes(out)

    def save(self, directory: str | Path) -> list[str]:
        """With a chat template (:func:`~zoo.tokenizers.with_chat_template`): the template
        (``chat_template.jinja``) and the manifest. Without one there is nothing to write:
        the tokenizer is rebuilt from its name."""
        if self._chat is None:
            raise TokenizerError("the byte tokenizer is rebuilt from its name; it writes no files")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps(chat_manifest(self), indent=2, ensure_ascii=False).encode("utf-8")
        (directory / CHAT_FILE).write_bytes(data)
        manifest = {
            "name": self.name,
            "kind": self.kind,
            "backend": self.backend,
            "description": self.description,
            "files": {CHAT_FILE: sha256_bytes(data)},
        }
        write_manifest(directory, manifest)
        return [CHAT_FILE, MANIFEST]

    @classmethod
    def from_manifest(cls, directory: Path, manifest: Mapping[str, Any]) -> ByteTokenizer:
        """Rebuild from a directory written by :meth:`save` (manifest already verified)."""
        try:
            kept = jsonfile.loads((directory / CHAT_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise VocabularyFileError(f"cannot read {directory / CHAT_FILE}: {exc}") from None
        if not isinstance(kept, dict) or kept.get("chat_template") is None:
            raise VocabularyFileError(f"{directory / CHAT_FILE} holds no chat template")
        name, description = manifest["name"], manifest.get("description", "")
        chat = chat_from_manifest(directory, kept)
        return cls(name=name, description=str(description), chat=chat)


def load() -> ByteTokenizer:
    """The byte tokenizer (the ``byte`` entry of the tokenizer registry)."""
    return ByteTokenizer()
