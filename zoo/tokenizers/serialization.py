"""Saving a tokenizer next to weights, and loading it back.

Tokenizers whose data ships with (or is pinned by) a plugin are stored by name only; trained
tokenizers write their files. Only JSON and text are written and read, never pickles.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .base import Tokenizer
from .errors import TokenizerError, VocabularyFileError
from .vocab_files import read_manifest

__all__ = ["load_directory", "load_tokenizer", "save_tokenizer"]


def _classes() -> dict[str, type[Tokenizer]]:
    """Manifest ``kind`` -> class. A fixed table: a saved file never names code to import."""
    from .byte import ByteTokenizer
    from .hf_backend import HFTokenizer
    from .sentencepiece_pair import SentencePiecePair
    from .subword import SubwordBPE
    from .tiktoken_backend import TiktokenTokenizer

    classes = (TiktokenTokenizer, HFTokenizer, SubwordBPE, ByteTokenizer, SentencePiecePair)
    return {c.kind: c for c in classes}


def load_directory(directory: str | Path) -> Tokenizer:
    """Load a tokenizer saved with :meth:`Tokenizer.save <zoo.tokenizers.Tokenizer.save>`.

    The manifest (``zoo_tokenizer.json``) is read first and the sha256 of every file it lists
    is checked before anything is parsed.

    Raises:
        VocabularyFileError: no manifest, an unknown kind, or a missing or corrupted file.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    classes = _classes()
    kind = manifest.get("kind")
    if kind not in classes:
        raise VocabularyFileError(
            f"{directory}: unknown tokenizer kind {kind!r} in the manifest; known kinds: "
            f"{', '.join(sorted(classes))}"
        )
    if not isinstance(manifest.get("name"), str):
        raise VocabularyFileError(f"{directory}: the manifest has no tokenizer 'name'")
    return classes[kind].from_manifest(directory, manifest)


def save_tokenizer(tokenizer: Tokenizer, directory: str | Path) -> dict[str, Any]:
    """Store ``tokenizer`` alongside weights in ``directory``.

    Tokenizers that can be rebuilt from their registered name (``gpt2-bpe``, ``gpt1-bpe``,
    ``bert-wordpiece-uncased``) write nothing; others (a trained ``subword-bpe``) write their
    files there.

    Args:
        tokenizer: the tokenizer to store.
        directory: the weights directory (created if needed when files are written).

    Returns:
        A JSON-able spec to keep with the weights (e.g. in their config) and hand to
        :func:`load_tokenizer`: ``{"name": "gpt2-bpe"}`` or
        ``{"name": "subword-bpe", "files": ["tokenizer.json", "zoo_tokenizer.json"]}``.
    """
    if not isinstance(tokenizer, Tokenizer):
        raise TokenizerError(
            f"save_tokenizer takes a zoo tokenizer, got {type(tokenizer).__name__}"
        )
    if tokenizer.by_name:
        return {"name": tokenizer.name}
    files = tokenizer.save(directory)
    return {"name": tokenizer.name, "files": list(files)}


def load_tokenizer(
    spec: Mapping[str, Any],
    directory: str | Path,
    *,
    by_name: Callable[[str], Tokenizer] | None = None,
) -> Tokenizer:
    """The inverse of :func:`save_tokenizer`.

    Args:
        spec: what :func:`save_tokenizer` returned.
        directory: the directory it wrote into (ignored for by-name tokenizers).
        by_name: makes a tokenizer stored by name only (``{"name": "gpt2-bpe"}``) from its
            name, e.g. :func:`zoo.tokenizer` (the registry's tokenizers); this package knows
            no names itself.

    Raises:
        TokenizerError: a malformed spec, files that hold a different tokenizer, or a by-name
            spec without ``by_name``.
        VocabularyFileError: a listed file missing or corrupted.
        zoo.errors.ZooError: ``by_name``'s own errors (a by-name tokenizer whose plugin is not
            installed).
    """
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
        raise TokenizerError(
            f"a tokenizer spec is a mapping with a 'name' (as save_tokenizer returns), got {spec!r}"
        )
    name = spec["name"]
    files = spec.get("files")
    if not files:
        if by_name is None:
            raise TokenizerError(
                f"tokenizer {name!r} is stored by name only: pass by_name= (e.g. "
                "zoo.tokenizer) to make it from its name"
            )
        return by_name(name)
    if not isinstance(files, (list, tuple)) or not all(isinstance(f, str) for f in files):
        raise TokenizerError(f"tokenizer spec 'files' must be a list of file names, got {files!r}")
    directory = Path(directory)
    missing = [f for f in files if not (directory / f).is_file()]
    if missing:
        raise VocabularyFileError(
            f"{directory} lacks the tokenizer file(s) {', '.join(missing)} that its spec lists; "
            "copy them from where the weights were saved, or download the weights again"
        )
    tokenizer = load_directory(directory)
    if tokenizer.name != name:
        raise TokenizerError(
            f"{directory} holds tokenizer {tokenizer.name!r} but the spec names {name!r}"
        )
    return tokenizer
