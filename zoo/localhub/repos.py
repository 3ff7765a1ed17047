"""The local Hub itself: git-like repos held in memory (blobs on disk), seeded and inspected
from Python, served over HTTP by :mod:`zoo.localhub.routes` from a daemon thread."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

from .protocol import URL_PREFIX, Server
from .routes import Handler
from .storage import (
    COMMIT_RE,
    DEFAULT_GITATTRIBUTES,
    BlobStore,
    Commit,
    FileEntry,
    HubError,
    Repo,
    RequestRecord,
    Ticket,
    git_blob_oid,
    lfs_patterns,
    lfs_pointer,
    now,
    split_repo_id,
    validate_path,
    wants_lfs,
)

__all__ = ["LocalHub"]


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
    handler_class: type[Handler] = Handler

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
        self._blobs = BlobStore(self._root)
        self._repos: dict[tuple[str, str], Repo] = {}
        self._tickets: dict[str, Ticket] = {}
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
        server = Server(("127.0.0.1", self._port), handler)
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
        split_repo_id(repo_id)
        if repo_type not in URL_PREFIX:
            raise ValueError(f"unknown repo type {repo_type!r}")
        with self._lock:
            existing = self._repos.get((repo_type, repo_id))
            if existing is not None:
                if not exist_ok:
                    raise HubError(409, f"You already created this {repo_type} repo")
                return existing.branches["main"]
            repo = Repo(repo_id=repo_id, repo_type=repo_type, private=private, created_at=now())
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
            validate_path(path)
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
        lfs = path != ".gitattributes" and wants_lfs(path, size, sample, patterns)
        if lfs:
            git_oid = git_blob_oid(lfs_pointer(sha256, size))
        return FileEntry(size=size, sha256=sha256, git_oid=git_oid, lfs=lfs)

    def _patterns(self, commit: Commit) -> list[str]:
        """LFS patterns of the commit's .gitattributes."""
        entry = commit.files.get(".gitattributes")
        if entry is None:
            return lfs_patterns(DEFAULT_GITATTRIBUTES)
        return lfs_patterns(self._blobs.read(entry.sha256).decode(errors="replace"))

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
        repo.commits[oid] = Commit(oid, parent, files, title, message, now())
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
        if oid is None and COMMIT_RE.match(revision) and revision in repo.commits:
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
        return f"{self.endpoint}/{URL_PREFIX[repo.repo_type]}{repo.repo_id}"


# --------------------------------------------------------------------------------------------
# HTTP layer
