"""``config.json``: what a checkpoint directory holds, and how to tell zoo's from Hugging Face's.

A zoo checkpoint's ``config.json`` (format version 1)::

    {"format": "zoo", "format_version": 1, "zoo_version": "0.1.0",
     "architecture": "gpt2", "model_name": "gpt2-124m",
     "config": {...the config's to_dict()...},
     "tokenizer": {"name": "gpt2-bpe"},
     "weights": {"file": "model.safetensors", "sha256": "...", "dtype": "float32",
                 "parameters": 124439808},
     "plugin": {"name": "gpt2", "distribution": "zoo"}}

A sharded save (``zoo.save(model, dir, max_shard_size=...)``) is format version 2: ``file`` is
the index, ``sha256`` the index's, and ``shards`` maps each shard file to its sha256::

     "weights": {"file": "model.safetensors.index.json", "sha256": "...",
                 "shards": {"model-00001-of-00002.safetensors": "...", ...}, ...}

(an older zoo then says to upgrade, rather than failing to read the index as weights).
``tokenizer`` is whatever :func:`zoo.tokenizers.save_tokenizer` returned (or ``null``);
``plugin`` records who supplied the architecture so that a reader without it can be told what
to install. A Hugging Face checkpoint's ``config.json`` has a ``model_type`` instead.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import jsonfile
from ..errors import CheckpointError
from .files import sha256_file
from .shards import WrittenWeights, check_shard_name, is_index

__all__ = [
    "CONFIG_FILE",
    "FORMAT",
    "FORMAT_VERSION",
    "SHARDED_FORMAT_VERSION",
    "Manifest",
    "plugin_distribution",
    "read_config_json",
    "weights_record",
]

CONFIG_FILE = "config.json"
FORMAT = "zoo"
#: The format version of a single-file checkpoint.
FORMAT_VERSION = 1
#: The format version of a sharded one (``weights.shards``); the newest this zoo reads.
SHARDED_FORMAT_VERSION = 2

_REQUIRED = ("format_version", "architecture", "config", "weights")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A parsed zoo ``config.json``; ``shards`` (shard file -> sha256) when the weights are
    sharded, ``weights_file`` then being the index."""

    architecture: str
    config: Mapping[str, Any]
    weights_file: str
    sha256: str | None
    model_name: str | None = None
    tokenizer: Mapping[str, Any] | None = None
    dtype: str | None = None
    parameters: int | None = None
    plugin: Mapping[str, Any] | None = None
    zoo_version: str | None = None
    format_version: int = FORMAT_VERSION
    shards: Mapping[str, str | None] | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``config.json`` document."""
        weights: dict[str, Any] = {"file": self.weights_file, "sha256": self.sha256}
        if self.shards is not None:
            weights["shards"] = dict(self.shards)
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            "zoo_version": self.zoo_version,
            "architecture": self.architecture,
            "model_name": self.model_name,
            "config": dict(self.config),
            "tokenizer": dict(self.tokenizer) if self.tokenizer is not None else None,
            "weights": {**weights, "dtype": self.dtype, "parameters": self.parameters},
            "plugin": dict(self.plugin) if self.plugin is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str) -> Manifest:
        """Validate a zoo ``config.json`` document; ``where`` names it in errors."""
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise CheckpointError(
                f"{where} is missing required field(s) {', '.join(missing)}; a zoo checkpoint "
                f"needs {', '.join(_REQUIRED)}. Save it again with zoo.save()."
            )
        version = _format_version(data["format_version"], where)
        arch, config, weights = data["architecture"], data["config"], data["weights"]
        if not isinstance(arch, str) or not arch:
            raise CheckpointError(f"{where}: 'architecture' must be a name, got {arch!r}")
        if not isinstance(config, Mapping):
            raise CheckpointError(f"{where}: 'config' must be an object of config fields")
        file, sha = _weights_entry(weights, where)
        shards = _shards_entry(weights.get("shards"), file, where)
        tokenizer = data.get("tokenizer")
        if tokenizer is not None and not isinstance(tokenizer, Mapping):
            raise CheckpointError(f"{where}: 'tokenizer' must be an object or null")
        return cls(
            architecture=arch,
            config=dict(config),
            weights_file=file,
            sha256=sha,
            model_name=data.get("model_name"),
            tokenizer=tokenizer,
            dtype=weights.get("dtype"),
            parameters=weights.get("parameters"),
            plugin=data.get("plugin"),
            zoo_version=data.get("zoo_version"),
            format_version=version,
            shards=shards,
        )


def _format_version(version: Any, where: str) -> int:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(f"{where}: format_version {version!r} is not valid")
    if version > SHARDED_FORMAT_VERSION:
        raise CheckpointError(
            f"{where} has format_version {version}, newer than this zoo reads "
            f"({SHARDED_FORMAT_VERSION}); upgrade zoo (pip install -U torch-zoo)."
        )
    return version


def _weights_entry(weights: Any, where: str) -> tuple[str, str | None]:
    """The weights file name (a plain name) and its sha256 (64 hex digits, or ``None``)."""
    if not isinstance(weights, Mapping) or not isinstance(weights.get("file"), str):
        raise CheckpointError(
            f"{where}: 'weights' must be an object with at least 'file' (the safetensors file name)"
        )
    file = weights["file"]
    if Path(file).name != file or file in ("", ".", ".."):
        raise CheckpointError(f"{where}: weights file {file!r} must be a plain file name")
    sha = weights.get("sha256")
    if sha is not None and not _is_sha256(sha):
        raise CheckpointError(f"{where}: weights sha256 {sha!r} is not a hex sha256")
    return file, sha


def _is_sha256(value: Any) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


def _shards_entry(shards: Any, file: str, where: str) -> dict[str, str | None] | None:
    """``weights.shards``: shard file name -> its sha256 (or ``None``); only beside an index."""
    if shards is None:
        return None
    if not isinstance(shards, Mapping) or not shards or not is_index(file):
        raise CheckpointError(
            f"{where}: 'weights.shards' must map shard file names to their sha256, beside a "
            f"'file' that is the index (*.safetensors.index.json), not {file!r}"
        )
    for name, sha in shards.items():
        check_shard_name(name, where)
        if sha is not None and not _is_sha256(sha):
            raise CheckpointError(f"{where}: the sha256 of shard {name} ({sha!r}) is not hex")
    return dict(shards)


#: The largest config.json read (real ones are a few KB).
MAX_CONFIG_BYTES = 4 << 20


def read_config_json(directory: Path) -> dict[str, Any] | None:
    """The parsed ``config.json`` in ``directory``, or ``None`` when there is none."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(
            f"{path} is {path.stat().st_size:,} bytes; a config.json is a few KB (at most "
            f"{MAX_CONFIG_BYTES:,} read): this is not a checkpoint config",
            path=path,
        )
    try:
        data = jsonfile.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # undecodable, not JSON, an integer of 5,000 digits
        raise CheckpointError(f"{path} is not valid JSON: {exc}", path=path) from None
    except RecursionError:
        raise CheckpointError(f"{path} is nested too deeply to be a config", path=path) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object", path=path)
    return data


#: A distribution name as the package index accepts it (PEP 508).
_DISTRIBUTION_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?")


def config_format(data: Mapping[str, Any], *, where: str) -> str:
    """What a ``config.json`` describes: ``"zoo"`` (``"format": "zoo"``, a :class:`Manifest`)
    or ``"hf"`` (a Hugging Face config with a ``model_type``). The one place checkpoint
    formats are told apart (:func:`zoo.load` and the Hub download both ask it).

    Raises:
        CheckpointError: it is neither, so nothing says which model the weights belong to.
    """
    if data.get("format") == FORMAT:
        return "zoo"
    if "model_type" in data:
        return "hf"
    raise CheckpointError(
        f'{where} is neither a zoo config ("format": "zoo") nor a Hugging Face config '
        '("model_type"); it cannot say which model the weights belong to'
    )


def plugin_distribution(plugin: Mapping[str, Any] | None) -> str | None:
    """The distribution name of the plugin a manifest records (``"zoo-llama 0.3"`` ->
    ``"zoo-llama"``), or ``None`` when there is none or it is not a valid distribution name:
    a checkpoint is untrusted input, and only a valid name is ever suggested to ``pip``."""
    recorded = (plugin or {}).get("distribution")
    name = recorded.split(" ")[0] if isinstance(recorded, str) else ""
    return name if _DISTRIBUTION_NAME.fullmatch(name) else None


def weights_record(folder: Path, written: WrittenWeights) -> dict[str, Any]:
    """The :class:`Manifest` fields for the weights :func:`~zoo.checkpoint.shards.
    write_weights` wrote into ``folder``: the file and its sha256, each shard's sha256 when
    sharded, and the format version that goes with them."""
    sharded = bool(written.shards)
    return {
        "weights_file": written.file,
        "sha256": sha256_file(folder / written.file),
        "shards": {n: sha256_file(folder / n) for n in written.shards} if sharded else None,
        "format_version": SHARDED_FORMAT_VERSION if sharded else FORMAT_VERSION,
    }
