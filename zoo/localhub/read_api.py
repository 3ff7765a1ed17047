"""The local Hub's read API: repo info, trees, refs, commit history, and file downloads
(served straight from the blob store, with ``Range`` support; no CDN, no xet)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from .protocol import HandlerBase
from .storage import Commit, FileEntry, HubError

_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


class ReadRoutes(HandlerBase):
    """Answers the requests that read repos and download files."""

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
