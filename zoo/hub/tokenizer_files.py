"""Tokenizer files from the Hugging Face Hub (cached; honours ``HF_HUB_OFFLINE``,
``HF_ENDPOINT`` and ``HF_HUB_CACHE`` like every Hub download): :func:`hub_files` fetches
vocabulary files, :func:`repo_tokenizer` makes the tokenizer of a Hugging Face model repo from
its ``tokenizer.json`` and ``tokenizer_config.json`` (or a checkpoint folder holding them).

:mod:`zoo.tokenizers` reads files it is given and never fetches; fetching lives here, with the
rest of zoo's Hub client."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

from ..errors import ChecksumMismatchError, UnsafeCheckpointError
from ..tokenizers.base import Tokenizer
from ..tokenizers.errors import TokenizerUnavailableError
from ..tokenizers.pretrained import TOKENIZER_CONFIG, from_pretrained, is_pretrained
from . import transfer
from .failures import redirect_loop, transport_errors

__all__ = ["hub_files", "repo_tokenizer"]


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


def repo_tokenizer(
    repo: str,
    *,
    name: str,
    revision: str = "main",
    extra: Sequence[str] = (),
    directory: str | os.PathLike[str] | None = None,
) -> Tokenizer:
    """The tokenizer files of ``repo`` (``extra``: more files the repo has, e.g.
    ``generation_config.json``) as a zoo tokenizer named ``name``; a ``directory`` holding
    Hugging Face tokenizer files (a checkpoint's folder) wins over the Hub.

    Raises:
        TokenizerUnavailableError: a file is neither cached nor downloadable.
    """
    if directory is not None and is_pretrained(Path(directory)):
        return from_pretrained(Path(directory), name=name)
    files = ["tokenizer.json", TOKENIZER_CONFIG, *extra]
    fix = "or pass directory=... holding the repo's tokenizer files"
    paths = hub_files(repo, files, revision=revision, what=f"{name} tokenizer", fix=fix)
    return from_pretrained(
        paths[0].parent, name=name, description=f"{name}: the tokenizer of {repo}@{revision[:12]}"
    )


_COMMIT = re.compile(r"[0-9a-f]{40}")


def _hub_commit(repo: str, revision: str, what: str) -> tuple[str | None, str | None]:
    """``(commit, None)``: the 40-hex commit the Hub answers for ``repo@revision``; or
    ``(None, why)``: why the Hub cannot be used now (offline, unreachable, failing). One
    request, without retries: an unreachable Hub costs milliseconds."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub import errors as hf

    if constants.HF_HUB_OFFLINE:
        return None, "HF_HUB_OFFLINE is set"
    try:
        sha = HfApi().model_info(repo, revision=revision).sha
    except transport_errors() as exc:
        why = redirect_loop(exc) or f"cannot be reached ({exc})"
        return None, f"the Hub at {constants.ENDPOINT} {why}"
    except (RecursionError, ValueError) as exc:  # an answer huggingface_hub could not parse
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        return None, f"the Hub at {constants.ENDPOINT} sent an unreadable answer ({why})"
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
    storage = transfer.repo_cache(repo, cache_dir)
    ref = storage / "refs" / revision
    return ref if transfer.inside(ref, storage) else None


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
