"""Fetching vocabulary files from the Hugging Face Hub (cached; honours ``HF_HUB_OFFLINE``,
``HF_ENDPOINT`` and ``HF_HUB_CACHE`` like every Hub download)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from pathlib import Path

from .errors import TokenizerUnavailableError

__all__ = ["hub_files"]


def hub_files(
    repo: str,
    filenames: Sequence[str],
    *,
    revision: str = "main",
    cache_dir: str | Path | None = None,
    what: str = "tokenizer files",
    fix: str = "",
) -> list[Path]:
    """Download (or find in the cache) ``filenames`` of the Hub model repo ``repo``.

    Args:
        repo: Hub repo id, e.g. ``"openai-community/openai-gpt"``.
        filenames: files inside the repo.
        revision: branch, tag or commit.
        cache_dir: Hub cache to use (default: the usual ``HF_HUB_CACHE``).
        what: what the files are, for the error message.
        fix: a tokenizer-specific way out, appended to the error message.

    Raises:
        TokenizerUnavailableError: a file is neither cached nor downloadable (offline, no
            network, unknown repo or revision), with the ways to get it.
    """
    from ..errors import ChecksumMismatchError, UnsafeCheckpointError
    from ..hub import transfer

    commit, unreachable = _hub_commit(repo, revision, what)
    if commit is None:
        commit = _recorded_commit(repo, revision, cache_dir)
    elif not _COMMIT.fullmatch(revision):
        _record_commit(repo, revision, commit, cache_dir)
    paths = []
    for filename in filenames:
        try:
            # zoo's own download: huggingface_hub's names the cache file after the server's
            # ETag unchecked. Unreachable or offline: the cache only, so that no retry back-off
            # (about 23 s of "Retrying in 8s") ever starts.
            path: Path | None
            if unreachable is None and commit is not None:
                path = transfer.download(repo, filename, commit, cache_dir=cache_dir)
            else:
                path = transfer.cached(repo, filename, commit, cache_dir) if commit else None
            if path is None:
                raise FileNotFoundError(filename)
        except (UnsafeCheckpointError, ChecksumMismatchError):
            raise  # a hostile or corrupt answer: "run once with network access" would mislead
        except Exception as exc:  # offline, network, HTTP and cache errors all end here
            why = unreachable or f"the download failed ({type(exc).__name__}: {exc})"
            raise TokenizerUnavailableError(
                f"cannot get the {what} ({filename} from the Hub repo {repo}@{revision}): "
                f"{why}, and it is not in the Hugging Face cache. To fix: run once with "
                "network access (the file is then cached), or set HF_ENDPOINT to a reachable "
                f"Hub mirror, or point HF_HUB_CACHE at a cache that holds it"
                f"{'; ' + fix if fix else ''}."
            ) from None
        paths.append(path)
    return paths


_COMMIT = re.compile(r"[0-9a-f]{40}")


def _hub_commit(repo: str, revision: str, what: str) -> tuple[str | None, str | None]:
    """``(commit, None)``: the 40-hex commit the Hub answers for ``repo@revision``; or
    ``(None, why)``: why the Hub cannot be used now (offline, unreachable, failing). One
    request, without retries: an unreachable Hub costs milliseconds."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub import errors as hf

    from ..hub.failures import transport_errors

    if constants.HF_HUB_OFFLINE:
        return None, "HF_HUB_OFFLINE is set"
    try:
        sha = HfApi().model_info(repo, revision=revision).sha
    except transport_errors() as exc:
        return None, f"the Hub at {constants.ENDPOINT} cannot be reached ({exc})"
    except hf.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status is not None and status >= 500:
            return None, f"the Hub at {constants.ENDPOINT} answered {status}"
        raise TokenizerUnavailableError(
            f"cannot get the {what} from the Hub repo {repo}@{revision}: {exc}"
        ) from None
    if not isinstance(sha, str) or not _COMMIT.fullmatch(sha):
        raise TokenizerUnavailableError(
            f"the Hub answered {sha!r} as the commit of {repo}@{revision}, which is not a "
            "40-hex commit id; refusing it"
        )
    return sha, None


def _ref(repo: str, revision: str, cache_dir: str | Path | None) -> Path | None:
    """``<repo cache>/refs/<revision>``, where a branch's commit is recorded for offline use;
    ``None`` for a revision that would name a file outside the repo's cache folder."""
    from ..hub.transfer import inside, repo_cache

    storage = repo_cache(repo, cache_dir)
    ref = storage / "refs" / revision
    return ref if inside(ref, storage) else None


def _record_commit(repo: str, revision: str, commit: str, cache_dir: str | Path | None) -> None:
    """Record ``commit`` as ``repo@revision``'s, best effort (a read-only cache still works)."""
    ref = _ref(repo, revision, cache_dir)
    if ref is not None:
        with contextlib.suppress(OSError):
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(commit)


def _recorded_commit(repo: str, revision: str, cache_dir: str | Path | None) -> str | None:
    """The commit recorded for ``repo@revision`` in the cache, if it is a 40-hex id."""
    if _COMMIT.fullmatch(revision):
        return revision
    ref = _ref(repo, revision, cache_dir)
    try:
        recorded = ref.read_text().strip() if ref is not None else ""
    except OSError:
        return None
    return recorded if _COMMIT.fullmatch(recorded) else None
