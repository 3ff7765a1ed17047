"""Writing a zoo checkpoint folder again with its weights split another way (one file, or
shards of at most ``max_shard_size``), without building the model: what ``zoo push DIR REPO
--max-shard-size 5GB`` publishes.

The tensors are copied as they are stored (same names, dtypes and bytes, in the order the
files list them), ``config.json`` keeps every field but the weights entry, and the tokenizer
files are copied. The source is verified first against the sha256 its ``config.json``
records: a corrupted checkpoint is never rewritten under fresh hashes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CheckpointError, ChecksumMismatchError
from .commit import atomic_directory, pinned_version
from .files import read_safetensors, sha256_file
from .manifest import CONFIG_FILE, FORMAT, Manifest, read_config_json, weights_record
from .shards import (
    check_recorded_shards,
    is_index,
    parse_max_shard_size,
    read_index,
    read_shards,
    write_weights,
)

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["reshard"]


def reshard(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    max_shard_size: int | str | None,
) -> Path:
    """Write the :func:`zoo.save` folder ``source`` into ``destination`` (atomically) with
    its weights in one ``model.safetensors`` (``max_shard_size=None``) or split as
    :func:`zoo.save` splits them.

    Raises:
        CheckpointError: ``source`` is not a zoo checkpoint, or a file it names is missing.
        ChecksumMismatchError: a weights file does not have the sha256 ``config.json``
            records.
    """
    if max_shard_size is not None:
        parse_max_shard_size(max_shard_size)
    source = Path(source)
    with pinned_version(source) as version:
        data = read_config_json(version)
        if data is None or data.get("format") != FORMAT:
            raise CheckpointError(
                f'{source} is not a zoo checkpoint (no config.json with "format": "zoo"); '
                "only folders written by zoo.save can be resharded"
            )
        manifest = Manifest.from_json(data, where=str(source / CONFIG_FILE))
        tensors, metadata = _verified_tensors(version, manifest, shown=source)
        where = str(source / CONFIG_FILE)
        tokenizer_files = [_plain(f, where) for f in (manifest.tokenizer or {}).get("files") or ()]
        with atomic_directory(destination) as staging:
            written = write_weights(
                tensors,
                staging,
                metadata,
                max_shard_size=max_shard_size,
                total_parameters=manifest.parameters,
            )
            for name in tokenizer_files:
                shutil.copyfile(version / name, staging / name)
            fields = weights_record(staging, written)
            rewritten = dataclasses.replace(manifest, **fields)
            text = json.dumps(rewritten.to_json(), indent=2) + "\n"
            (staging / CONFIG_FILE).write_text(text, encoding="utf-8")
    return Path(destination)


def _plain(name: object, where: str) -> str:
    """``name`` if it is a plain file name (a file of the folder itself)."""
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise CheckpointError(f"{where}: the tokenizer file {name!r} is not a plain file name")
    return name


def _verified_tensors(
    folder: Path, manifest: Manifest, *, shown: Path
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors of the checkpoint in ``folder`` (memory-mapped) and the safetensors
    metadata of its (first) weights file, once every file recorded with a sha256 has it."""
    weights = folder / manifest.weights_file
    expected = {weights: manifest.sha256}
    index = read_index(weights, shown=shown) if is_index(weights) else None
    if index is not None:
        check_recorded_shards(
            index.shards,
            manifest.shards,
            where=str(shown / weights.name),
            recorded_by=CONFIG_FILE,
            hint="the index is not the one saved",
        )
        recorded = manifest.shards or {}
        expected.update({folder / name: recorded.get(name) for name in index.shards})
    for path, sha in expected.items():
        actual = sha256_file(path) if sha is not None and path.is_file() else sha
        if actual != sha:
            raise ChecksumMismatchError(
                f"{shown / path.name} does not have the sha256 {sha} that config.json records: "
                "refusing to rewrite a corrupted or modified checkpoint. Save the model again "
                "with zoo.save().",
                path=shown / path.name,
                expected=sha,
                actual=actual,
            )
    if index is not None:
        tensors = read_shards(index, shown=shown)
        _, metadata = read_safetensors(folder / index.shards[0])
        return tensors, metadata
    return read_safetensors(weights)
