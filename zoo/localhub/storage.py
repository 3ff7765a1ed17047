"""What the local Hub stores: repos, commits and file entries, the content-addressed blob
store on disk, and the rules that decide which files are git-LFS (as the Hub decides)."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

#: Files this large (bytes) are stored as LFS whatever their name.
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024
CHUNK = 1024 * 1024
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")

# The Hub's default .gitattributes (abridged): what a freshly created repo contains.
_LFS_PATTERNS = (
    "*.7z",
    "*.arrow",
    "*.bin",
    "*.bz2",
    "*.ckpt",
    "*.ftz",
    "*.gz",
    "*.h5",
    "*.joblib",
    "*.lfs.*",
    "*.mlmodel",
    "*.model",
    "*.msgpack",
    "*.npy",
    "*.npz",
    "*.onnx",
    "*.ot",
    "*.parquet",
    "*.pb",
    "*.pickle",
    "*.pkl",
    "*.pt",
    "*.pth",
    "*.rar",
    "*.safetensors",
    "saved_model/**/*",
    "*.tar.*",
    "*.tar",
    "*.tflite",
    "*.tgz",
    "*.wasm",
    "*.xz",
    "*.zip",
    "*.zst",
    "*tfevents*",
    "*.gguf",
)
DEFAULT_GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in _LFS_PATTERNS)


class HubError(Exception):
    """An HTTP error answered the way the Hub does (status, JSON body, X-Error-* headers)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class FileEntry:
    """One file in a commit: its size, content sha256, git oid and storage kind."""

    size: int
    sha256: str
    git_oid: str
    lfs: bool

    @property
    def etag(self) -> str:
        """The Hub's ETag: sha256 for LFS files, git blob sha1 otherwise."""
        return self.sha256 if self.lfs else self.git_oid

    @property
    def pointer(self) -> bytes:
        """The git-LFS pointer file that git stores in place of an LFS file."""
        return lfs_pointer(self.sha256, self.size)


@dataclass(frozen=True)
class Commit:
    """An immutable snapshot of a repo."""

    oid: str
    parent: str | None
    files: Mapping[str, FileEntry]
    title: str
    message: str
    date: str


@dataclass
class Repo:
    """A repo: its branches, full commit history and the LFS objects uploaded to it."""

    repo_id: str
    repo_type: str
    private: bool
    created_at: str
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
    lfs_oids: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class RequestRecord:
    """One request as the server saw it (for assertions in tests)."""

    method: str
    path: str
    auth: str  # "none", "valid" or "invalid"
    range: str | None


@dataclass(frozen=True)
class Ticket:
    """A signed, single-use LFS upload slot returned by the batch endpoint."""

    key: tuple[str, str]
    oid: str
    size: int


# --------------------------------------------------------------------------------------------
# Helpers


def now() -> str:
    """The current time in the Hub's ISO-8601 format."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def git_blob_oid(data: bytes) -> str:
    """The git sha1 of a blob with content ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-LFS pointer file for an object."""
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


def lfs_patterns(gitattributes: str) -> list[str]:
    """The patterns that a .gitattributes file routes to LFS."""
    patterns = []
    for line in gitattributes.splitlines():
        parts = line.split()
        if len(parts) > 1 and not parts[0].startswith("#") and "filter=lfs" in parts[1:]:
            patterns.append(parts[0])
    return patterns


def _matches(path: str, pattern: str) -> bool:
    """gitattributes-style match: patterns without a slash match the basename."""
    if "/" not in pattern:
        return fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], pattern)
    return fnmatch.fnmatchcase(path, pattern.replace("**/", "*"))


def wants_lfs(path: str, size: int, sample: bytes, patterns: Iterable[str]) -> bool:
    """The Hub's routing rule: LFS for tracked patterns, big files and binary content."""
    if size >= LFS_SIZE_THRESHOLD or b"\0" in sample[:512]:
        return True
    return any(_matches(path, pattern) for pattern in patterns)


def split_repo_id(repo_id: str) -> tuple[str, str]:
    """``namespace/name`` -> (namespace, name), refusing anything else."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"repo_id must look like 'namespace/name', got {repo_id!r}")
    return parts[0], parts[1]


def validate_path(path: str) -> str:
    """Refuse repo paths that git would refuse (absolute, empty segments, '..')."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise HubError(400, f"Invalid path in repo: {path!r}")
    return path


def validate_front_matter(content: str) -> list[str]:
    """Minimal README.md metadata check: a front matter block must be closed and tab-free."""
    if not content.startswith("---"):
        return []
    match = re.match(r"^---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|$)", content, flags=re.DOTALL)
    if match is None:
        return ["YAML front matter is not closed by a '---' line"]
    if "\t" in match.group(1):
        return ["YAML front matter must not contain tabs"]
    return []


# --------------------------------------------------------------------------------------------
# Content-addressed blob store


class BlobStore:
    """Blobs on disk under ``root/objects/<sha256>``; written atomically, never mutated."""

    def __init__(self, root: Path) -> None:
        self.objects = root / "objects"
        self.objects.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        """Where the blob with this sha256 lives."""
        if not SHA256_RE.match(sha256):
            raise ValueError(f"not a sha256: {sha256!r}")
        return self.objects / sha256

    def has(self, sha256: str) -> bool:
        """Whether the blob is stored."""
        return self.path(sha256).is_file()

    def put_stream(self, chunks: Iterable[bytes], size: int) -> tuple[str, str, bytes]:
        """Store a blob from chunks; return (sha256, git oid, first 512 bytes)."""
        sha256 = hashlib.sha256()
        git = hashlib.sha1(b"blob %d\0" % size)
        sample = b""
        fd, tmp = tempfile.mkstemp(dir=self.objects, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    sha256.update(chunk)
                    git.update(chunk)
                    if len(sample) < 512:
                        sample += chunk[: 512 - len(sample)]
                    out.write(chunk)
            digest = sha256.hexdigest()
            os.replace(tmp, self.path(digest))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return digest, git.hexdigest(), sample

    def put_bytes(self, data: bytes) -> tuple[str, str, bytes]:
        """Store a blob held in memory."""
        return self.put_stream([data], len(data))

    def put_file(self, source: Path) -> tuple[str, str, bytes]:
        """Store a copy of a local file without loading it whole."""
        with open(source, "rb") as f:
            return self.put_stream(iter(lambda: f.read(CHUNK), b""), os.fstat(f.fileno()).st_size)

    def read(self, sha256: str) -> bytes:
        """The whole blob."""
        return self.path(sha256).read_bytes()


def chunks(f: BinaryIO, start: int, stop: int) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) pieces of an open file between two offsets."""
    offset = start
    while offset < stop:
        chunk = f.read(min(CHUNK, stop - offset))
        if not chunk:
            return
        yield offset, chunk
        offset += len(chunk)
