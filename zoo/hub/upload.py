"""Publishing a checkpoint to the Hub: :func:`push`."""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint.manifest import CONFIG_FILE, FORMAT, Manifest, read_config_json
from ..checkpoint.readers import model_folder
from ..checkpoint.reshard import reshard
from ..checkpoint.shards import (
    check_recorded_shards,
    is_index,
    parse_max_shard_size,
    read_index,
)
from ..checkpoint.write import save
from ..errors import CheckpointError, ChecksumMismatchError, HubError, UnsafeCheckpointError
from .adapter import ADAPTER_FILES, adapter_folder, describe_adapter
from .card import DEFAULT_LICENSE, adapter_card, model_card
from .failures import hub_errors
from .source import PREFIX
from .transfer import check_filename, inside

if TYPE_CHECKING:
    from torch import nn

__all__ = ["CARD_FILE", "CommitRef", "push"]

#: The model card file in the repo.
CARD_FILE = "README.md"

_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclasses.dataclass(frozen=True)
class CommitRef:
    """The commit :func:`push` made.

    Attributes:
        repo_id: ``"org/name"`` (the Hub's spelling; ``"name"`` lands in your namespace).
        revision: the branch pushed to.
        sha: the commit sha; ``zoo.load(ref.source)`` loads exactly this commit.
        url: the commit's page on the Hub.
    """

    repo_id: str
    revision: str
    sha: str
    url: str

    @property
    def source(self) -> str:
        """``"hf:org/name@<sha>"``, what :func:`zoo.load` takes."""
        return f"{PREFIX}{self.repo_id}@{self.sha}"

    def __str__(self) -> str:
        return self.source


def _read_checkpoint(directory: Path, repo_id: str) -> tuple[Manifest, list[str]]:
    """The manifest of a :func:`zoo.save` directory and the files to upload from it."""
    where = str(directory / CONFIG_FILE)
    manifest = Manifest.from_json(_zoo_config(directory, repo_id), where=where)
    return manifest, _files_to_upload(directory, manifest, where)


def _zoo_config(directory: Path, repo_id: str) -> dict[str, Any]:
    """The ``config.json`` of the zoo checkpoint ``directory``; an error saying what to push
    instead when it is missing, a file, or not a zoo checkpoint."""
    if not directory.exists():
        raise CheckpointError(
            f"{directory} does not exist: give the directory zoo.save() wrote or a training "
            "run's folder (or push a model object: zoo.push(model, repo_id))"
        )
    if not directory.is_dir():
        raise CheckpointError(
            f"{directory} is a file, not a checkpoint directory: give the directory zoo.save() "
            "wrote or a training run's folder"
        )
    data = read_config_json(directory)
    if data is not None and data.get("format") != FORMAT and "model_type" in data:
        raise CheckpointError(_foreign_message(directory, str(data["model_type"]), repo_id))
    if data is None or data.get("format") != FORMAT:
        raise CheckpointError(
            f"{directory} is no zoo checkpoint: zoo.push publishes directories written by "
            'zoo.save() (config.json with "format": "zoo") and training runs (their model/ or '
            "checkpoint/model/ folder), and this folder has neither. Load what it holds and "
            "push the model instead: zoo.push(zoo.load(path), repo_id)."
        )
    return data


def _files_to_upload(directory: Path, manifest: Manifest, where: str) -> list[str]:
    """The files ``config.json`` names (weights, shards, tokenizer files) and itself, each
    checked to be a plain name of a file inside ``directory``."""
    tokenizer_files = list((manifest.tokenizer or {}).get("files") or ())
    shards = _shards(directory, manifest, where)
    # the same rule as pull: plain names, read from inside the folder (no absolute path, no
    # link leading out), so a crafted config.json cannot publish any other local file
    names = [manifest.weights_file, *shards, *tokenizer_files]
    files = [check_filename(f, where) for f in names]
    files.append(CONFIG_FILE)
    outside = [f for f in files if not inside(directory / f, directory)]
    if outside:
        raise UnsafeCheckpointError(
            f"{directory}: {', '.join(outside)} lead(s) outside the checkpoint folder (a link); "
            "refusing to publish files from elsewhere"
        )
    missing = [f for f in files if not (directory / f).is_file()]
    if missing:
        raise CheckpointError(
            f"{directory} lacks {', '.join(missing)} that its config.json names; save the "
            "model again with zoo.save()"
        )
    return files


def _foreign_message(directory: Path, model_type: str, repo_id: str) -> str:
    """Why a Hugging Face folder is not pushed as it is, and the exact commands that push it:
    ``zoo convert`` to a zoo checkpoint (weights unchanged, tokenizer carried), then push
    that. (A zoo repo's ``config.json`` and card record the architecture, the plugin and
    each file's sha256, which is what ``zoo.load("hf:...")`` checks.)"""
    import shlex

    converted = directory.with_name(f"{directory.name}-zoo")
    source, target = shlex.quote(str(directory)), shlex.quote(str(converted))
    return (
        f"{directory} is a Hugging Face checkpoint (model_type {model_type!r}), not a zoo "
        "one: zoo push publishes zoo checkpoints, whose config.json and model card record the "
        "architecture and each file's sha256. Convert it first, then push the result: "
        f"zoo convert {source} {target} && zoo push {target} {shlex.quote(repo_id)} "
        f"(in Python: zoo.push(zoo.load({str(directory)!r}), {repo_id!r}))"
    )


def _shards(directory: Path, manifest: Manifest, where: str) -> list[str]:
    """The shard files of a sharded checkpoint (none for one weights file): the ones its
    index names, which must be the ones ``config.json`` records."""
    if not is_index(manifest.weights_file):
        return []
    index_path = directory / check_filename(manifest.weights_file, where)
    if not index_path.is_file():
        return []  # reported with the other missing files
    shards = list(read_index(index_path, shown=directory).shards)
    check_recorded_shards(
        shards,
        manifest.shards,
        where=str(index_path),
        recorded_by=where,
        hint="save the model again with zoo.save()",
    )
    return shards


def _operations(directory: Path, files: list[str], card: str, manifest: Manifest) -> list:
    """Commit operations for ``files`` and the card; the sha256 of the weights and of each
    shard (which ``huggingface_hub`` computes for the upload anyway) must be the one
    recorded."""
    from huggingface_hub import CommitOperationAdd

    operations = [CommitOperationAdd(f, str(directory / f)) for f in files]
    operations.append(CommitOperationAdd(CARD_FILE, card.encode("utf-8")))
    recorded = {manifest.weights_file: manifest.sha256, **(manifest.shards or {})}
    for operation in operations:
        expected = recorded.get(operation.path_in_repo)
        uploaded = operation.upload_info.sha256.hex()
        if expected is not None and uploaded != expected:
            raise ChecksumMismatchError(
                f"{directory / operation.path_in_repo} has sha256 {uploaded}, but its "
                f"config.json records {expected}: refusing to publish a corrupted or modified "
                "checkpoint. Save the model again with zoo.save().",
                path=directory / operation.path_in_repo,
                expected=expected,
                actual=uploaded,
            )
    return operations


def push(
    model_or_directory: nn.Module | str | os.PathLike[str],
    repo_id: str,
    *,
    revision: str | None = None,
    private: bool = False,
    token: str | bool | None = None,
    commit_message: str | None = None,
    license: str = DEFAULT_LICENSE,
    max_shard_size: int | str | None = None,
) -> CommitRef:
    """Publish a model (or a :func:`zoo.save` directory) to a Hub repo in one commit.

        >>> ref = zoo.push(model, "org/name")
        >>> zoo.load(ref.source)            # "hf:org/name@<commit sha>"

    The repo is created if needed (``private`` applies to a new repo only). The commit holds
    ``model.safetensors`` (or the shards and ``model.safetensors.index.json``),
    ``config.json``, the tokenizer's files when it has any (a trained tokenizer; shipped ones
    are stored by name) and a ``README.md`` model card (YAML metadata ``library_name: zoo``,
    tags and licence; architecture, components, parameter count, usage). Honours
    ``HF_ENDPOINT`` and ``HF_TOKEN``.

    Args:
        model_or_directory: a model built or loaded by zoo (saved with :func:`zoo.save`
            first, tokenizer included), a directory :func:`zoo.save` wrote, or a training
            run's folder (its final ``model/``, else its resumable ``checkpoint/model``). A
            Hugging Face folder is refused with the ``zoo convert`` command that makes it
            one.
        repo_id: ``"org/name"`` (``"name"``: in the token owner's namespace).
        revision: the branch to commit to (created from the default branch if missing);
            default: the default branch.
        private: create the repo private.
        token: a token with write access; ``None`` uses ``HF_TOKEN`` or the saved login.
        commit_message: default ``"Upload <model> with zoo"``.
        license: the licence id for the card's metadata (default ``"other"``: zoo cannot
            know the weights' licence).
        max_shard_size: publish the weights split into shards of at most this size, as
            :func:`zoo.save` splits them (bytes, or ``"5GB"``, ``"500MB"``...); a directory
            is rewritten so first (its tensors unchanged). Default: a model as one
            ``model.safetensors``, a directory as it is.

    Returns:
        the :class:`CommitRef` (repo, branch, commit sha, URL).

    Raises:
        zoo.HubAuthError: no token, or it cannot write to the repo.
        zoo.HubUnavailableError: the Hub cannot be reached.
        zoo.CheckpointError: the directory is not a zoo checkpoint.
    """
    if revision is not None and _COMMIT_SHA.match(revision):
        raise HubError(f"revision {revision!r} is a commit sha; push to a branch name instead")
    if max_shard_size is not None:
        parse_max_shard_size(max_shard_size)  # refused before anything is written or sent
    target = _Target(repo_id, revision, private, token)
    if isinstance(model_or_directory, (str, os.PathLike)):
        adapter = adapter_folder(Path(os.path.expanduser(os.fspath(model_or_directory))))
        if adapter is not None:
            return _commit(target, *_adapter_commit(adapter, commit_message, license))
    with tempfile.TemporaryDirectory(prefix="zoo-push-") as staging:
        written = Path(staging) / "checkpoint"
        if isinstance(model_or_directory, (str, os.PathLike)):
            # a training run's folder stands for its model, as in zoo.load and zoo generate
            directory = model_folder(Path(os.path.expanduser(os.fspath(model_or_directory))))
            if max_shard_size is not None:
                _read_checkpoint(directory, repo_id)  # the same checks and messages as without
                directory = reshard(directory, written, max_shard_size=max_shard_size)
        else:
            directory = save(model_or_directory, written, max_shard_size=max_shard_size)
        manifest, files = _read_checkpoint(directory, repo_id)
        made = _checkpoint_commit(directory, files, manifest, commit_message, license)
        return _commit(target, *made)


def _adapter_commit(
    directory: Path, commit_message: str | None, license: str
) -> tuple[Callable[[str], list], str]:
    """What publishing the adapter in ``directory`` commits (its two files, as peft reads
    them, and a card naming its base) and the commit message."""
    from huggingface_hub import CommitOperationAdd

    facts = describe_adapter(directory)  # both files present, their headers readable
    outside = [f for f in ADAPTER_FILES if not inside(directory / f, directory)]
    if outside:
        raise UnsafeCheckpointError(
            f"{directory}: {', '.join(outside)} lead(s) outside the adapter folder (a link); "
            "refusing to publish files from elsewhere"
        )

    def operations(repo: str) -> list:
        card = adapter_card(facts.config, facts.base, repo, license=license)
        added = [CommitOperationAdd(f, str(directory / f)) for f in ADAPTER_FILES]
        return [*added, CommitOperationAdd(CARD_FILE, card.encode("utf-8"))]

    base = facts.base.get("name") or facts.base.get("repo") or "its base"
    return operations, commit_message or f"Upload a LoRA adapter for {base} with zoo"


def _checkpoint_commit(
    directory: Path, files: list[str], manifest: Manifest, commit_message: str | None, license: str
) -> tuple[Callable[[str], list], str]:
    """What publishing the checkpoint in ``directory`` commits (``files`` and its card) and
    the commit message."""

    def operations(repo: str) -> list:
        card = model_card(manifest, repo, license=license)
        return _operations(directory, files, card, manifest)

    name = manifest.model_name or manifest.architecture
    return operations, commit_message or f"Upload {name} with zoo"


@dataclasses.dataclass(frozen=True)
class _Target:
    """Where a push commits: the repo, the branch (``None``: the default), whether a new repo
    is private, and the token."""

    repo_id: str
    revision: str | None
    private: bool
    token: str | bool | None


def _commit(target: _Target, operations: Callable[[str], list], message: str) -> CommitRef:
    """Create the repo if needed (and the branch), then commit ``operations(repo id)`` in
    one commit: the files appear together or not at all."""
    from huggingface_hub import HfApi

    api = HfApi(token=target.token)
    revision = target.revision
    where = f"push to {target.repo_id}" + (f"@{revision}" if revision else "")
    with hub_errors(where, push=True):
        repo_id = api.create_repo(target.repo_id, private=target.private, exist_ok=True).repo_id
        made = operations(repo_id)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.create_commit(repo_id, made, commit_message=message, revision=revision)
    return CommitRef(
        repo_id=repo_id, revision=revision or "main", sha=info.oid, url=str(info.commit_url)
    )
