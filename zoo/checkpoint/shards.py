"""Sharded safetensors checkpoints: ``model.safetensors.index.json`` and its shards.

The index, as transformers writes it (``save_pretrained(max_shard_size=...)``) and zoo too::

    {"metadata": {"total_parameters": 1234, "total_size": 4936},
     "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors", ...}}

An index is untrusted input, read under these rules (:func:`read_index`, :func:`read_shards`):
every shard is a plain ``.safetensors`` file name in the index's own folder (no folder, no
``..``, no absolute path: transformers writes none); every key of ``weight_map`` is found in
the shard it names and every tensor of the shards is in ``weight_map``, under its own shard; a
key in two shards, or twice in the JSON, is refused; missing shard files are named together.
Every shard is memory-mapped, as a single weights file is.

Writing splits with ``huggingface_hub.split_torch_state_dict_into_shards`` (what
transformers' ``save_pretrained`` calls): tensors in state-dict order, a new shard when the
next tensor would pass ``max_shard_size``, a tensor larger than that alone in its own shard,
files named ``model-00001-of-00003.safetensors``. When everything fits in one shard it is the
single ``model.safetensors`` and no index is written, as transformers does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import jsonfile
from ..errors import CheckpointError, UnsafeCheckpointError
from .files import WEIGHTS_FILE, read_safetensors, write_safetensors

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "INDEX_FILE",
    "INDEX_SUFFIX",
    "ShardIndex",
    "WrittenWeights",
    "check_recorded_shards",
    "check_shard_name",
    "index_file",
    "is_index",
    "parse_max_shard_size",
    "read_index",
    "read_shards",
    "write_weights",
]

#: What transformers appends to the weights file name to name the index.
INDEX_SUFFIX = ".index.json"
#: The index of a sharded ``model.safetensors``.
INDEX_FILE = WEIGHTS_FILE + INDEX_SUFFIX
#: Shard names: ``model{suffix}.safetensors`` with suffix ``-00001-of-00003``.
SHARD_PATTERN = "model{suffix}.safetensors"
#: The largest index read (a 400-layer model's is well under 1 MB).
MAX_INDEX_BYTES = 32 << 20

_SHOW = 5  # names shown in messages


def index_file(weights: Path) -> Path:
    """The index that stands for ``weights`` when it is sharded:
    ``model.safetensors`` -> ``model.safetensors.index.json``."""
    return weights.with_name(weights.name + INDEX_SUFFIX)


def is_index(path: Path | str) -> bool:
    """Whether ``path`` names a safetensors index (``*.safetensors.index.json``)."""
    return Path(path).name.endswith(".safetensors" + INDEX_SUFFIX)


def _listed(names: Sequence[str]) -> str:
    more = f" and {len(names) - _SHOW} more" if len(names) > _SHOW else ""
    return ", ".join(repr(n) for n in names[:_SHOW]) + more


def check_shard_name(name: Any, where: str) -> str:
    """``name`` if it is a plain ``.safetensors`` file name: no folder, no ``..``, no absolute
    path, no hidden file, no control character. A shard is always read from the index's own
    folder, so an index cannot reach any other file."""
    plain = (
        isinstance(name, str)
        and 0 < len(name) <= 255
        and Path(name).name == name
        and "/" not in name
        and "\\" not in name
        and not name.startswith(".")
        and name.isprintable()
        and name.endswith(".safetensors")
    )
    if not plain:
        raise UnsafeCheckpointError(
            f"{where}: the shard {str(name)[:80]!r} is not a plain .safetensors file name in the "
            "index's folder (no folder, no '..', no absolute path); refusing the checkpoint"
        )
    return name


@dataclasses.dataclass(frozen=True)
class ShardIndex:
    """A validated ``*.safetensors.index.json``.

    Attributes:
        path: the index file; its shards are in the same folder.
        weight_map: tensor name -> shard file name (a plain name).
        metadata: the index's ``metadata`` object (``total_size``, ``total_parameters``).
    """

    path: Path
    weight_map: Mapping[str, str]
    metadata: Mapping[str, Any]

    @property
    def shards(self) -> tuple[str, ...]:
        """The shard file names, sorted (``model-00001-of-...`` first)."""
        return tuple(sorted(set(self.weight_map.values())))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} appears twice")
        seen[key] = value
    return seen


def read_index(path: Path, *, shown: Path | None = None) -> ShardIndex:
    """Read and validate the index ``path``; ``shown`` is its folder as messages name it.

    Raises:
        CheckpointError: not JSON, too large, no ``weight_map`` object of names to names, or
            a key twice; :class:`UnsafeCheckpointError` for a shard that is not a plain name.
    """
    where = str((shown or path.parent) / path.name)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CheckpointError(f"cannot read the sharded checkpoint index {where}: {exc}") from None
    if size > MAX_INDEX_BYTES:
        raise CheckpointError(
            f"{where} is {size:,} bytes; a sharded checkpoint index is at most "
            f"{MAX_INDEX_BYTES:,}: this is not one"
        )
    try:
        data = jsonfile.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicates)
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"the sharded checkpoint index {where} is not valid: {exc}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(
            f"the sharded checkpoint index {where} has no 'weight_map' object (tensor name -> "
            "shard file); it is damaged or not a safetensors index"
        )
    for key, shard in weight_map.items():
        if not key:
            raise CheckpointError(f"{where}: the weight_map has an empty tensor name")
        check_shard_name(shard, f"{where} (tensor {key[:80]!r})")
    metadata = data.get("metadata")
    return ShardIndex(path, weight_map, metadata if isinstance(metadata, dict) else {})


def check_recorded_shards(
    shards: Sequence[str],
    recorded: Mapping[str, Any] | None,
    *,
    where: str,
    recorded_by: str,
    hint: str,
) -> None:
    """Raise :class:`CheckpointError` unless the ``shards`` the index ``where`` names are the
    ones ``recorded_by`` records (``recorded``: shard -> sha256; ``None`` records nothing to
    compare); ``hint`` ends the message with what to do."""
    if recorded is not None and set(recorded) != set(shards):
        raise CheckpointError(
            f"{where} names the shards {sorted(shards)}, but {recorded_by} records "
            f"{sorted(recorded)}: {hint}"
        )


def read_shards(index: ShardIndex, *, shown: Path | None = None) -> dict[str, Tensor]:
    """Memory-map every shard of ``index`` and return their tensors, once the shards are
    checked against the index (see the module docstring).

    Raises:
        CheckpointError: a shard file is missing, a tensor is in two shards, is not in the
            weight_map or is in another shard than it says, or a weight_map key is in no
            shard; :class:`CorruptCheckpointError` for a damaged shard.
    """
    folder = index.path.parent
    where = str((shown or folder) / index.path.name)
    missing = [s for s in index.shards if not (folder / s).is_file()]
    if missing:
        raise CheckpointError(
            f"{where} names {len(missing)} shard(s) that {shown or folder} lacks: "
            f"{_listed(missing)}. The checkpoint is incomplete; copy or download it again."
        )
    tensors: dict[str, Tensor] = {}
    found_in: dict[str, list[str]] = {}
    for shard in index.shards:
        found, _ = read_safetensors(folder / shard)
        for key, tensor in found.items():
            found_in.setdefault(key, []).append(shard)
            tensors.setdefault(key, tensor)
    _check_placement(index, found_in, where)
    return tensors


def _check_placement(index: ShardIndex, found_in: Mapping[str, list[str]], where: str) -> None:
    """Raise :class:`CheckpointError` unless every tensor is in one shard (``found_in``: the
    shards that hold it), the one the index's weight_map names, and every key of the map is
    in a shard."""
    twice = [(key, shards) for key, shards in found_in.items() if len(shards) > 1]
    if twice:
        key, shards = twice[0]
        raise CheckpointError(
            f"{where}: {len(twice)} tensor(s) are in more than one shard, e.g. {key!r} in "
            f"{', '.join(shards)}; refusing the checkpoint (which one is meant?)"
        )
    for key, (shard,) in found_in.items():
        mapped = index.weight_map.get(key)
        if mapped != shard:
            said = "does not list it" if mapped is None else f"puts it in {mapped}"
            raise CheckpointError(
                f"{where}: the shard {shard} holds the tensor {key!r}, but the index's "
                f"weight_map {said}; refusing the checkpoint"
            )
    absent = [key for key in index.weight_map if key not in found_in]
    if absent:
        raise CheckpointError(
            f"{where}: {len(absent)} tensor(s) of the weight_map are not in the shard it names: "
            + "; ".join(f"{k!r} (in {index.weight_map[k]})" for k in absent[:_SHOW])
            + ("; ..." if len(absent) > _SHOW else "")
        )


# -- writing --------------------------------------------------------------------------------
def parse_max_shard_size(value: int | str) -> int:
    """``max_shard_size`` in bytes: an int, or a string such as ``"5GB"`` / ``"500MB"``
    parsed as ``huggingface_hub`` (and so transformers) parses it (KB, MB, GB, TB: powers of
    1000).

    Raises:
        ValueError: not a positive size.
    """
    from huggingface_hub.serialization._base import parse_size_to_int

    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(
            f"max_shard_size must be a number of bytes or a string such as '5GB', got {value!r}"
        )
    size = parse_size_to_int(value) if isinstance(value, str) else value
    if size < 1:
        raise ValueError(f"max_shard_size must be at least 1 byte, got {value!r}")
    return size


@dataclasses.dataclass(frozen=True)
class WrittenWeights:
    """What :func:`write_weights` wrote: ``file`` is ``model.safetensors``, or the index when
    the weights were split into ``shards`` (file names, in order)."""

    file: str
    shards: tuple[str, ...] = ()


def write_weights(
    tensors: Mapping[str, Tensor],
    folder: Path,
    metadata: Mapping[str, str],
    *,
    max_shard_size: int | str | None,
    total_parameters: int | None = None,
) -> WrittenWeights:
    """Write ``tensors`` (contiguous, on the CPU) into ``folder``: one ``model.safetensors``
    when ``max_shard_size`` is ``None`` or everything fits in one shard, else the shards and
    the index as transformers writes them (``metadata``: ``total_parameters`` when given,
    ``total_size``; ``weight_map``). Each file gets the safetensors ``metadata``."""
    if max_shard_size is None:
        write_safetensors(tensors, folder / WEIGHTS_FILE, metadata)
        return WrittenWeights(WEIGHTS_FILE)
    from huggingface_hub import split_torch_state_dict_into_shards

    split = split_torch_state_dict_into_shards(
        dict(tensors),
        filename_pattern=SHARD_PATTERN,
        max_shard_size=parse_max_shard_size(max_shard_size),
    )
    for name, keys in split.filename_to_tensors.items():
        write_safetensors({k: tensors[k] for k in keys}, folder / name, metadata)
    if not split.is_sharded:
        return WrittenWeights(WEIGHTS_FILE)
    counts = {} if total_parameters is None else {"total_parameters": total_parameters}
    index = {"metadata": {**counts, **split.metadata}, "weight_map": split.tensor_to_filename}
    text = json.dumps(index, indent=2, sort_keys=True) + "\n"
    (folder / INDEX_FILE).write_text(text, encoding="utf-8")
    return WrittenWeights(INDEX_FILE, tuple(split.filename_to_tensors))
