"""Downloading one file of a Hub repo into the Hugging Face cache, every path chosen by zoo.

``huggingface_hub.hf_hub_download`` names the cache blob after the ``ETag`` the server sends
and the snapshot folder after its ``X-Repo-Commit`` header, without checking either: a server
answering ``ETag: "../../site-packages/x.pth"`` makes it write that file outside the cache (a
``.pth`` file runs at the next Python start). zoo therefore downloads itself, through
``huggingface_hub``'s own HTTP session, URL builder and headers, and lays the file out in the
same cache layout (``blobs/<etag>``, ``snapshots/<commit>/<file>``, so the Hugging Face tools
and an offline warm cache keep working) under rules that no server answer can bend:

- the commit is a 40-hex id resolved before, the file name a plain name validated before;
- the body goes to a staging file whose name zoo makes up, hashed while it streams; the file is
  removed when the download fails, and one a killed process left is removed by the next
  download into the same cache (:mod:`zoo.hub.staging`);
- the ``ETag`` must be a 40-hex git blob id or a 64-hex sha256, and the bytes must hash to it
  (a wrong byte is refused even when the Hub's metadata call failed); only then is the file
  renamed to ``blobs/<etag>``;
- every path is checked to stay inside the repo's cache folder before it is written;
- every file is bounded by the size the Hub declares for it (its file metadata, then the
  ``X-Linked-Size``/``Content-Length`` of the download) and by a cap: ``ZOO_HUB_MAX_FILE_BYTES``
  (64 MiB) for every file but the weights, ``ZOO_HUB_MAX_BYTES`` (64 GiB) for a weights file or
  shard. A size over the cap, over the size declared before, or over the free disk space is
  refused before the body is read; the bytes received are counted, so a body that goes on past
  its bound (an endless chunked body, a false or missing ``Content-Length``) is stopped as soon
  as it passes it; nothing is kept;
- a pull has one overall deadline and a stall timeout (``ZOO_HUB_DEADLINE``,
  ``ZOO_HUB_STALL_TIMEOUT``) covering the revision and metadata calls (:func:`within_deadline`),
  the downloads and every back-off; a cut connection resumes with a ``Range`` request a few
  times; ``429 Too Many Requests`` and ``503`` are retried, honouring a ``Retry-After`` that is
  a sane number of seconds or an HTTP date (anything else gets the usual back-off), and a
  ``Retry-After`` longer than what remains of the deadline fails at once.
"""

from __future__ import annotations

import email.utils
import hashlib
import math
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ChecksumMismatchError, HubUnavailableError, UnsafeCheckpointError
from .bounds import DISK_CHECK_EVERY, Bound, Limits, declared_size
from .staging import Staging, sweep

__all__ = [
    "Limits",
    "cached",
    "check_commit",
    "check_filename",
    "declared_size",
    "download",
    "inside",
    "repo_cache",
    "retry_after",
    "within_deadline",
]

_T = TypeVar("_T")

_COMMIT = re.compile(r"[0-9a-f]{40}")
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
_RETRY_STATUS = (429, 503)


def within_deadline(
    call: Callable[[], _T], *, limits: Limits, start: float, where: str, doing: str
) -> _T:
    """``call()``, or :class:`~zoo.errors.HubUnavailableError` once ``limits.deadline``
    seconds have passed since ``start``, whatever the server does (a reply dripped one byte at
    a time, headers included, never trips a per-read timeout). The call runs on a daemon
    thread, left to finish on its own when the deadline passes; its result is then dropped."""
    remaining = limits.deadline - (time.monotonic() - start)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread below
            outcome["error"] = exc

    worker = threading.Thread(target=run, name=f"zoo-hub {where}", daemon=True)
    worker.start()
    worker.join(max(remaining, 0.0))
    if worker.is_alive():
        raise HubUnavailableError(
            f"{where}: {doing} took more than {limits.deadline:g} s (ZOO_HUB_DEADLINE) and was "
            "abandoned; nothing was downloaded. The Hub is too slow or not answering: try "
            "again later, or raise ZOO_HUB_DEADLINE."
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


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


def retry_after(text: str | None) -> float | None:
    """The seconds a ``Retry-After`` header asks for: a finite number >= 0, or an HTTP date
    (seconds from now, 0 if past); ``None`` for anything else (missing, ``nan``, negative,
    garbage), which gets the usual back-off instead."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            return None
        seconds = max(when.timestamp() - time.time(), 0.0)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _wait(response: Any, attempt: int, limits: Limits, start: float, where: str) -> float:
    """Seconds to wait before retrying a 429/503 answer; an error when the server asks for
    more than what remains of the deadline."""
    asked = retry_after(response.headers.get("Retry-After"))
    seconds = min(2.0**attempt if asked is None else asked, limits.max_wait)
    remaining = limits.deadline - (time.monotonic() - start)
    if seconds > remaining:
        raise HubUnavailableError(
            f"{where}: the Hub answered {response.status_code} and asked to retry in "
            f"{seconds:g} s (Retry-After: {str(response.headers.get('Retry-After'))[:40]!r}), "
            f"but only {max(remaining, 0.0):.1f} s remain of the {limits.deadline:g} s "
            "deadline (ZOO_HUB_DEADLINE); stopped without waiting, nothing was kept. Try "
            "again later, or raise ZOO_HUB_DEADLINE."
        )
    return seconds


def download(
    repo_id: str,
    filename: str,
    commit: str,
    *,
    token: Any = None,
    limits: Limits | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    large: bool = False,
    start: float | None = None,
    size: int | None = None,
) -> Path:
    """``<repo cache>/snapshots/<commit>/<filename>``, downloaded unless already cached;
    ``cache_dir`` replaces ``HF_HUB_CACHE`` as the cache root. Only a ``large`` file (the
    weights) may exceed ``limits.max_file_bytes`` (up to ``limits.max_bytes``); ``size`` is the
    size the Hub's file metadata declares (:func:`declared_size`), which the body may not
    exceed; ``start`` is when the deadline's clock started (default: now). Staging files a
    killed process left in the repo's cache are removed (:func:`zoo.hub.staging.sweep`).

    Raises:
        zoo.UnsafeCheckpointError: the server's answer would place a file outside the cache,
            or the file exceeds the size declared for it or its cap.
        zoo.HubError: the declared size is more than the free disk space.
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
    limits = limits or Limits.from_env()
    cap, cap_name = limits.cap(large)
    bound = Bound(cap, cap, cap_name)
    blobs = storage / "blobs"
    if blobs.is_dir() and inside(blobs, storage):
        sweep(blobs)
    if pointer.exists() and inside(pointer, storage):
        if (cached_size := pointer.stat().st_size) > bound.cap:
            raise bound.exceeded(f"{where} (cached)", f"the file is {cached_size:,} bytes")
        return pointer
    bound = bound.tighter(size, "the Hub's file metadata", where)
    if constants.HF_HUB_OFFLINE:
        raise hf.OfflineModeIsEnabled(f"{where} is not cached and HF_HUB_OFFLINE is set")
    url = hf_hub_url(repo_id, filename, revision=commit, endpoint=constants.ENDPOINT)
    blobs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic() if start is None else start
    with Staging(blobs) as staging:  # a name no server chose; removed unless published
        etag = _fetch(url, build_hf_headers(token=token), staging, where, limits, start, bound)
        blob = blobs / etag
        if not (inside(blob, storage) and inside(pointer, storage)):  # cannot happen: checked
            raise UnsafeCheckpointError(f"{where}: a cache path leaves {storage}")
        staging.publish(blob)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    _link(blob, pointer)
    return pointer


def _fetch(
    url: str,
    headers: dict[str, str],
    staging: Staging,
    where: str,
    limits: Limits,
    start: float,
    bound: Bound,
) -> str:
    """Stream ``url`` into ``staging`` through huggingface_hub's HTTP session (its proxies,
    certificates and user agent); return the verified ETag. More than ``bound`` bytes
    (announced or received) is refused."""
    try:
        import httpx2 as httpx
    except ImportError:  # pragma: no cover - huggingface_hub versions built on httpx
        import httpx  # type: ignore[no-redef,import-not-found,unused-ignore]

    download = _Download(staging, where, limits, start, bound)
    for attempt in range(limits.attempts):
        try:
            if download.attempt(url, headers, attempt, httpx):
                break
        except (httpx.ReadTimeout, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise HubUnavailableError(
                f"{where}: the Hub sent nothing for {limits.stall:g} s (ZOO_HUB_STALL_TIMEOUT) "
                "and the download was stopped; nothing was kept"
            ) from exc
        except (httpx.RemoteProtocolError, httpx.ReadError):
            if attempt + 1 == limits.attempts or time.monotonic() - start > limits.deadline:
                raise
    return download.verified_etag()


class _Download:
    """One file's download into ``staging``, over as many attempts as it takes: a broken
    connection resumes with a Range request where the server allows it."""

    def __init__(
        self, staging: Staging, where: str, limits: Limits, start: float, bound: Bound
    ) -> None:
        self.staging, self.where, self.limits, self.start, self.bound = (
            staging, where, limits, start, bound,
        )  # fmt: skip
        self.digest: _Digest | None = None
        self.etag = ""
        self.done = 0  # bytes written
        self.announced: int | None = None

    def attempt(self, url: str, headers: dict[str, str], attempt: int, httpx: Any) -> bool:
        """One request; ``False`` when it should be retried (a 429 or 5xx answer)."""
        from huggingface_hub.utils import get_session, hf_raise_for_status

        request_headers = dict(headers)
        if self.done:
            request_headers["Range"] = f"bytes={self.done}-"
        with get_session().stream(
            "GET",
            url,
            headers=request_headers,
            follow_redirects=True,
            timeout=httpx.Timeout(self.limits.stall),
        ) as response:
            if response.status_code in _RETRY_STATUS and attempt + 1 < self.limits.attempts:
                time.sleep(_wait(response, attempt, self.limits, self.start, self.where))
                return False
            if response.status_code >= 400:
                response.read()  # the error body, for the message
            hf_raise_for_status(response)
            if self.done and response.status_code != 206:  # no resume: start over
                self.done, self.digest = 0, None
            if self.digest is None:
                self._begin(response.headers)
            self._write(response)
        return True

    def _begin(self, headers: Mapping[str, str]) -> None:
        """Read the ETag and the announced size of a fresh download; bound it by that size
        (refused at once over the bound so far) and check the disk has room for it."""
        self.etag = _etag(headers, self.where)
        size = headers.get("X-Linked-Size") or headers.get("Content-Length")
        self.announced = int(size) if size and size.isdigit() else None
        self.digest = _Digest(self.announced)
        header = "X-Linked-Size" if headers.get("X-Linked-Size") else "Content-Length"
        self.bound = self.bound.tighter(self.announced, f"the {header} header", self.where)
        self.bound.check_disk(self.staging.folder, self.where)

    def _write(self, response: Any) -> None:
        """Write the body to the staging file as it arrives (never buffered whole), appended
        to what an earlier attempt wrote when the server resumed it."""
        out = self.staging.file
        out.seek(self.done)
        out.truncate()
        for chunk in response.iter_bytes():
            self._write_chunk(out, chunk)

    def _write_chunk(self, out: Any, chunk: bytes) -> None:
        """One piece of the body: refused once the body passes its bound (before it is
        written), and once the deadline has passed."""
        assert self.digest is not None
        if self.done + len(chunk) > self.bound.size:
            said = f"{self.announced:,} bytes" if self.announced is not None else "no size"
            arrived = f"more than {self.bound.size:,} bytes arrived (the server announced {said})"
            raise self.bound.exceeded(self.where, arrived)
        out.write(chunk)
        self.digest.update(chunk)
        if self.done // DISK_CHECK_EVERY != (self.done + len(chunk)) // DISK_CHECK_EVERY:
            self.bound.check_disk(self.staging.folder, self.where, self.done + len(chunk))
        self.done += len(chunk)
        if time.monotonic() - self.start > self.limits.deadline:
            raise HubUnavailableError(
                f"{self.where}: the download took more than {self.limits.deadline:g} s "
                "(ZOO_HUB_DEADLINE) and was stopped; nothing was kept"
            )

    def verified_etag(self) -> str:
        """The ETag, once the bytes received are checked to hash to it."""
        assert self.digest is not None  # every attempt either began the download or raised
        problem = self.digest.mismatch(self.etag)
        if problem is not None:
            raise ChecksumMismatchError(
                f"{self.where}: the downloaded bytes have {problem} {self.etag} (the ETag it "
                "sent). The download was corrupted or the server is lying; it was deleted from "
                "the Hugging Face cache and nothing was loaded. Try again."
            )
        return self.etag


def _link(blob: Path, pointer: Path) -> None:
    """``pointer`` -> ``blob``: a relative link as huggingface_hub makes, or a copy where links
    are not allowed; replaced atomically."""
    temporary = pointer.with_name(f".{pointer.name}.{uuid.uuid4().hex}")
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), temporary)
    except OSError:
        shutil.copyfile(blob, temporary)
    os.replace(temporary, pointer)
