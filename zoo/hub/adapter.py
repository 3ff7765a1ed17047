"""Fetching a LoRA adapter from the Hub: ``adapter_config.json`` and
``adapter_model.safetensors`` as peft writes them (and the ``README.md`` card when the repo has
one), pinned to one commit and checked as weights are (:mod:`zoo.hub.download`): the revision
is resolved once, every file is fetched at that commit through :mod:`zoo.hub.transfer` (no
server answer chooses a path; every file but the weights is capped), the small files are
checked against the Hub's git blob ids and the weights against its LFS sha256. Nothing else
is fetched: no pickles (``adapter_model.bin``), no code. A named adapter (a registry entry,
:class:`~zoo.plugin.specs.AdapterSpec`) is its pinned repo, its weights held to the sha256 the
registry pins as well.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import jsonfile
from ..checkpoint.adapter_record import BaseRecord
from ..checkpoint.formats import check_format
from ..checkpoint.manifest import CONFIG_FILE
from ..checkpoint.readers import model_folder
from ..errors import CheckpointError, HubNotFoundError, UnsafeCheckpointError
from .download import (
    ADAPTER_CONFIG,
    Pinned,
    _expected_sha256,
    _verify_small,
    _verify_weights,
    pin,
)
from .source import HubSource
from .transfer import cached

if TYPE_CHECKING:
    from ..plugin.specs import AdapterSpec

__all__ = [
    "ADAPTER_FILES",
    "ADAPTER_WEIGHTS",
    "AdapterFacts",
    "AdapterSnapshot",
    "adapter_folder",
    "describe_adapter",
    "fetch_adapter",
    "fetch_named_adapter",
    "is_adapter",
]

#: The adapter's weights, as peft writes them.
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: What an adapter repo must hold.
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
#: Fetched too when the repo has them: the model card (it names the base).
_OPTIONAL = ("README.md",)


@dataclasses.dataclass(frozen=True)
class AdapterSnapshot:
    """An adapter fetched into the Hugging Face cache.

    Attributes:
        source: what was asked for.
        commit: the commit every file was fetched at.
        directory: ``<HF_HUB_CACHE>/models--org--name/snapshots/<commit>``, the adapter
            folder.
        sha256: the weights' sha256 as the Hub's LFS metadata gives it (``None`` offline).
    """

    source: HubSource
    commit: str
    directory: Path
    sha256: str | None


def adapter_folder(path: Path) -> Path | None:
    """The LoRA adapter folder ``path`` stands for: itself when it holds
    ``adapter_config.json``, a LoRA run's ``adapter/`` when the run saved no model, else
    ``None``."""
    if (path / ADAPTER_CONFIG).is_file():
        return path
    if path.is_dir() and not (model_folder(path) / CONFIG_FILE).is_file():
        inner = path / "adapter"
        return inner if (inner / ADAPTER_CONFIG).is_file() else None
    return None


def is_adapter(pinned: Pinned, source: HubSource) -> bool:
    """Whether the pinned repo holds an adapter and no model (``config.json``): from its file
    list online, from what an earlier pull cached offline."""
    if pinned.entries is not None:
        return ADAPTER_CONFIG in pinned.entries and CONFIG_FILE not in pinned.entries
    return (
        cached(source.repo_id, ADAPTER_CONFIG, pinned.commit) is not None
        and cached(source.repo_id, CONFIG_FILE, pinned.commit) is None
    )


def _check_files(pinned: Pinned) -> None:
    """An adapter repo has both files; a pickled adapter (``adapter_model.bin``) is named."""
    entries = pinned.entries
    if entries is None:
        return
    missing = [name for name in ADAPTER_FILES if name not in entries]
    if not missing:
        return
    if ADAPTER_WEIGHTS in missing and "adapter_model.bin" in entries:
        raise UnsafeCheckpointError(
            f"{pinned.what}: the adapter's weights are adapter_model.bin, a pickle, which zoo "
            "never unpickles (it can run code); save them as adapter_model.safetensors once, "
            "from a source you trust (peft's save_pretrained does). Nothing was downloaded."
        )
    raise HubNotFoundError(
        f"{pinned.what}: the repo has no {', '.join(missing)}, so it holds no LoRA adapter "
        f"as peft writes one (it has: {', '.join(sorted(entries)) or 'nothing'})"
    )


def fetch_adapter(
    source: HubSource, *, token: str | bool | None = None, pinned: Pinned | None = None
) -> AdapterSnapshot:
    """Fetch the adapter ``source`` names into the Hugging Face cache (see the module
    docstring); a file that does not match the Hub's metadata is deleted from the cache and
    nothing is returned.

    Args:
        source: the adapter repo (``hf:org/name[@revision]``).
        token: Hub token; ``None`` uses ``HF_TOKEN`` or the saved login.
        pinned: ``source`` already resolved by :func:`~zoo.hub.download.pin`.

    Raises:
        zoo.HubNotFoundError: no such repo or revision, or the repo holds no adapter.
        zoo.UnsafeCheckpointError: pickled weights, or a server answer that would write
            outside the cache or a small file over ``ZOO_HUB_MAX_FILE_BYTES``.
        zoo.ChecksumMismatchError: a download does not match the Hub's metadata.
    """
    pinned = pinned or pin(source, token=token)
    _check_files(pinned)
    entries = pinned.entries or {}
    config = pinned.download(ADAPTER_CONFIG)
    _verify_small(config, entries.get(ADAPTER_CONFIG), pinned.what)
    for name in _OPTIONAL:
        if name in entries or (
            pinned.entries is None and cached(source.repo_id, name, pinned.commit)
        ):
            _verify_small(pinned.download(name), entries.get(name), pinned.what)
    weights = pinned.download(ADAPTER_WEIGHTS, large=True)
    entry = entries.get(ADAPTER_WEIGHTS)
    lfs_sha = getattr(getattr(entry, "lfs", None), "sha256", None)
    if lfs_sha:
        _verify_weights(weights, str(lfs_sha).lower(), "the Hub's LFS metadata", True, pinned.what)
    else:  # a small adapter stored in git: its blob id
        _verify_small(weights, entry, pinned.what)
    return AdapterSnapshot(source, pinned.commit, config.parent, lfs_sha and str(lfs_sha).lower())


def fetch_named_adapter(spec: AdapterSpec, *, token: str | bool | None = None) -> AdapterSnapshot:
    """Fetch the named adapter ``spec`` (:func:`fetch_adapter` of its repo at its revision);
    its weights must have the sha256 the registry pins: a pin the Hub's LFS metadata
    contradicts is refused before any download, a downloaded file that differs is deleted
    from the cache and refused.

    Raises:
        zoo.ChecksumMismatchError: the weights are not the ones the registry pins.
    """
    source = HubSource(spec.repo, spec.revision, filename=ADAPTER_WEIGHTS, sha256=spec.sha256)
    what = f"adapter {spec.name!r} ({source})"
    pinned = pin(source, token=token)
    entry = (pinned.entries or {}).get(ADAPTER_WEIGHTS)
    lfs = getattr(getattr(entry, "lfs", None), "sha256", None)
    says = f"the registry's pin for {spec.name}"
    _expected_sha256(  # the pin and the Hub disagree: refused before any download
        {says: spec.sha256, "the Hub's LFS metadata": lfs}, what, ADAPTER_WEIGHTS
    )
    snapshot = fetch_adapter(source, token=token, pinned=pinned)
    if spec.sha256 is not None:
        _verify_weights(snapshot.directory / ADAPTER_WEIGHTS, spec.sha256.lower(), says, True, what)
    return snapshot


#: The largest safetensors header read to describe an adapter.
_MAX_HEADER = 64 << 20


@dataclasses.dataclass(frozen=True)
class AdapterFacts:
    """What an adapter folder says of itself, read without torch: peft's ``config``
    (``adapter_config.json``), zoo's ``base`` record (``{}`` for an adapter peft wrote), the
    number of ``parameters`` and the ``files`` with their sizes in bytes."""

    directory: Path
    config: Mapping[str, Any]
    base: Mapping[str, Any]
    parameters: int
    files: Mapping[str, int]


def _json_object(text: str | bytes, where: str) -> dict[str, Any]:
    try:
        data = jsonfile.loads(text)
    except ValueError as exc:  # not JSON, not UTF-8, nested too deep
        raise CheckpointError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{where} holds {type(data).__name__}, not a JSON object")
    return data


def _header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if not 0 < size <= min(_MAX_HEADER, path.stat().st_size - 8):
            check_format(path)  # a file of another format says what it is
            raise CheckpointError(f"{path} is not a valid safetensors file (header size {size})")
        return _json_object(f.read(size), str(path))


def _count(header: Mapping[str, Any], where: str) -> int:
    total = 0
    for key, entry in header.items():
        shape = entry.get("shape") if isinstance(entry, dict) and key != "__metadata__" else []
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise CheckpointError(f"{where}: tensor {key[:80]!r} has no valid shape")
        total += math.prod(shape) if key != "__metadata__" else 0
    return total


def describe_adapter(directory: Path) -> AdapterFacts:
    """The :class:`AdapterFacts` of the adapter in ``directory`` (no tensor is read)."""
    from .download import ADAPTER_CONFIG

    config_path, weights = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
    for path in (config_path, weights):
        if not path.is_file():
            raise CheckpointError(f"{directory} has no {path.name}: it is no adapter folder")
    config = _json_object(config_path.read_bytes(), str(config_path))
    header = _header(weights)
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{weights}: its header's __metadata__ is not a JSON object")
    record = BaseRecord.from_metadata(metadata, where=str(weights))
    base = {k: v for k, v in dataclasses.asdict(record).items() if v} if record else {}
    files = {
        p.name: p.stat().st_size
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS, *_OPTIONAL)
    }
    return AdapterFacts(directory, config, base, _count(header, str(weights)), files)
