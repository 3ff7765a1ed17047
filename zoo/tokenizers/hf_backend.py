"""Tokenizers backed by the Hugging Face ``tokenizers`` library (BPE, WordPiece, byte-level
BPE...): the algorithm, normalisation and pre-tokenisation all run in that library."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import tokenizers

from .. import jsonfile
from .base import Tokenizer
from .chat_files import chat_from_manifest, chat_manifest
from .chunking import CUT_WORDS, pieces
from .errors import TokenizerError, VocabularyFileError
from .vocab_files import MANIFEST, sha256_bytes, write_manifest

T = TypeVar("T")

__all__ = ["CHUNK_CHARS", "TOKENIZER_FILE", "HFTokenizer", "call_library"]

#: Long texts are encoded in pieces of about this many characters, this many pieces at a
#: time: the memory an encode needs stays near CHUNK_CHARS * CHUNKS_AT_ONCE * ~70 bytes.
CHUNK_CHARS = 1 << 16
CHUNKS_AT_ONCE = 16

#: Normalizers that map each character on its own (no context, nothing added at the start),
#: and pre-tokenizers after which :mod:`~zoo.tokenizers.chunking`'s cuts are word boundaries.
_CHAR_NORMALIZERS = frozenset(
    {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents"}
)


def _cut_config(tokenizer: tokenizers.Tokenizer) -> dict[str, Any]:
    """The parts of ``tokenizer.json`` :func:`_cut_rule` reads, without serialising the
    vocabulary."""

    def state(part: Any) -> Any:
        return None if part is None else jsonfile.loads(part.__getstate__())

    added = [
        {
            "content": token.content,
            "single_word": token.single_word,
            "lstrip": token.lstrip,
            "rstrip": token.rstrip,
            "normalized": token.normalized,
        }
        for token in tokenizer.get_added_tokens_decoder().values()
    ]
    return {
        "normalizer": state(tokenizer.normalizer),
        "pre_tokenizer": state(tokenizer.pre_tokenizer),
        "added_tokens": added,
    }


def _cut_rule(config: Mapping[str, Any]) -> str | None:
    """Where a text may be cut for the library tokenizer serialised as ``config`` (its
    ``tokenizer.json``): :data:`~zoo.tokenizers.chunking.CUT_WORDS` when its normalizer and
    pre-tokenizer are known to keep word boundaries, else ``None`` (never cut)."""
    normalizer = config.get("normalizer")
    if not _char_normalizer(normalizer) or not _word_pre_tokenizer(config.get("pre_tokenizer")):
        return None
    for added in config.get("added_tokens") or []:
        context = added.get("single_word") or added.get("lstrip") or added.get("rstrip")
        if context or (added.get("normalized") and normalizer is not None):
            return None  # its match depends on its neighbours or on the normalized text
    return CUT_WORDS


def _char_normalizer(normalizer: Mapping[str, Any] | None) -> bool:
    """Whether ``normalizer`` (none, or a sequence of them) maps each character on its own."""
    parts = [] if normalizer is None else [normalizer]
    while parts:
        part = parts.pop()
        if part.get("type") == "Sequence":
            parts.extend(part.get("normalizers") or [])
        elif part.get("type") not in _CHAR_NORMALIZERS:
            return False  # e.g. Llama's Prepend("▁") would start every piece with "▁"
    return True


def _word_pre_tokenizer(pre: Mapping[str, Any] | None) -> bool:
    """Whether the cuts of :mod:`~zoo.tokenizers.chunking` are word boundaries after ``pre``:
    BERT's pre-tokenizer, or GPT-2's byte-level one (its regex, no prefix space)."""
    pre = pre or {}
    bert = pre.get("type") == "BertPreTokenizer"
    gpt2 = (
        pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True)
        and not pre.get("add_prefix_space", False)
    )
    return bool(bert or gpt2)


#: The pieces a text is encoded in (:func:`zoo.tokenizers.chunking.pieces`; a seam for tests).
_pieces = pieces


def call_library(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
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


def _without_length_rules(tokenizer: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """``tokenizer``, or a copy of it without the truncation and padding its
    ``tokenizer.json`` may enable: the library would cut every encoded piece at that length
    and pad it, where ``transformers`` turns both off for an encode that asks for neither.
    zoo's encode gives every id of the text, and its ``batch_encode`` pads by itself. The
    tokenizer given is left as it is."""
    if tokenizer.truncation is None and tokenizer.padding is None:
        return tokenizer
    copy = tokenizers.Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


#: Name of the ``tokenizers`` serialisation in a saved tokenizer directory (the Hugging Face
#: convention, so other tools can read it too).
TOKENIZER_FILE = "tokenizer.json"


class HFTokenizer(Tokenizer):
    """A :class:`~zoo.tokenizers.Tokenizer` over a ``tokenizers.Tokenizer``.

    Args:
        tokenizer: the configured ``tokenizers.Tokenizer`` (model, normalizer, pre-tokenizer,
            decoder, special tokens). Its post-processor is not used: sequence tokens are added
            by ``wrap``.
        **kwargs: ``name``, ``roles``, ``wrap``, ``description``, ``by_name``, ``chat``,
            ``end_ids`` as in :class:`~zoo.tokenizers.Tokenizer`.

    A Hugging Face tokenizer folder (``tokenizer.json`` with ``tokenizer_config.json``, its
    chat template and end ids) loads with :func:`zoo.tokenizers.from_pretrained`.
    """

    #: Tag of this class in a saved tokenizer's manifest.
    kind = "tokenizers"

    def __init__(self, tokenizer: tokenizers.Tokenizer, **kwargs: Any) -> None:
        self.tokenizer = _without_length_rules(tokenizer)
        config = _cut_config(tokenizer)
        #: Where texts may be cut (a :mod:`~zoo.tokenizers.chunking` rule, or ``None``) and
        #: the strings no cut may split (every added token).
        self._cut: tuple[str | None, tuple[str, ...]] = (
            _cut_rule(config),
            tuple(str(a.get("content", "")) for a in config["added_tokens"]),
        )
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

    def _content(self) -> Iterator[bytes]:
        yield self.tokenizer.to_str().encode("utf-8")  # model, normalizer, splitting, added

    def _encode(self, text: str, allowed: frozenset[str]) -> list[int]:
        return self._encode_batch([text], allowed)[0]

    def _encode_batch(self, texts: list[str], allowed: frozenset[str]) -> list[list[int]]:
        return [[i for ids in self._encode_iter(text, allowed) for i in ids] for text in texts]

    def _encode_iter(self, text: str, allowed: frozenset[str]) -> Iterator[list[int]]:
        if allowed and allowed != frozenset(self._specials):  # only some: split at them

            def as_text(part: str) -> list[int]:
                return [i for ids in self._encode_pieces(self._as_text, part) for i in ids]

            yield self._encode_with_specials(text, allowed, as_text)
            return
        library = self.tokenizer if allowed else self._as_text
        yield from self._encode_pieces(library, text)

    def _encode_pieces(self, library: tokenizers.Tokenizer, text: str) -> Iterator[list[int]]:
        """Long texts are cut into pieces of about :data:`CHUNK_CHARS` at boundaries no token
        crosses (:mod:`~zoo.tokenizers.chunking`) and encoded a few pieces at a time: the
        library builds a full ``Encoding`` (offsets, strings) per token, about 600 bytes
        each, so a long text encoded whole takes many times its size in memory
        (docs/benchmarks.md, "Figures behind design choices"). Yields the ids of each few
        pieces."""
        rule, protected = self._cut
        batch: list[str] = []
        for piece in _pieces(text, CHUNK_CHARS, rule, protected):
            batch.append(piece)
            if len(batch) == CHUNKS_AT_ONCE:
                yield self._encode_library(library, batch)
                batch = []
        if batch:
            yield self._encode_library(library, batch)

    @staticmethod
    def _encode_library(library: tokenizers.Tokenizer, batch: list[str]) -> list[int]:
        encodings = call_library(library.encode_batch_fast, batch, add_special_tokens=False)
        return [i for encoding in encodings for i in encoding.ids]

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return call_library(self.tokenizer.decode, ids, skip_special_tokens=skip_special_tokens)

    def save(self, directory: str | Path) -> list[str]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        data = self.tokenizer.to_str(pretty=True).encode("utf-8")
        (directory / TOKENIZER_FILE).write_bytes(data)
        manifest: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "backend": self.backend,
            "description": self.description,
            "roles": self._roles,
            "wrap": list(self._wrap),
            "files": {TOKENIZER_FILE: sha256_bytes(data)},
        }
        extra_ends = [i for i in self.end_ids if i != self.eos_id]
        if extra_ends:
            manifest["end_ids"] = extra_ends
        if self.source_special_tokens:
            manifest["source_special_tokens"] = True
        manifest.update(chat_manifest(self))
        write_manifest(directory, manifest)
        return [TOKENIZER_FILE, MANIFEST]

    @classmethod
    def from_manifest(cls, directory: Path, manifest: Mapping[str, Any]) -> Any:
        """Rebuild from a directory written by :meth:`save` (manifest already verified)."""
        try:
            tokenizer = call_library(
                tokenizers.Tokenizer.from_file, str(directory / TOKENIZER_FILE)
            )
        except Exception as exc:  # the library raises plain Exception on a bad file
            raise VocabularyFileError(
                f"{directory / TOKENIZER_FILE} is not a valid tokenizers file: {exc}"
            ) from exc
        chat = chat_from_manifest(directory, manifest)
        made = cls(
            tokenizer,
            name=manifest["name"],
            roles=manifest.get("roles", {}),
            wrap=tuple(manifest.get("wrap", (None, None))),
            description=manifest.get("description", ""),
            chat=chat,
            end_ids=manifest.get("end_ids", ()),
        )
        made.source_special_tokens = manifest.get("source_special_tokens") is True
        return made
