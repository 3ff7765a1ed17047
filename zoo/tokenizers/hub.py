"""Fetching vocabulary files from the Hugging Face Hub (cached; honours ``HF_HUB_OFFLINE``,
``HF_ENDPOINT`` and ``HF_HUB_CACHE`` like every Hub download)."""

from __future__ import annotations

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

    paths = []
    for filename in filenames:
        try:
            path = huggingface_hub.hf_hub_download(
                repo_id=repo,
                filename=filename,
                revision=revision,
                cache_dir=str(cache_dir) if cache_dir is not None else None,
            )
        except Exception as exc:  # offline, network, HTTP and cache errors all end here
            offline = huggingface_hub.constants.HF_HUB_OFFLINE
            raise TokenizerUnavailableError(
                f"cannot get the {what} ({filename} from the Hub repo {repo}@{revision}): "
                f"{'HF_HUB_OFFLINE is set and ' if offline else ''}it is not in the Hugging "
                f"Face cache{'' if offline else ' and the download failed'} "
                f"({type(exc).__name__}: {exc}). To fix: run once with network access (the "
                "file is then cached), or set HF_ENDPOINT to a reachable Hub mirror, or point "
                f"HF_HUB_CACHE at a cache that holds it{'; ' + fix if fix else ''}."
            ) from exc
        paths.append(Path(path))
    return paths
