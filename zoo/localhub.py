"""A local Hugging Face Hub-compatible HTTP server, to try ``zoo push`` and ``zoo.load("hf:...")``
without the internet (stdlib only)::

    python -m zoo.localhub [--port 8642] [--root DIR]

prints the environment variables to export in another shell (``HF_ENDPOINT``,
``HF_HUB_DISABLE_XET=1``, ``HF_TOKEN``). In Python::

    with LocalHub(token="hf_test") as hub:
        sha = hub.add_files("openai-community/gpt2", {"config.json": b"{}"})
        ...  # point HF_ENDPOINT at hub.endpoint

``LocalHub`` speaks the subset of the Hub protocol that ``huggingface_hub`` 2.x uses to create
repos, upload (regular files and plain git-LFS, i.e. with ``HF_HUB_DISABLE_XET=1``), inspect and
download them. It binds 127.0.0.1 (an ephemeral port unless one is given) and serves from a
daemon thread. The test suite's hostile variants (outages, cut or corrupt downloads, lying
headers) subclass it in ``tests/hubserver.py``.

Semantics
---------
* Git-like history: every commit gets a fresh 40-hex sha; branches point at commits; a
  ``revision`` is a branch name or a full commit sha; old commits stay downloadable.
* A new repo starts with an initial commit holding the Hub's default ``.gitattributes``. A file
  is stored as LFS when it matches a ``filter=lfs`` pattern of that file, is 10 MiB or larger, or
  looks binary (a NUL byte in its first 512 bytes); the same rule answers ``preupload``.
* ``ETag`` is the git blob sha1 for regular files and the content sha256 for LFS files (as on the
  Hub); LFS files also carry ``X-Linked-Etag``/``X-Linked-Size``. Files are served directly (no
  CDN redirect), with ``Range`` support so the client can resume.
* Auth: one accepted token (``Authorization: Bearer <token>``). A request carrying any *other*
  bearer token gets 401 "Invalid credentials in Authorization header", as the Hub does, even on
  public reads. Writes need the token. Reads of public repos need no token (as on the Hub) unless
  ``require_auth_for_reads`` is set; private repos answer 401 ``RepoNotFound`` without it.
* Errors carry the Hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
  ``EntryNotFound``) and ``X-Error-Message`` headers plus a JSON ``{"error": ...}`` body, so
  ``huggingface_hub`` raises its own exception types.
* Repo ids must be ``namespace/name``; ``create_repo("name")`` lands in the hub's user namespace.

Blobs live content-addressed on disk (``root``), so serving a large checkpoint costs no memory;
metadata (repos, commits, branches) lives in memory: a restarted server starts empty.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["DEFAULT_GITATTRIBUTES", "FileEntry", "HubError", "LocalHub", "RequestRecord", "main"]

# Plural URL segment used by the API -> repo type, and the prefix of non-API (resolve, git) URLs.
_API_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}

LFS_SIZE_THRESHOLD = 10 * 1024 * 1024
_CHUNK = 1024 * 1024
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
_INVALID_CREDENTIALS = "Invalid credentials in Authorization header"

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
        return _lfs_pointer(self.sha256, self.size)


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
class _Ticket:
    """A signed, single-use LFS upload slot returned by the batch endpoint."""

    key: tuple[str, str]
    oid: str
    size: int


# --------------------------------------------------------------------------------------------
# Helpers


def _now() -> str:
    """The current time in the Hub's ISO-8601 format."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _git_blob_oid(data: bytes) -> str:
    """The git sha1 of a blob with content ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-LFS pointer file for an object."""
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


def _lfs_patterns(gitattributes: str) -> list[str]:
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


def _wants_lfs(path: str, size: int, sample: bytes, patterns: Iterable[str]) -> bool:
    """The Hub's routing rule: LFS for tracked patterns, big files and binary content."""
    if size >= LFS_SIZE_THRESHOLD or b"\0" in sample[:512]:
        return True
    return any(_matches(path, pattern) for pattern in patterns)


def _split_repo_id(repo_id: str) -> tuple[str, str]:
    """``namespace/name`` -> (namespace, name), refusing anything else."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"repo_id must look like 'namespace/name', got {repo_id!r}")
    return parts[0], parts[1]


def _validate_path(path: str) -> str:
    """Refuse repo paths that git would refuse (absolute, empty segments, '..')."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise HubError(400, f"Invalid path in repo: {path!r}")
    return path


def _validate_front_matter(content: str) -> list[str]:
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


class _BlobStore:
    """Blobs on disk under ``root/objects/<sha256>``; written atomically, never mutated."""

    def __init__(self, root: Path) -> None:
        self.objects = root / "objects"
        self.objects.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        """Where the blob with this sha256 lives."""
        if not _SHA256_RE.match(sha256):
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
            return self.put_stream(iter(lambda: f.read(_CHUNK), b""), os.fstat(f.fileno()).st_size)

    def read(self, sha256: str) -> bytes:
        """The whole blob."""
        return self.path(sha256).read_bytes()


# --------------------------------------------------------------------------------------------
# The hub


class LocalHub:
    """A Hub-compatible HTTP server on 127.0.0.1 with git-like repos.

    Args:
        token: the one accepted bearer token (write access to everything).
        user: the account that owns the token (namespace for ``create_repo("name")``).
        root: directory for blobs; a temporary one (removed by :meth:`close`) if omitted.
        require_auth_for_reads: also demand the token for reads of public repos.
        port: the port to listen on (0: any free one).
    """

    #: The request handler; a subclass may answer differently (see ``tests/hubserver.py``).
    handler_class: type[_Handler]

    def __init__(
        self,
        token: str = "hf_test",
        *,
        user: str = "test-user",
        root: str | os.PathLike[str] | None = None,
        require_auth_for_reads: bool = False,
        port: int = 0,
    ) -> None:
        self.token = token
        self.user = user
        self.require_auth_for_reads = require_auth_for_reads
        #: The last requests received, oldest first.
        self.requests: deque[RequestRecord] = deque(maxlen=10_000)
        self._owns_root = root is None
        self._root = Path(tempfile.mkdtemp(prefix="localhub-") if root is None else root)
        self._blobs = _BlobStore(self._root)
        self._repos: dict[tuple[str, str], Repo] = {}
        self._tickets: dict[str, _Ticket] = {}
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = port

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321`` (stable across stop/start)."""
        if not self._port:
            raise RuntimeError("LocalHub has not been started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def running(self) -> bool:
        """Whether the server is accepting connections."""
        return self._server is not None

    def start(self) -> LocalHub:
        """Start serving (again on the same port after a :meth:`stop`)."""
        if self._server is not None:
            return self
        handler = type("LocalHubHandler", (self.handler_class,), {"hub": self})
        server = _Server(("127.0.0.1", self._port), handler)
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"localhub-{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (the Hub is "down"); repos are kept and :meth:`start` resumes."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()  # joins the request threads
        if thread is not None:
            thread.join(timeout=10)

    def close(self) -> None:
        """Stop and delete the blob directory if this hub created it."""
        self.stop()
        if self._owns_root:
            shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- seeding and inspection (no HTTP) -------------------------------------------------

    def create_repo(
        self,
        repo_id: str,
        *,
        repo_type: str = "model",
        private: bool = False,
        exist_ok: bool = True,
    ) -> str:
        """Create a repo with the initial ``.gitattributes`` commit; return the head of main."""
        _split_repo_id(repo_id)
        if repo_type not in _URL_PREFIX:
            raise ValueError(f"unknown repo type {repo_type!r}")
        with self._lock:
            existing = self._repos.get((repo_type, repo_id))
            if existing is not None:
                if not exist_ok:
                    raise HubError(409, f"You already created this {repo_type} repo")
                return existing.branches["main"]
            repo = Repo(repo_id=repo_id, repo_type=repo_type, private=private, created_at=_now())
            self._repos[(repo_type, repo_id)] = repo
            entry = self._store_bytes(".gitattributes", DEFAULT_GITATTRIBUTES.encode(), ())
            return self._commit(repo, "main", {".gitattributes": entry}, (), "initial commit", "")

    def add_files(
        self,
        repo_id: str,
        files: Mapping[str, bytes | str | os.PathLike[str]],
        *,
        revision: str = "main",
        message: str = "Upload files",
        repo_type: str = "model",
        private: bool = False,
        delete: Iterable[str] = (),
    ) -> str:
        """Commit files straight into a repo (created if needed); return the new commit sha.

        Values are ``bytes`` (content), ``str`` (UTF-8 text content) or a path-like (a local file,
        streamed into the store). A missing branch is created from ``main``.
        """
        self.create_repo(repo_id, repo_type=repo_type, private=private)
        with self._lock:
            repo = self._repos[(repo_type, repo_id)]
            if revision not in repo.branches:
                repo.branches[revision] = repo.branches["main"]
            patterns = self._patterns(repo.commits[repo.branches[revision]])
        additions = {}
        for path, value in files.items():
            _validate_path(path)
            if isinstance(value, str):
                value = value.encode()
            if isinstance(value, bytes):
                additions[path] = self._store_bytes(path, value, patterns)
            else:
                additions[path] = self._store_file(path, Path(value), patterns)
        with self._lock:
            for entry in additions.values():
                if entry.lfs:
                    repo.lfs_oids.add(entry.sha256)
            return self._commit(repo, revision, additions, tuple(delete), message, "")

    def create_branch(
        self, repo_id: str, branch: str, *, from_revision: str = "main", repo_type: str = "model"
    ) -> str:
        """Create a branch at ``from_revision``; return its commit sha."""
        with self._lock:
            repo = self._get_repo(repo_type, repo_id)
            if branch in repo.branches:
                raise HubError(409, f"Reference already exists: {branch}")
            oid = self._resolve(repo, from_revision).oid
            repo.branches[branch] = oid
            return oid

    def resolve(self, repo_id: str, revision: str = "main", *, repo_type: str = "model") -> str:
        """The commit sha a branch name or sha points at."""
        with self._lock:
            return self._resolve(self._get_repo(repo_type, repo_id), revision).oid

    def file_entry(
        self, repo_id: str, path: str, revision: str = "main", *, repo_type: str = "model"
    ) -> FileEntry:
        """Metadata of one file at a revision."""
        with self._lock:
            commit = self._resolve(self._get_repo(repo_type, repo_id), revision)
        return self._entry(commit, path)

    def read_file(
        self, repo_id: str, path: str, revision: str = "main", *, repo_type: str = "model"
    ) -> bytes:
        """The content of one file at a revision."""
        return self._blobs.read(
            self.file_entry(repo_id, path, revision, repo_type=repo_type).sha256
        )

    def list_files(
        self, repo_id: str, revision: str = "main", *, repo_type: str = "model"
    ) -> list[str]:
        """All file paths at a revision, sorted."""
        with self._lock:
            return sorted(self._resolve(self._get_repo(repo_type, repo_id), revision).files)

    # -- fault injection ------------------------------------------------------------------

    # -- internals: storage ---------------------------------------------------------------

    def _store_bytes(self, path: str, data: bytes, patterns: Iterable[str]) -> FileEntry:
        sha256, git_oid, sample = self._blobs.put_bytes(data)
        return self._file_entry(path, len(data), sha256, git_oid, sample, patterns)

    def _store_file(self, path: str, source: Path, patterns: Iterable[str]) -> FileEntry:
        sha256, git_oid, sample = self._blobs.put_file(source)
        size = self._blobs.path(sha256).stat().st_size
        return self._file_entry(path, size, sha256, git_oid, sample, patterns)

    @staticmethod
    def _file_entry(
        path: str, size: int, sha256: str, git_oid: str, sample: bytes, patterns: Iterable[str]
    ) -> FileEntry:
        lfs = path != ".gitattributes" and _wants_lfs(path, size, sample, patterns)
        if lfs:
            git_oid = _git_blob_oid(_lfs_pointer(sha256, size))
        return FileEntry(size=size, sha256=sha256, git_oid=git_oid, lfs=lfs)

    def _patterns(self, commit: Commit) -> list[str]:
        """LFS patterns of the commit's .gitattributes."""
        entry = commit.files.get(".gitattributes")
        if entry is None:
            return _lfs_patterns(DEFAULT_GITATTRIBUTES)
        return _lfs_patterns(self._blobs.read(entry.sha256).decode(errors="replace"))

    def _commit(
        self,
        repo: Repo,
        branch: str,
        additions: Mapping[str, FileEntry],
        deletions: Iterable[str],
        title: str,
        message: str,
    ) -> str:
        """Apply changes on top of the branch head (lock held); return the new commit sha."""
        parent = repo.branches.get(branch)
        files = dict(repo.commits[parent].files) if parent else {}
        for path in deletions:
            if files.pop(path, None) is None:
                raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
        files.update(additions)
        seed = f"{parent}\n{sorted((p, e.git_oid) for p, e in files.items())}\n{uuid.uuid4()}"
        oid = hashlib.sha1(seed.encode()).hexdigest()
        repo.commits[oid] = Commit(oid, parent, files, title, message, _now())
        repo.branches[branch] = oid
        return oid

    # -- internals: lookups (raise HubError like the Hub) ---------------------------------

    def _get_repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self._repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    @staticmethod
    def _resolve(repo: Repo, revision: str) -> Commit:
        oid = repo.branches.get(revision)
        if oid is None and _COMMIT_RE.match(revision) and revision in repo.commits:
            oid = revision
        if oid is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo.commits[oid]

    @staticmethod
    def _entry(commit: Commit, path: str) -> FileEntry:
        entry = commit.files.get(path)
        if entry is None:
            raise HubError(
                404, "Entry not found", "EntryNotFound", headers={"X-Repo-Commit": commit.oid}
            )
        return entry

    def _url(self, repo: Repo) -> str:
        return f"{self.endpoint}/{_URL_PREFIX[repo.repo_type]}{repo.repo_id}"


# --------------------------------------------------------------------------------------------
# HTTP layer


class _Server(ThreadingHTTPServer):
    """Joins its request threads on close so that no thread outlives :meth:`LocalHub.stop`."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    """Routes Hub requests to :class:`LocalHub` state. One request per connection (HTTP/1.0)."""

    hub: LocalHub
    protocol_version = "HTTP/1.0"
    server_version = "LocalHub/1.0"
    timeout = 30  # bounds a stuck client

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- plumbing -------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        self.query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.segments = [unquote(s) for s in url.path.split("/")[1:]]
        self.auth = self._auth_state()
        self.hub.requests.append(
            RequestRecord(method, url.path, self.auth, self.headers.get("Range"))
        )
        try:
            self._before_route()
            if self.auth == "invalid":
                raise HubError(401, _INVALID_CREDENTIALS)
            route = self._route(method)
            if route is None:
                raise HubError(404, f"Not found: {method} {url.path}")
            route()
        except HubError as err:
            self._send_error(err, head=method == "HEAD")
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as err:  # a LocalHub bug: answer 500 rather than killing the socket
            with contextlib.suppress(OSError):
                self._send_error(HubError(500, f"LocalHub error: {err!r}"), head=method == "HEAD")

    # -- hooks for hostile variants (tests/hubserver.py) --------------------------------------

    def _before_route(self) -> None:
        """Called before every request is routed; raise :class:`HubError` to answer it."""

    def _adjust_info(self, info: dict[str, Any], blobs: bool) -> dict[str, Any]:
        """The repo-info answer to send (``blobs``: with file metadata)."""
        return info

    def _before_download(self, method: str, filename: str) -> None:
        """Called before a file download is answered; raise :class:`HubError` to refuse it."""

    def _adjust_download_headers(self, filename: str, headers: dict[str, str]) -> None:
        """Change the headers of a file download in place."""

    def _send_file(
        self, repo_type: str, repo_id: str, filename: str, source: Path, start: int, end: int
    ) -> None:
        """Send bytes [start, end) of the blob ``source`` as a download's body."""
        with open(source, "rb") as f:
            f.seek(start)
            for _, chunk in _chunks(f, start, end):
                self.wfile.write(chunk)

    def _auth_state(self) -> str:
        header = self.headers.get("Authorization")
        if header is None:
            return "none"
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and secrets.compare_digest(value.strip(), self.hub.token):
            return "valid"
        return "invalid"

    def _route(self, method: str) -> Callable[[], None] | None:
        s = self.segments
        if s[:1] == ["api"]:
            return self._route_api(method, s[1:])
        if method == "PUT" and len(s) == 2 and s[0] == "_lfs":
            return lambda: self._lfs_upload(s[1])
        repo_type, rest = ("model", s)
        if s and s[0] in ("datasets", "spaces"):
            repo_type, rest = _API_TYPES[s[0]], s[1:]
        if len(rest) >= 5 and rest[2] == "resolve" and method in ("GET", "HEAD"):
            repo_id = "/".join(rest[:2])
            return lambda: self._resolve_file(method, repo_type, repo_id, rest[3], rest[4:])
        git_tail = ["info", "lfs", "objects"]
        if len(rest) == 6 and rest[1].endswith(".git") and rest[2:5] == git_tail:
            repo_id = f"{rest[0]}/{rest[1][: -len('.git')]}"
            if method == "POST" and rest[5] == "batch":
                return lambda: self._lfs_batch(repo_type, repo_id)
            if method == "POST" and rest[5] == "verify":
                return lambda: self._lfs_verify(repo_type, repo_id)
        return None

    def _route_api(self, method: str, s: list[str]) -> Callable[[], None] | None:
        simple = {
            ("GET", "whoami-v2"): self._whoami,
            ("GET", "agent-harnesses"): lambda: self._send_json(
                200, {"standardEnvVars": [], "harnesses": {}}
            ),
            ("POST", "validate-yaml"): self._validate_yaml,
            ("POST", "repos/create"): self._create_repo,
            ("DELETE", "repos/delete"): self._delete_repo,
        }
        if (method, "/".join(s)) in simple:
            return simple[(method, "/".join(s))]
        if len(s) < 3 or s[0] not in _API_TYPES:
            return None
        return self._route_repo(method, _API_TYPES[s[0]], f"{s[1]}/{s[2]}", s[3:])

    def _route_repo(
        self, method: str, repo_type: str, repo_id: str, rest: list[str]
    ) -> Callable[[], None] | None:
        """``/api/{type}s/{org}/{name}/{action}/{args...}``: (method, action) -> (how many
        arguments it takes: exactly n, or at least n when negative, and its handler)."""
        t, r = repo_type, repo_id
        routes: dict[tuple[str, str], tuple[int, Callable[[list[str]], None]]] = {
            ("GET", ""): (0, lambda a: self._repo_info(t, r, "main")),
            ("GET", "revision"): (1, lambda a: self._repo_info(t, r, a[0])),
            ("GET", "tree"): (-1, lambda a: self._tree(t, r, a[0], "/".join(a[1:]))),
            ("GET", "refs"): (0, lambda a: self._refs(t, r)),
            ("GET", "commits"): (1, lambda a: self._commits(t, r, a[0])),
            ("POST", "preupload"): (1, lambda a: self._preupload(t, r, a[0])),
            ("POST", "commit"): (1, lambda a: self._create_commit(t, r, a[0])),
            ("POST", "branch"): (-1, lambda a: self._create_branch(t, r, "/".join(a))),
        }
        action, args = (rest[0], rest[1:]) if rest else ("", [])
        arity, handler = routes.get((method, action), (None, None))
        if handler is None or arity is None:
            return None
        if (arity >= 0 and len(args) != arity) or (arity < 0 and len(args) < -arity):
            return None
        return lambda: handler(args)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    def _read_json(self) -> Any:
        try:
            return json.loads(self._read_body() or b"{}")
        except ValueError as err:
            raise HubError(400, f"Invalid JSON body: {err}") from err

    def _send_json(
        self,
        status: int,
        payload: Any,
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_error(self, err: HubError, *, head: bool) -> None:
        headers = {"X-Error-Message": err.message, **err.headers}
        if err.code is not None:
            headers["X-Error-Code"] = err.code
        if head:
            self.send_response(err.status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send_json(err.status, {"error": err.message}, headers)

    # -- access control -------------------------------------------------------------------

    def _require_write(self) -> None:
        if self.auth != "valid":
            raise HubError(401, "A valid token is required for this action (Authorization header)")

    def _readable_repo(self, repo_type: str, repo_id: str) -> Repo:
        """The repo if this request may read it; Hub-style 401/404 otherwise (lock held)."""
        if self.hub.require_auth_for_reads and self.auth != "valid":
            raise HubError(401, "A valid token is required (require_auth_for_reads)")
        repo = self.hub._repos.get((repo_type, repo_id))
        if repo is None or (repo.private and self.auth != "valid"):
            status = 404 if self.auth == "valid" else 401
            raise HubError(status, "Repository not found", "RepoNotFound")
        return repo

    def _writable_repo(self, repo_type: str, repo_id: str) -> Repo:
        self._require_write()
        return self._readable_repo(repo_type, repo_id)

    # -- account and repo management ------------------------------------------------------

    def _whoami(self) -> None:
        if self.auth != "valid":
            raise HubError(401, _INVALID_CREDENTIALS)
        role = {"displayName": "localhub", "role": "write"}
        auth = {"type": "access_token", "accessToken": role}
        self._send_json(
            200,
            {
                "type": "user",
                "name": self.hub.user,
                "fullname": self.hub.user,
                "orgs": [],
                "auth": auth,
            },
        )

    def _validate_yaml(self) -> None:
        payload = self._read_json()
        errors = _validate_front_matter(str(payload.get("content", "")))
        body = {"errors": [{"message": e} for e in errors], "warnings": []}
        self._send_json(400 if errors else 200, body)

    def _create_repo(self) -> None:
        self._require_write()
        payload = self._read_json()
        repo_type = payload.get("type") or "model"
        name, namespace = payload.get("name"), payload.get("organization") or self.hub.user
        if repo_type not in _URL_PREFIX or not name or "/" in name:
            raise HubError(400, "Invalid repo name or type")
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        repo_id = f"{namespace}/{name}"
        url = f"{self.hub.endpoint}/{_URL_PREFIX[repo_type]}{repo_id}"
        with self.hub._lock:
            if (repo_type, repo_id) in self.hub._repos:
                message = f"You already created this {repo_type} repo"
                self._send_json(409, {"error": message, "url": url}, {"X-Error-Message": message})
                return
            self.hub.create_repo(repo_id, repo_type=repo_type, private=private)
        self._send_json(200, {"url": url, "name": repo_id, "id": repo_id})

    def _delete_repo(self) -> None:
        self._require_write()
        payload = self._read_json()
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload.get('organization') or self.hub.user}/{payload.get('name')}"
        with self.hub._lock:
            self._readable_repo(repo_type, repo_id)
            del self.hub._repos[(repo_type, repo_id)]
        self._send_json(200, {})

    def _create_branch(self, repo_type: str, repo_id: str, branch: str) -> None:
        payload = self._read_json()
        with self.hub._lock:
            self._writable_repo(repo_type, repo_id)
            start = payload.get("startingPoint") or "main"
            self.hub.create_branch(repo_id, branch, from_revision=start, repo_type=repo_type)
        self._send_json(200, {})

    # -- read API -------------------------------------------------------------------------

    def _repo_info(self, repo_type: str, repo_id: str, revision: str) -> None:
        with self.hub._lock:
            repo = self._readable_repo(repo_type, repo_id)
            commit = self.hub._resolve(repo, revision)
        blobs = self.query.get("blobs", "").lower() in ("1", "true")
        siblings = [self._sibling(path, e, blobs) for path, e in sorted(commit.files.items())]
        info = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit.oid,
            "lastModified": commit.date,
            "createdAt": repo.created_at,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
        }
        if repo_type == "model":
            info["modelId"] = repo_id
        self._send_json(200, self._adjust_info(info, blobs))

    @staticmethod
    def _sibling(path: str, entry: FileEntry, blobs: bool) -> dict[str, Any]:
        sibling: dict[str, Any] = {"rfilename": path}
        if blobs:
            sibling.update(size=entry.size, blobId=entry.git_oid)
            if entry.lfs:
                lfs = {
                    "size": entry.size,
                    "sha256": entry.sha256,
                    "pointerSize": len(entry.pointer),
                }
                sibling["lfs"] = lfs
        return sibling

    def _tree(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        with self.hub._lock:
            commit = self.hub._resolve(self._readable_repo(repo_type, repo_id), revision)
        recursive = self.query.get("recursive", "").lower() in ("1", "true")
        prefix = f"{path}/" if path else ""
        under = {p: e for p, e in commit.files.items() if p.startswith(prefix)}
        if path and not under:
            raise HubError(404, f"Path not found: {path}", "EntryNotFound")
        self._send_json(200, _tree_items(under, prefix, recursive))

    def _refs(self, repo_type: str, repo_id: str) -> None:
        with self.hub._lock:
            repo = self._readable_repo(repo_type, repo_id)
            branches = [
                {"name": name, "ref": f"refs/heads/{name}", "targetCommit": oid}
                for name, oid in sorted(repo.branches.items())
            ]
        self._send_json(200, {"branches": branches, "tags": [], "converts": [], "pullRequests": []})

    def _commits(self, repo_type: str, repo_id: str, revision: str) -> None:
        with self.hub._lock:
            repo = self._readable_repo(repo_type, repo_id)
            commit: Commit | None = self.hub._resolve(repo, revision)
            history = []
            while commit is not None:
                history.append(commit)
                commit = repo.commits.get(commit.parent) if commit.parent else None
        items = [
            {
                "id": c.oid,
                "title": c.title,
                "message": c.message,
                "date": c.date,
                "authors": [{"user": self.hub.user}],
            }
            for c in history
        ]
        self._send_json(200, items)

    # -- downloads ------------------------------------------------------------------------

    def _resolve_file(
        self, method: str, repo_type: str, repo_id: str, revision: str, path: list[str]
    ) -> None:
        filename = "/".join(path)
        with self.hub._lock:
            commit = self.hub._resolve(self._readable_repo(repo_type, repo_id), revision)
        entry = self.hub._entry(commit, filename)
        partial = "Range" in self.headers and method == "GET"
        start, end = self._byte_range(entry.size) if partial else (0, entry.size)
        self._before_download(method, filename)
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(end - start),
            "Accept-Ranges": "bytes",
            "ETag": f'"{entry.etag}"',
            "X-Repo-Commit": commit.oid,
        }
        if entry.lfs:
            headers["X-Linked-Etag"] = f'"{entry.sha256}"'
            headers["X-Linked-Size"] = str(entry.size)
        if partial:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{entry.size}"
        self._adjust_download_headers(filename, headers)
        self.send_response(206 if partial else 200)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if method == "GET":
            source = self.hub._blobs.path(entry.sha256)
            self._send_file(repo_type, repo_id, filename, source, start, end)

    def _byte_range(self, size: int) -> tuple[int, int]:
        """The [start, end) slice a ``Range: bytes=a-b`` header asks for (whole file if none)."""
        header = self.headers.get("Range")
        if header is None:
            return 0, size
        match = _RANGE_RE.match(header.strip())
        if match is None or not any(match.groups()):
            raise HubError(416, f"Unsupported Range header: {header}")
        first, last = match.groups()
        if first == "":  # suffix range: the last N bytes
            return max(size - int(last), 0), size
        start, end = int(first), min(int(last) + 1 if last else size, size)
        if start >= size and size > 0:
            raise HubError(
                416, "Range not satisfiable", headers={"Content-Range": f"bytes */{size}"}
            )
        return start, end

    # -- uploads --------------------------------------------------------------------------

    def _preupload(self, repo_type: str, repo_id: str, revision: str) -> None:
        payload = self._read_json()
        if self.query.get("create_pr"):
            raise HubError(400, "Pull requests are not supported by LocalHub")
        with self.hub._lock:
            commit = self.hub._resolve(self._writable_repo(repo_type, repo_id), revision)
            patterns = self.hub._patterns(commit)
        files = []
        for item in payload.get("files", []):
            path = _validate_path(str(item.get("path", "")))
            sample = base64.b64decode(item.get("sample", ""))
            lfs = _wants_lfs(path, int(item.get("size", 0)), sample, patterns)
            existing = commit.files.get(path)
            oid = (
                None
                if existing is None
                else (existing.sha256 if existing.lfs else existing.git_oid)
            )
            mode = "lfs" if lfs else "regular"
            files.append({"path": path, "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        self._send_json(200, {"files": files, "commitOid": commit.oid})

    def _lfs_batch(self, repo_type: str, repo_id: str) -> None:
        payload = self._read_json()
        if payload.get("operation") != "upload":
            raise HubError(400, "Only the 'upload' LFS operation is supported")
        with self.hub._lock:
            repo = self._writable_repo(repo_type, repo_id)
            objects = [self._batch_object(repo, obj) for obj in payload.get("objects", [])]
        content_type = "application/vnd.git-lfs+json"
        self._send_json(200, {"transfer": "basic", "objects": objects}, content_type=content_type)

    def _batch_object(self, repo: Repo, obj: Mapping[str, Any]) -> dict[str, Any]:
        """One LFS batch answer: no actions if present, else a signed upload href + verify."""
        oid, size = str(obj.get("oid", "")), int(obj.get("size", -1))
        if not _SHA256_RE.match(oid) or size < 0:
            return {"oid": oid, "size": size, "error": {"code": 422, "message": "Invalid object"}}
        if oid in repo.lfs_oids and self.hub._blobs.has(oid):
            return {"oid": oid, "size": size}
        ticket = secrets.token_urlsafe(24)
        self.hub._tickets[ticket] = _Ticket((repo.repo_type, repo.repo_id), oid, size)
        git_url = f"{self.hub._url(repo)}.git/info/lfs/objects"
        actions = {
            "upload": {"href": f"{self.hub.endpoint}/_lfs/{ticket}", "header": {}},
            "verify": {"href": f"{git_url}/verify", "header": {}},
        }
        return {"oid": oid, "size": size, "authenticated": True, "actions": actions}

    def _lfs_upload(self, ticket_id: str) -> None:
        with self.hub._lock:
            ticket = self.hub._tickets.pop(ticket_id, None)
        if ticket is None:
            raise HubError(403, "Unknown or already used LFS upload ticket")
        body = self._read_body()
        if len(body) != ticket.size or hashlib.sha256(body).hexdigest() != ticket.oid:
            raise HubError(400, "Uploaded content does not match the announced oid/size")
        self.hub._blobs.put_bytes(body)
        with self.hub._lock:
            repo = self.hub._repos.get(ticket.key)
            if repo is not None:
                repo.lfs_oids.add(ticket.oid)
        self._send_json(200, {})

    def _lfs_verify(self, repo_type: str, repo_id: str) -> None:
        payload = self._read_json()
        with self.hub._lock:
            repo = self._writable_repo(repo_type, repo_id)
            oid = str(payload.get("oid", ""))
            present = oid in repo.lfs_oids and self.hub._blobs.has(oid)
        if not present or self.hub._blobs.path(oid).stat().st_size != payload.get("size"):
            raise HubError(404, f"LFS object {oid} not found")
        self._send_json(200, {"message": "verified"})

    def _create_commit(self, repo_type: str, repo_id: str, revision: str) -> None:
        if self.query.get("create_pr"):
            raise HubError(400, "Pull requests are not supported by LocalHub")
        self._require_write()
        lines = [json.loads(line) for line in self._read_body().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "The commit payload must start with a header line")
        header = lines[0].get("value", {})
        with self.hub._lock:
            repo = self._writable_repo(repo_type, repo_id)
            if revision not in repo.branches:
                raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            head = repo.branches[revision]
            parent = header.get("parentCommit")
            if parent and parent != head:
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            additions, deletions = self._operations(repo, head, lines[1:])
            summary = str(header.get("summary", ""))
            oid = self.hub._commit(
                repo, revision, additions, deletions, summary, str(header.get("description", ""))
            )
            url = f"{self.hub._url(repo)}/commit/{oid}"
        body = {"success": True, "commitOid": oid, "commitUrl": url, "pullRequestUrl": None}
        self._send_json(200, body)

    def _operations(
        self, repo: Repo, head: str, items: list[Mapping[str, Any]]
    ) -> tuple[dict[str, FileEntry], list[str]]:
        """Turn ndjson commit operations into additions and deleted paths (lock held)."""
        files = repo.commits[head].files
        additions: dict[str, FileEntry] = {}
        deletions: list[str] = []
        for item in items:
            key, value = item.get("key"), item.get("value", {})
            path = _validate_path(str(value.get("path", "")).rstrip("/"))
            if key == "file":
                data = base64.b64decode(value.get("content", ""))
                sha256, git_oid, _ = self.hub._blobs.put_bytes(data)
                additions[path] = FileEntry(len(data), sha256, git_oid, lfs=False)
            elif key == "lfsFile":
                additions[path] = self._lfs_entry(repo, str(value.get("oid", "")))
            elif key == "deletedFile":
                deletions.append(path)
            elif key == "deletedFolder":
                deletions.extend(p for p in files if p.startswith(f"{path}/"))
            else:
                raise HubError(400, f"Unsupported commit operation: {key!r}")
        return additions, deletions

    def _lfs_entry(self, repo: Repo, oid: str) -> FileEntry:
        if oid not in repo.lfs_oids or not self.hub._blobs.has(oid):
            raise HubError(400, f"LFS object {oid} was not uploaded to this repo")
        size = self.hub._blobs.path(oid).stat().st_size
        return FileEntry(size, oid, _git_blob_oid(_lfs_pointer(oid, size)), lfs=True)


# --------------------------------------------------------------------------------------------
# Response helpers


def _tree_items(files: Mapping[str, FileEntry], prefix: str, recursive: bool) -> list[dict]:
    """Hub tree listing of ``files`` (all under ``prefix``): folders first, then files."""
    folders: dict[str, list[str]] = {}
    items = []
    for path, entry in sorted(files.items()):
        rel = path[len(prefix) :]
        parts = rel.split("/")
        for depth in range(1, len(parts) if recursive else min(len(parts), 2)):
            folders.setdefault(prefix + "/".join(parts[:depth]), []).append(entry.git_oid)
        if recursive or len(parts) == 1:
            items.append(_file_item(path, entry))
    folder_items = [
        {
            "type": "directory",
            "oid": hashlib.sha1("".join(oids).encode()).hexdigest(),
            "size": 0,
            "path": path,
        }
        for path, oids in sorted(folders.items())
    ]
    return folder_items + items


def _file_item(path: str, entry: FileEntry) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "file", "oid": entry.git_oid, "size": entry.size, "path": path}
    if entry.lfs:
        item["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": len(entry.pointer)}
    return item


def _chunks(f: BinaryIO, start: int, stop: int) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) pieces of an open file between two offsets."""
    offset = start
    while offset < stop:
        chunk = f.read(min(_CHUNK, stop - offset))
        if not chunk:
            return
        yield offset, chunk
        offset += len(chunk)


LocalHub.handler_class = _Handler


def main(argv: list[str] | None = None) -> int:
    """``python -m zoo.localhub``: serve a local Hub until Ctrl-C."""
    import argparse
    import signal
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m zoo.localhub",
        description="Serve a Hugging Face Hub-compatible server on 127.0.0.1, to try "
        "`zoo push` and zoo.load('hf:org/name') offline.",
    )
    parser.add_argument("--port", type=int, default=8642, help="port (default 8642; 0: any)")
    parser.add_argument(
        "--root", help="folder for the uploaded files (default: a temporary one, deleted on exit)"
    )
    parser.add_argument("--token", default="hf_local", help="the accepted token (write access)")
    parser.add_argument("--user", default="local-user", help="the token's account name")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0..65535, got {args.port}")
    if args.root is not None:
        Path(args.root).mkdir(parents=True, exist_ok=True)
    hub = LocalHub(args.token, user=args.user, root=args.root, port=args.port)
    try:
        hub.start()
    except OSError as exc:
        print(f"cannot listen on 127.0.0.1:{args.port} ({exc}); try --port 0", file=sys.stderr)
        return 1
    print(
        f"A local Hub is serving on {hub.endpoint} (repos live in memory until it stops; "
        f"files under {hub._root}).\n"
        "In the shell where you run zoo, export:\n"
        f"  export HF_ENDPOINT={hub.endpoint}\n"
        "  export HF_HUB_DISABLE_XET=1\n"
        f"  export HF_TOKEN={args.token}\n"
        "then, e.g.:\n"
        "  zoo push CHECKPOINT_DIR org/name\n"
        "  python -c 'import zoo; print(zoo.load(\"hf:org/name\"))'\n"
        "Ctrl-C stops it.",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` cleans up like Ctrl-C
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        hub.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
