"""Fetching vocabulary files from the Hugging Face Hub (cached; honours ``HF_HUB_OFFLINE``,
``HF_ENDPOINT`` and ``HF_HUB_CACHE`` like every Hub download)."""

from __future__ import annotations

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
    import huggingface_hub

    unreachable = _unreachable(repo, revision, what)
    paths = []
    for filename in filenames:
        try:
            # Unreachable or offline: the cache only, so that huggingface_hub's retry back-off
            # (about 23 s of "Retrying in 8s") never starts.
            path = huggingface_hub.hf_hub_download(
                repo_id=repo,
                filename=filename,
                revision=revision,
                cache_dir=str(cache_dir) if cache_dir is not None else None,
                local_files_only=unreachable is not None,
            )
        except Exception as exc:  # offline, network, HTTP and cache errors all end here
            why = unreachable or f"the download failed ({type(exc).__name__}: {exc})"
            raise TokenizerUnavailableError(
                f"cannot get the {what} ({filename} from the Hub repo {repo}@{revision}): "
                f"{why}, and it is not in the Hugging Face cache. To fix: run once with "
                "network access (the file is then cached), or set HF_ENDPOINT to a reachable "
                f"Hub mirror, or point HF_HUB_CACHE at a cache that holds it"
                f"{'; ' + fix if fix else ''}."
            ) from None
        paths.append(Path(path))
    return paths


_COMMIT = re.compile(r"[0-9a-f]{40}")


def _unreachable(repo: str, revision: str, what: str) -> str | None:
    """Why the Hub cannot be used now (offline, unreachable, failing), or ``None`` when it
    answers for ``repo@revision``. One request, without retries: an unreachable Hub costs
    milliseconds."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub import errors as hf

    from ..hub.failures import transport_errors

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        sha = HfApi().model_info(repo, revision=revision).sha
    except transport_errors() as exc:
        return f"the Hub at {constants.ENDPOINT} cannot be reached ({exc})"
    except hf.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status is not None and status >= 500:
            return f"the Hub at {constants.ENDPOINT} answered {status}"
        raise TokenizerUnavailableError(
            f"cannot get the {what} from the Hub repo {repo}@{revision}: {exc}"
        ) from None
    if not isinstance(sha, str) or not _COMMIT.fullmatch(sha):
        raise TokenizerUnavailableError(
            f"the Hub answered {sha!r} as the commit of {repo}@{revision}, which is not a "
            "40-hex commit id; refusing it"
        )
    return None
