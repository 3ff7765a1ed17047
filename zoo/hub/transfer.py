"""Downloading one file of a Hub repo into the Hugging Face cache, every path chosen by zoo.

``huggingface_hub.hf_hub_download`` names the cache blob after the ``ETag`` the server sends
and the snapshot folder after its ``X-Repo-Commit`` header, without checking either: a server
answering ``ETag: "../../site-packages/x.pth"`` makes it write that file outside the cache (a
``.pth`` file runs at the next Python start). zoo therefore downloads itself, through
``huggingface_hub``'s own HTTP session, URL builder and headers, and lays the file out in the
same cache layout (``blobs/<etag>``, ``snapshots/<commit>/<file>``, so the Hugging Face tools
and an offline warm cache keep working) under rules that no server answer can bend:

- the commit is a 40-hex id resolved before, the file name a plain name validated before;
- the body goes to a staging file whose name zoo makes up, hashed while it streams;
- the ``ETag`` must be a 40-hex git blob id or a 64-hex sha256, and the bytes must hash to it
  (a wrong byte is refused even when the Hub's metadata call failed); only then is the file
  renamed to ``blobs/<etag>``;
- every path is checked to stay inside the repo's cache folder before it is written;
- a download has an overall deadline and a stall timeout (``ZOO_HUB_DEADLINE``,
  ``ZOO_HUB_STALL_TIMEOUT``); a cut connection resumes with a ``Range`` request a few times;
  ``429 Too Many Requests`` and ``503`` are retried with back-off, honouring ``Retry-After``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import ChecksumMismatchError, HubUnavailableError, UnsafeCheckpointError

__all__ = [
    "Limits",
    "cached",
    "check_commit",
    "check_filename",
    "download",
    "inside",
    "repo_cache",
]

_COMMIT = re.compile(r"[0-9a-f]{40}")
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
_RETRY_STATUS = (429, 503)


@dataclasses.dataclass(frozen=True)
class Limits:
    """How long one download may take.

    Args:
        deadline: seconds for the whole file, retries and resumes included.
        stall: seconds the connection may stay silent (connecting or between two reads).
        attempts: tries in all: a cut connection resumes, a 429/503 answer waits and retries.
        max_wait: the longest back-off honoured from a ``Retry-After`` header, in seconds.
    """

    deadline: float = 3600.0
    stall: float = 60.0
    attempts: int = 4
    max_wait: float = 30.0

    @classmethod
    def from_env(cls) -> Limits:
        """Defaults, overridden by ``ZOO_HUB_DEADLINE`` and ``ZOO_HUB_STALL_TIMEOUT``."""
        values: dict[str, float] = {}
        names = (("deadline", "ZOO_HUB_DEADLINE"), ("stall", "ZOO_HUB_STALL_TIMEOUT"))
        for field, variable in names:
            text = os.environ.get(variable)
            if text:
                try:
                    value = float(text)
                except ValueError:
                    value = -1.0
                if not value > 0:
                    raise ValueError(f"{variable} must be a number of seconds > 0, got {text!r}")
                values[field] = value
        return cls(
            deadline=values.get("deadline", cls.deadline), stall=values.get("stall", cls.stall)
        )


def check_commit(sha: Any, where: str) -> str:
    """``sha`` if it is a 40-hex commit id; anything else a server says is refused."""
    if not isinstance(sha, str) or not _COMMIT.fullmatch(sha):
        raise UnsafeCheckpointError(
            f"{where}: the Hub answered {str(sha)[:80]!r} as a commit id, which is not 40 "
            "hexadecimal digits; refusing it (nothing was written)"
        )
    return sha


def check_filename(name: Any, where: str) -> str:
    """``name`` if it is a plain file name (letters, digits, ``._-``; no folder, no ``..``, no
    control character): what zoo reads from or writes to a checkpoint folder."""
    if not isinstance(name, str) or not _FILENAME.fullmatch(name) or name in (".", ".."):
        raise UnsafeCheckpointError(
            f"{where}: {str(name)[:80]!r} is not a plain file name (letters, digits, '.', '_' "
            "and '-', no folder, no '..', no control character); refusing it"
        )
    return name


def inside(path: Path, root: Path) -> bool:
    """Whether ``path``, links followed, stays inside ``root``."""
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def repo_cache(repo_id: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<cache_dir or HF_HUB_CACHE>/models--org--name``: the only folder a download of
    ``repo_id`` writes."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    root = Path(cache_dir) if cache_dir is not None else Path(constants.HF_HUB_CACHE)
    return root / repo_folder_name(repo_id=repo_id, repo_type="model")


def cached(
    repo_id: str, filename: str, commit: str, cache_dir: str | os.PathLike[str] | None = None
) -> Path | None:
    """``<repo cache>/snapshots/<commit>/<filename>`` if it is cached (inside the repo's cache
    folder), else ``None``; reads only."""
    where = f"{repo_id}@{commit[:12]}: {filename}"
    storage = repo_cache(repo_id, cache_dir)
    pointer = storage / "snapshots" / check_commit(commit, where) / check_filename(filename, where)
    return pointer if pointer.exists() and inside(pointer, storage) else None


def _etag(headers: Any, where: str) -> str:
    raw = headers.get("X-Linked-Etag") or headers.get("ETag") or ""
    etag = raw.removeprefix("W/").strip('"').lower()
    if not _ETAG.fullmatch(etag):
        raise UnsafeCheckpointError(
            f"{where}: the Hub answered the ETag {raw[:80]!r}, which is neither a git blob id "
            "nor a sha256; refusing the download (nothing was written)"
        )
    return etag


class _Digest:
    """sha256 and git blob sha1 of a stream, fed chunk by chunk."""

    def __init__(self, size: int | None) -> None:
        self.sha256 = hashlib.sha256()
        self.sha1 = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False) if size else None

    def update(self, chunk: bytes) -> None:
        self.sha256.update(chunk)
        if self.sha1 is not None:
            self.sha1.update(chunk)

    def mismatch(self, etag: str) -> str | None:
        """``None`` when the bytes hash to ``etag``, else what they hash to."""
        if len(etag) == 64:
            actual = self.sha256.hexdigest()
            return None if actual == etag else f"sha256 {actual}, not the Hub's LFS sha256"
        actual = self.sha1.hexdigest() if self.sha1 is not None else "unknown (no size sent)"
        return None if actual == etag else f"git blob id {actual}, not the Hub's"


def _wait(response: Any, attempt: int, limits: Limits) -> float:
    retry_after = response.headers.get("Retry-After", "")
    try:
        seconds = float(retry_after)
    except ValueError:
        seconds = 2.0**attempt
    return min(max(seconds, 0.0), limits.max_wait)


def download(
    repo_id: str,
    filename: str,
    commit: str,
    *,
    token: Any = None,
    limits: Limits | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """``<repo cache>/snapshots/<commit>/<filename>``, downloaded unless already cached;
    ``cache_dir`` replaces ``HF_HUB_CACHE`` as the cache root.

    Raises:
        zoo.UnsafeCheckpointError: the server's answer would place a file outside the cache.
        zoo.ChecksumMismatchError: the bytes do not hash to the ETag the server gave.
        zoo.HubUnavailableError: the deadline or the stall timeout ran out.
        huggingface_hub errors (HTTP, connection): mapped by :func:`~zoo.hub.failures.hub_errors`.
    """
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub import errors as hf
    from huggingface_hub.utils import build_hf_headers

    where = f"{repo_id}@{commit[:12]}: {filename}"
    check_commit(commit, where)
    check_filename(filename, where)
    storage = repo_cache(repo_id, cache_dir)
    pointer = storage / "snapshots" / commit / filename
    if pointer.exists() and inside(pointer, storage):
        return pointer
    if constants.HF_HUB_OFFLINE:
        raise hf.OfflineModeIsEnabled(f"{where} is not cached and HF_HUB_OFFLINE is set")
    limits = limits or Limits.from_env()
    url = hf_hub_url(repo_id, filename, revision=commit, endpoint=constants.ENDPOINT)
    blobs = storage / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    staging = blobs / f".zoo-{uuid.uuid4().hex}.incomplete"  # a name no server chose
    start = time.monotonic()
    try:
        etag = _fetch(url, build_hf_headers(token=token), staging, where, limits, start)
        blob = blobs / etag
        if not (inside(blob, storage) and inside(pointer, storage)):  # cannot happen: checked
            raise UnsafeCheckpointError(f"{where}: a cache path leaves {storage}")
        os.replace(staging, blob)
    finally:
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
    pointer.parent.mkdir(parents=True, exist_ok=True)
    _link(blob, pointer)
    return pointer


def _fetch(
    url: str, headers: dict[str, str], staging: Path, where: str, limits: Limits, start: float
) -> str:
    """Stream ``url`` into ``staging`` through huggingface_hub's HTTP session (its proxies,
    certificates and user agent); return the verified ETag."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    try:
        import httpx2 as httpx
    except ImportError:  # pragma: no cover - huggingface_hub versions built on httpx
        import httpx  # type: ignore[no-redef,import-not-found,unused-ignore]

    session = get_session()
    digest: _Digest | None = None
    etag = ""
    done = 0
    for attempt in range(limits.attempts):
        request_headers = dict(headers)
        if done:
            request_headers["Range"] = f"bytes={done}-"
        try:
            with session.stream(
                "GET",
                url,
                headers=request_headers,
                follow_redirects=True,
                timeout=httpx.Timeout(limits.stall),
            ) as response:
                if response.status_code in _RETRY_STATUS and attempt + 1 < limits.attempts:
                    time.sleep(_wait(response, attempt, limits))
                    continue
                if response.status_code >= 400:
                    response.read()  # the error body, for the message
                hf_raise_for_status(response)
                if done and response.status_code != 206:  # no resume: start over
                    done, digest = 0, None
                if digest is None:
                    etag = _etag(response.headers, where)
                    size = response.headers.get("X-Linked-Size") or response.headers.get(
                        "Content-Length"
                    )
                    digest = _Digest(int(size) if size and size.isdigit() else None)
                with open(staging, "ab" if done else "wb") as out:
                    for chunk in response.iter_bytes():  # as it arrives, not buffered
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if time.monotonic() - start > limits.deadline:
                            raise HubUnavailableError(
                                f"{where}: the download took more than {limits.deadline:g} s "
                                "(ZOO_HUB_DEADLINE) and was stopped; nothing was kept"
                            )
            break
        except (httpx.ReadTimeout, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise HubUnavailableError(
                f"{where}: the Hub sent nothing for {limits.stall:g} s (ZOO_HUB_STALL_TIMEOUT) "
                "and the download was stopped; nothing was kept"
            ) from exc
        except (httpx.RemoteProtocolError, httpx.ReadError):
            if attempt + 1 == limits.attempts:
                raise
            if time.monotonic() - start > limits.deadline:
                raise
    assert digest is not None  # the loop either set it or raised
    problem = digest.mismatch(etag)
    if problem is not None:
        raise ChecksumMismatchError(
            f"{where}: the downloaded bytes have {problem} {etag} (the ETag it sent). The "
            "download was corrupted or the server is lying; it was deleted from the Hugging "
            "Face cache and nothing was loaded. Try again."
        )
    return etag


def _link(blob: Path, pointer: Path) -> None:
    """``pointer`` -> ``blob``: a relative link as huggingface_hub makes, or a copy where links
    are not allowed; replaced atomically."""
    temporary = pointer.with_name(f".{pointer.name}.{uuid.uuid4().hex}")
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), temporary)
    except OSError:
        shutil.copyfile(blob, temporary)
    os.replace(temporary, pointer)
