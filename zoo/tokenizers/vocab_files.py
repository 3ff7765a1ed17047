"""Reading vocabulary files safely: sha256 checks and the ``zoo_tokenizer.json`` manifest.

Only plain text and JSON are ever read; nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import jsonfile
from .errors import VocabularyFileError

__all__ = [
    "MANIFEST",
    "MANIFEST_FORMAT",
    "MAX_JSON_BYTES",
    "read_manifest",
    "read_verified",
    "sha256_bytes",
    "write_manifest",
]

#: File that describes a saved tokenizer directory (backend, roles, files and their hashes).
MANIFEST = "zoo_tokenizer.json"
MANIFEST_FORMAT = "zoo-tokenizer/1"


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def read_verified(path: str | Path, *, sha256: str | None, what: str, fix: str) -> bytes:
    """Read ``path`` and check its sha256.

    Args:
        path: the file to read.
        sha256: expected hex digest, or ``None`` to skip the check.
        what: what the file is, for error messages (``"GPT-2 BPE ranks"``).
        fix: how to repair a missing or corrupted file, for error messages.

    Raises:
        VocabularyFileError: the file is missing or its hash differs.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise VocabularyFileError(f"cannot read the {what} file {path}: {exc}. {fix}") from exc
    if sha256 is not None:
        actual = sha256_bytes(data)
        if actual != sha256:
            raise VocabularyFileError(
                f"the {what} file {path} is corrupted or not the expected file: its sha256 is "
                f"{actual}, expected {sha256}. {fix}"
            )
    return data


def write_manifest(directory: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``zoo_tokenizer.json`` (with the format tag) into ``directory``."""
    body = {"format": MANIFEST_FORMAT, **manifest}
    (directory / MANIFEST).write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n")


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """Read and check ``zoo_tokenizer.json`` of a saved tokenizer directory, verifying the
    sha256 of every file it lists.

    Raises:
        VocabularyFileError: no manifest, an unknown format, or a listed file missing or
            corrupted.
    """
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise VocabularyFileError(
            f"{directory} holds no saved tokenizer: {MANIFEST} is missing. Save one there with "
            "tokenizer.save(directory), or pass the directory that holds it."
        )
    try:
        manifest = jsonfile.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # incl. a 5,000-digit integer
        raise VocabularyFileError(f"cannot read {path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise VocabularyFileError(
            f"{path} is not a zoo tokenizer manifest (format {found!r}, expected "
            f"{MANIFEST_FORMAT!r}); save the tokenizer again with this version of zoo"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise VocabularyFileError(f"{path} lists no tokenizer files under 'files'")
    for name, digest in files.items():
        if "/" in name or "\\" in name or name.startswith("."):
            raise VocabularyFileError(f"{path} names an invalid file {name!r}")
        read_verified(
            directory / name,
            sha256=digest,
            what=f"tokenizer ({name})",
            fix="Save the tokenizer again, or download the directory again.",
        )
    return manifest


#: The largest JSON file of a tokenizer folder read (a config, a vocabulary).
MAX_JSON_BYTES = 64 << 20


def read_json_object(path: Path, *, required: bool = False) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` when it is absent and not required."""
    if not path.is_file():
        if required:
            raise VocabularyFileError(f"{path} is missing")
        return {}
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise VocabularyFileError(f"{path} is larger than {MAX_JSON_BYTES >> 20} MiB")
        value = jsonfile.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise VocabularyFileError(f"cannot read {path}: {exc}") from None
    if not isinstance(value, dict):
        raise VocabularyFileError(f"{path} holds {type(value).__name__}, not a JSON object")
    return value


def special_token(value: Any, where: str) -> str | None:
    """A special token as the config spells it: a string, an ``AddedToken`` dict (its
    ``content``) or ``null``."""
    if isinstance(value, Mapping):
        value = value.get("content")
    if value is None or isinstance(value, str):
        return value
    raise VocabularyFileError(f"{where} must be a token string, got {value!r:.80}")
