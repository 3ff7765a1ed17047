"""Pulling a checkpoint from the Hub into the standard Hugging Face cache.

One pull:

1. resolves the revision to a commit sha once (``HfApi.resolve_revision``; offline or with the
   Hub unreachable it reads the sha the cache recorded for that revision), then fetches every
   file at that sha, so weights, config and tokenizer come from the same commit;
2. reads the Hub's file metadata at that commit (size, git blob id, LFS sha256) when online;
3. downloads ``config.json`` and decides from it what else the checkpoint needs: a zoo
   checkpoint lists its weights file and tokenizer files, a Hugging Face one gets the weights
   file plus the vocabulary files a plugin's tokenizer may read (``vocab.json``,
   ``merges.txt``). Nothing else is fetched: no code, no pickles, no other weight formats;
4. checks the expected sha256 of the weights (pinned in the registry, recorded in
   ``config.json``, and the Hub's LFS sha256) agree *before* downloading them, and verifies
   every downloaded file afterwards: a mismatch deletes the file from the cache and raises
   :class:`~zoo.errors.ChecksumMismatchError`;
5. a sharded checkpoint (``model.safetensors.index.json`` in place of ``model.safetensors``):
   the index is fetched and checked first (plain shard names only, every shard in the repo,
   the shards ``config.json`` records for a zoo checkpoint, the pin on the index), each
   shard's expected sha256 is settled (``config.json``, the Hub's LFS sha256), and only then
   are the shards downloaded, each verified as the single weights file is.

The cache layout, ``HF_ENDPOINT``, ``HF_HOME``/``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and
``HF_TOKEN`` are ``huggingface_hub``'s own; the download itself is zoo's
(:mod:`zoo.hub.transfer`), so that no server answer chooses a path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..checkpoint.files import PICKLE_SUFFIXES, remember_verified, sha256_file, was_verified
from ..checkpoint.manifest import CONFIG_FILE, Manifest, config_format, read_config_json
from ..checkpoint.shards import check_recorded_shards, index_file, is_index, read_index
from ..errors import (
    ChecksumMismatchError,
    HubNotFoundError,
    UnsafeCheckpointError,
)
from . import transfer
from .failures import hub_errors, is_offline, transport_errors
from .source import HubSource, resolve_source
from .transfer import Limits, check_commit, check_filename, declared_size, inside, within_deadline

__all__ = ["HF_VOCAB_FILES", "Pinned", "Snapshot", "evict", "fetch", "pin", "pull"]

#: Vocabulary files fetched with a Hugging Face-layout checkpoint when the repo has them: what
#: a plugin's tokenizer may read from the checkpoint directory (GPT-1's BPE files).
#: The file that makes a repo (or a folder) a LoRA adapter, as peft writes it.
ADAPTER_CONFIG = "adapter_config.json"

#: Tokenizer files beside HF weights: BPE's, a tokenizer.json, Marian's SentencePiece pair.
HF_VOCAB_FILES = (
    "vocab.json",
    "merges.txt",
    "tokenizer.json",
    "source.spm",
    "target.spm",
    "target_vocab.json",
)
#: Other small files beside HF weights that loading reads: the generation defaults, and the
#: tokenizer's settings (its special tokens by role: T5's end of text, which the source ends with).
HF_OTHER_FILES = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A checkpoint fetched into the Hugging Face cache.

    Attributes:
        source: what was asked for.
        commit: the commit sha every file was fetched at.
        directory: ``<HF_HUB_CACHE>/models--org--name/snapshots/<commit>``.
        weights: the weights file in ``directory`` (the index, when sharded).
        sha256: the expected sha256 of the weights (``None`` when nothing is known: offline,
            no pin, and a Hugging Face checkpoint).
        expected_from: where ``sha256`` came from, for messages.
        verified: whether the weights (every shard) were hashed and matched during the pull.
        shards: a sharded checkpoint's shard files -> their expected sha256 (``config.json``
            and the Hub's LFS metadata agree on it; ``None`` when nothing is known); empty
            for a single weights file.
    """

    source: HubSource
    commit: str
    directory: Path
    weights: Path
    sha256: str | None
    expected_from: str
    verified: bool
    shards: Mapping[str, str | None] = dataclasses.field(default_factory=dict)


# -- verification -------------------------------------------------------------------------
def _git_blob_sha1(path: Path) -> str:
    """The git blob id of a file (the ETag the Hub gives a non-LFS file)."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def evict(path: Path) -> None:
    """Delete a downloaded file, ``<repo cache>/snapshots/<commit>/<file>``, from the Hugging
    Face cache: the snapshot entry and the blob it points to, so the next pull downloads it
    again. Nothing outside that repo's cache folder is ever deleted: a link that leads out of
    it is removed, never followed. Missing files are ignored."""
    commit_folder = path.parent
    storage = commit_folder.parent.parent  # <storage>/snapshots/<commit>
    blob = path.resolve() if path.is_symlink() else None
    if inside(path.parent, storage):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if blob is not None and inside(blob, storage / "blobs"):
        with contextlib.suppress(FileNotFoundError):
            blob.unlink()


def _mismatch(path: Path, actual: str, expected: str, expected_from: str, what: str) -> Exception:
    evict(path)
    return ChecksumMismatchError(
        f"{what}: the downloaded {path.name} has sha256 {actual}, but {expected_from} says "
        f"{expected}. The download was corrupted or the repo does not hold the file expected; "
        "it was deleted from the Hugging Face cache and nothing was loaded. Try again; if it "
        "persists, the repo (or the pin) is wrong."
    )


def _verify_small(path: Path, entry: Any, what: str) -> None:
    """Check a non-weights file against the Hub's metadata (LFS sha256 or git blob id)."""
    if entry is None:
        return
    lfs = getattr(entry, "lfs", None)
    if lfs is not None and getattr(lfs, "sha256", None):
        actual, expected = sha256_file(path), str(lfs.sha256)
    elif getattr(entry, "blob_id", None):
        actual, expected = _git_blob_sha1(path), str(entry.blob_id)
    else:
        return
    if actual != expected:
        raise _mismatch(path, actual, expected, "the Hub's file metadata", what)


def _verify_weights(
    path: Path, expected: str | None, expected_from: str, verify: bool, what: str
) -> bool:
    """Hash a downloaded weights file (or shard) against ``expected`` unless ``verify`` is
    off, nothing is expected or it was verified unchanged before; whether it was hashed now.
    A mismatch deletes it from the cache (:func:`_mismatch`)."""
    if not verify or expected is None or was_verified(path, expected):
        return False
    actual = sha256_file(path)
    if actual != expected:
        raise _mismatch(path, actual, expected, expected_from, what)
    remember_verified(path, expected)
    return True


def _expected_sha256(
    candidates: Mapping[str, str | None], what: str, filename: str
) -> tuple[str | None, str]:
    """The one sha256 the weights must have, and where it comes from; an error (before any
    download) when the registry pin, ``config.json`` and the Hub disagree."""
    known = {where: sha.lower() for where, sha in candidates.items() if sha}
    if len(set(known.values())) > 1:
        listed = "; ".join(f"{where}: {sha}" for where, sha in known.items())
        raise ChecksumMismatchError(
            f"{what}: the sha256 of {filename} is not the one expected ({listed}). Nothing was "
            "downloaded. The repo changed or is not the one the pin describes: pin a revision "
            "that holds the expected file, or update the pin."
        )
    if not known:
        return None, "nothing"
    first = next(iter(known))
    return known[first], first


# -- fetching -----------------------------------------------------------------------------
def _files_metadata(api: Any, repo_id: str, commit: str, token: Any) -> dict[str, Any] | None:
    """``{path: RepoSibling}`` at ``commit``, or ``None`` offline or when the Hub cannot be
    reached (the cache is used then)."""
    if is_offline():
        return None
    from huggingface_hub import errors as hf

    try:
        info = api.model_info(repo_id, revision=commit, files_metadata=True, token=token)
    except (*transport_errors(), hf.OfflineModeIsEnabled):  # type: ignore[misc]
        return None
    except hf.HfHubHTTPError as exc:
        if exc.response is not None and exc.response.status_code >= 500:
            return None
        raise
    return {s.rfilename: s for s in info.siblings or ()}


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What ``config.json`` says to fetch: the weights file (or index), the other files, and
    the sha256 it records for the weights (and for each shard of a zoo checkpoint)."""

    weights: str
    others: list[str]
    sha256: str | None = None
    shards: Mapping[str, str | None] | None = None


def _plan(
    directory: Path, source: HubSource, entries: Mapping[str, Any] | None, what: str
) -> _Plan:
    """What to fetch, from ``config.json``; a Hugging Face checkpoint whose repo (or, offline,
    cache) has the index of the weights file and not the file itself is sharded."""
    data = read_config_json(directory)
    assert data is not None  # downloaded just before
    where = f"{what}: {CONFIG_FILE}"
    if config_format(data, where=where) == "zoo":
        manifest = Manifest.from_json(data, where=where)
        spec = manifest.tokenizer or {}
        files = [check_filename(f, f"{where}: tokenizer file") for f in spec.get("files") or ()]
        weights = check_filename(manifest.weights_file, where)
        return _Plan(weights, files, manifest.sha256, manifest.shards)

    def present(name: str) -> bool:  # offline: whatever an earlier pull of this commit fetched
        return name in entries if entries is not None else (directory / name).exists()

    vocab = [f for f in (*HF_VOCAB_FILES, *HF_OTHER_FILES) if present(f)]
    weights = check_filename(source.filename, what)
    index = index_file(Path(weights)).name
    if not present(weights) and present(index):
        weights = index
    return _Plan(weights, vocab, None)


def _check_weights_name(filename: str, entries: Mapping[str, Any] | None, what: str) -> None:
    if Path(filename).suffix.lower() in PICKLE_SUFFIXES:
        raise UnsafeCheckpointError(
            f"{what}: {filename} is a pickle-based file; zoo only loads safetensors because "
            "unpickling can run arbitrary code. Nothing was downloaded."
        )
    if entries is not None and filename not in entries:
        present = sorted(entries)
        pickles = [p for p in present if Path(p).suffix.lower() in PICKLE_SUFFIXES]
        hint = (
            f" It only has pickle-based weights ({', '.join(pickles)}), which zoo never "
            "unpickles: convert them to safetensors once, from a source you trust."
            if pickles
            else ""
        )
        raise HubNotFoundError(
            f"{what}: the repo has no {filename} (it has: {', '.join(present)}).{hint}"
        )


def _fetch_shards(
    download: Callable[..., Path],
    index_path: Path,
    entries: Mapping[str, Any] | None,
    recorded: Mapping[str, str | None] | None,
    verify: bool,
    what: str,
) -> tuple[dict[str, str | None], bool]:
    """Download and verify the shards ``index_path`` names; ``(shard -> expected sha256,
    whether every shard was hashed now)``. Every check on the index (plain names, shards in
    the repo, the shards ``config.json`` records, agreeing hashes) runs before the first
    shard is downloaded."""
    where = f"{what}: {index_path.name}"
    names = [check_filename(n, where) for n in read_index(index_path, shown=Path(what)).shards]
    check_recorded_shards(
        names,
        recorded,
        where=where,
        recorded_by=CONFIG_FILE,
        hint="the repo is inconsistent; nothing of the weights was downloaded",
    )
    if entries is not None:
        missing = [n for n in names if n not in entries]
        if missing:
            raise HubNotFoundError(
                f"{where} names {len(missing)} shard(s) the repo does not have: "
                f"{', '.join(missing[:5])}. The repo is incomplete; nothing of the weights was "
                "downloaded."
            )
    expected = {
        name: _expected_sha256(
            {
                f"{CONFIG_FILE}": (recorded or {}).get(name),
                "the Hub's LFS metadata": getattr(
                    getattr((entries or {}).get(name), "lfs", None), "sha256", None
                ),
            },
            what,
            name,
        )
        for name in names
    }
    hashed = [
        _verify_weights(download(name, large=True), *expected[name], verify, what) for name in names
    ]
    return {name: sha for name, (sha, _) in expected.items()}, all(hashed)


@dataclasses.dataclass(frozen=True)
class Pinned:
    """A repo revision resolved to one commit, ready to fetch files at it.

    Attributes:
        commit: the 40-hex commit sha.
        entries: ``{path: RepoSibling}`` at that commit (size, blob id, LFS sha256), or
            ``None`` offline or when the Hub's metadata could not be read.
        what: ``org/name@<sha12> (revision)``, for messages.
        download: ``download(filename, large=False) -> path in the cache``, checked as
            :func:`zoo.hub.transfer.download` checks (only ``large`` files may exceed the cap
            for small files), bounded by the size ``entries`` declares for the file.
    """

    commit: str
    entries: Mapping[str, Any] | None
    what: str
    download: Callable[..., Path]


def pin(source: HubSource, *, token: str | bool | None = None) -> Pinned:
    """Resolve ``source``'s revision to a commit once (a server's answer never becomes a path
    unchecked) and read the repo's file metadata at it; one deadline for all that and every
    download made through the result."""
    from huggingface_hub import HfApi

    what = f"{source}"
    api = HfApi(token=token)
    limits = Limits.from_env()
    start = time.monotonic()  # one deadline for the whole pull: metadata, downloads, waits
    with hub_errors(what, pull=source.pull_argument):
        resolved = within_deadline(
            lambda: api.resolve_revision(source.repo_id, revision=source.revision).resolved,
            limits=limits,
            start=start,
            where=what,
            doing="resolving the revision",
        )
        commit = check_commit(resolved, what)  # a server's "sha" never becomes a path unchecked
        entries = within_deadline(
            lambda: _files_metadata(api, source.repo_id, commit, token),
            limits=limits,
            start=start,
            where=what,
            doing="reading the repo's file metadata",
        )
    what = f"{source.repo_id}@{commit[:12]}" + (f" ({source.revision})" if source.revision else "")

    def download(filename: str, *, large: bool = False) -> Path:
        with hub_errors(f"{what}: {filename}", pull=source.pull_argument):
            return transfer.download(
                source.repo_id,
                filename,
                commit,
                token=token,
                limits=limits,
                large=large,
                start=start,
                size=declared_size((entries or {}).get(filename)),
            )

    return Pinned(commit, entries, what, download)


def fetch(
    source: HubSource,
    *,
    token: str | bool | None = None,
    verify: bool = True,
    pinned: Pinned | None = None,
) -> Snapshot:
    """Fetch the files of ``source`` into the Hugging Face cache (see the module docstring).

    Args:
        source: what to fetch.
        token: Hub token; ``None`` uses ``HF_TOKEN`` or the saved login, ``False`` sends none.
        verify: hash the weights now. :func:`zoo.load` passes ``False`` and lets the loader
            hash them on a background thread while it builds the model.
        pinned: ``source`` already resolved by :func:`pin` (default: resolved here).
    """
    pinned = pinned or pin(source, token=token)
    commit, entries, what, download = pinned.commit, pinned.entries, pinned.what, pinned.download
    if entries is not None and CONFIG_FILE not in entries:
        raise HubNotFoundError(
            f"{what}: the repo has no {CONFIG_FILE}, so it is neither a zoo checkpoint "
            f"(zoo.push writes one) nor a Hugging Face one (it has: {', '.join(sorted(entries))})"
            + _adapter_hint(entries, source)
        )
    config = download(CONFIG_FILE)
    _verify_small(config, (entries or {}).get(CONFIG_FILE), what)
    directory = config.parent
    plan = _plan(directory, source, entries, what)
    weights_name = plan.weights
    _check_weights_name(weights_name, entries, what)

    entry = (entries or {}).get(weights_name)
    lfs = getattr(entry, "lfs", None)
    expected, expected_from = _expected_sha256(
        {
            "the registry pin": source.sha256,
            f"{CONFIG_FILE}": plan.sha256,
            "the Hub's LFS metadata": getattr(lfs, "sha256", None),
        },
        what,
        weights_name,
    )
    for name in plan.others:
        _verify_small(download(name), (entries or {}).get(name), what)
    if is_index(weights_name):
        weights = download(weights_name)  # the index, small: capped like config.json
        _verify_small(weights, entry, what)
        if expected is not None and (actual := sha256_file(weights)) != expected:
            raise _mismatch(weights, actual, expected, expected_from, what)
        shards, verified = _fetch_shards(download, weights, entries, plan.shards, verify, what)
    else:
        weights = download(weights_name, large=True)
        shards = {}
        verified = _verify_weights(weights, expected, expected_from, verify, what)
    return Snapshot(
        source=source,
        commit=commit,
        directory=directory,
        weights=weights,
        sha256=expected,
        expected_from=expected_from,
        verified=verified,
        shards=shards,
    )


def _adapter_hint(entries: Mapping[str, Any], source: HubSource) -> str:
    """What to do with a repo that holds a LoRA adapter rather than a model."""
    if ADAPTER_CONFIG not in entries:
        return ""
    return (
        f". It holds a LoRA adapter ({ADAPTER_CONFIG}): load it on its base model with "
        f"zoo.load(BASE, adapter={str(source)!r}) (zoo generate BASE ... --adapter {source})"
    )


def pull(
    name_or_repo: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
) -> Path:
    """Download a checkpoint into the Hugging Face cache, without building anything.

        >>> zoo.pull("gpt2-124m")                    # a named model's official weights
        >>> zoo.pull("org/name", revision="v1")      # a repo pushed with zoo.push (or HF's)
        >>> zoo.pull("hf:org/name@0123abcd...")      # the zoo.load spelling works too

    The revision is resolved to a commit once; every file is fetched at that commit. Only
    what loading needs is fetched (``config.json``, the safetensors weights, tokenizer
    files), and every file is checked against the Hub's metadata; the weights also against
    a pinned sha256 and the one ``config.json`` records. Honours ``HF_ENDPOINT``,
    ``HF_HOME``/``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` (a warm cache works without network)
    and ``HF_TOKEN``.

    Args:
        name_or_repo: a named model with Hub weights, ``"org/name"`` or ``"hf:org/name@rev"``.
        revision: branch, tag or commit sha (default: the registry's, else the main branch).
        token: Hub token; ``None`` uses ``HF_TOKEN`` or the saved login.

    Returns:
        the snapshot directory, ``<HF_HUB_CACHE>/models--org--name/snapshots/<commit>``;
        ``zoo.load(path)`` loads it.

    Raises:
        zoo.HubNotFoundError: no such repo, revision or file.
        zoo.HubAuthError: the token was refused.
        zoo.HubUnavailableError: the Hub cannot be reached (or a download was cut) and the
            files are not cached; :class:`zoo.HubOfflineError` when ``HF_HUB_OFFLINE`` is set.
        zoo.ChecksumMismatchError: a download does not match its expected hash (it is deleted).
    """
    source = resolve_source(name_or_repo, revision)
    return fetch(source, token=token, verify=True).directory
