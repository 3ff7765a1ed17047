"""The local Hub's write API: accounts, repo creation and deletion, branches, preupload,
the git-LFS batch/upload/verify protocol, and commits."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from collections.abc import Mapping
from typing import Any

from .protocol import INVALID_CREDENTIALS, URL_PREFIX, HandlerBase
from .storage import (
    SHA256_RE,
    FileEntry,
    HubError,
    Repo,
    Ticket,
    git_blob_oid,
    lfs_pointer,
    validate_front_matter,
    validate_path,
    wants_lfs,
)


class WriteRoutes(HandlerBase):
    """Answers the requests that manage accounts and repos and upload files."""

    # -- account and repo management ------------------------------------------------------

    def _whoami(self) -> None:
        if self.auth != "valid":
            raise HubError(401, INVALID_CREDENTIALS)
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
        errors = validate_front_matter(str(payload.get("content", "")))
        body = {"errors": [{"message": e} for e in errors], "warnings": []}
        self._send_json(400 if errors else 200, body)

    def _create_repo(self) -> None:
        self._require_write()
        payload = self._read_json()
        repo_type = payload.get("type") or "model"
        name, namespace = payload.get("name"), payload.get("organization") or self.hub.user
        if repo_type not in URL_PREFIX or not name or "/" in name:
            raise HubError(400, "Invalid repo name or type")
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        repo_id = f"{namespace}/{name}"
        url = f"{self.hub.endpoint}/{URL_PREFIX[repo_type]}{repo_id}"
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
            path = validate_path(str(item.get("path", "")))
            sample = base64.b64decode(item.get("sample", ""))
            lfs = wants_lfs(path, int(item.get("size", 0)), sample, patterns)
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
        if not SHA256_RE.match(oid) or size < 0:
            return {"oid": oid, "size": size, "error": {"code": 422, "message": "Invalid object"}}
        if oid in repo.lfs_oids and self.hub._blobs.has(oid):
            return {"oid": oid, "size": size}
        ticket = secrets.token_urlsafe(24)
        self.hub._tickets[ticket] = Ticket((repo.repo_type, repo.repo_id), oid, size)
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
            path = validate_path(str(value.get("path", "")).rstrip("/"))
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
        return FileEntry(size, oid, git_blob_oid(lfs_pointer(oid, size)), lfs=True)
