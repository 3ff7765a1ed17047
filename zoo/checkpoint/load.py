"""Loading a checkpoint that is on this machine: recognising it, reading its single or
sharded safetensors (memory-mapped, verified against the recorded sha256) and assembling the
model (:func:`load_local`); where a named model's weights are (:func:`local_weights_path`)."""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..devices import check_device, check_dtype
from ..errors import (
    CheckpointError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
)
from ..plugin.current import get_registry
from ..settings import VARIABLES, Settings
from .commit import clean_stale, pinned_version
from .files import (
    PICKLE_SUFFIXES,
    WEIGHTS_FILE,
    BackgroundHash,
    check_not_pickle,
    check_weights_file,
    read_safetensors,
    remember_verified,
    sha256_file,
    was_verified,
)
from .generation_file import read_generation_file
from .manifest import CONFIG_FILE, read_config_json
from .readers import Recognised, Request, existing_checkpoint, recognise
from .shards import check_recorded_shards, index_file, is_index, read_index, read_shards
from .tokenizer import checkpoint_tokenizer

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from ..nn.base import ZooModel
    from ..plugin.specs import ArchitectureSpec

__all__ = [
    "WEIGHTS_DIR_ENV",
    "assembled",
    "checked_target",
    "load_local",
    "local_weights_path",
    "quantized",
    "to_hash",
]


#: Environment variable naming a folder of checkpoints, one sub-folder per named model.
WEIGHTS_DIR_ENV = VARIABLES["weights_dir"][0]


#: ``weights.path = "package:zoo_plugins.shakespeare/weights"``: a folder inside a package.
PACKAGE_PREFIX = "package:"


def _package_path(path: str, name: str) -> Path:
    from importlib import resources

    package, _, folder = path.removeprefix(PACKAGE_PREFIX).partition("/")
    try:
        root = resources.files(package)
    except ModuleNotFoundError:
        raise CheckpointError(
            f"named model {name!r}: its weights are in the package {package!r}, which is not "
            "installed"
        ) from None
    return Path(str(root.joinpath(folder)))


def local_weights_path(name: str) -> Path | None:
    """Where the weights of the named model ``name`` are on this machine, or ``None``.

    Looks at the registry entry's ``weights.path`` (``~`` and ``$VARS`` expanded, or
    ``package:PACKAGE/FOLDER`` for weights shipped inside an installed package), then at
    ``$ZOO_WEIGHTS_DIR/<name>/``.
    """
    spec = get_registry().model(name)
    if spec.weights is not None and spec.weights.path:
        path = spec.weights.path
        if path.startswith(PACKAGE_PREFIX):
            return _package_path(path, name)
        return Path(os.path.expandvars(os.path.expanduser(path)))
    root = Settings.from_env().weights_dir
    if root:
        candidate = Path(root) / spec.name
        if candidate.exists():
            return candidate
    return None


def _missing_weights(directory: Path, filename: str) -> CheckpointError:
    present = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    pickles = [n for n in present if Path(n).suffix.lower() in PICKLE_SUFFIXES]
    if pickles:
        try:
            check_not_pickle(directory / pickles[0])
        except UnsafeCheckpointError as exc:
            return exc
    return CheckpointError(
        f"{directory} has no {filename} (it has: {', '.join(present) or 'nothing'})",
        path=directory / filename,
    )


def load_local(
    path: str | os.PathLike[str],
    *,
    layout: str = "auto",
    sha256: str | None = None,
    model_name: str | None = None,
    filename: str = WEIGHTS_FILE,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    strict: bool = True,
    verify: bool | None = None,
    tokenizer: bool = True,
    quantize: str | None = None,
    shard_sha256: Mapping[str, str | None] | None = None,
) -> ZooModel:
    """Load a checkpoint that is on this machine (what the Hub download calls after fetching).

    A sharded checkpoint (``model.safetensors.index.json`` and the shards it names, in place
    of ``model.safetensors``) loads the same way, every shard memory-mapped; see
    :mod:`zoo.checkpoint.shards` for how its index is checked.

    Args:
        path: a checkpoint directory, its safetensors file or its index.
        layout: ``"auto"`` reads it from ``config.json`` (``"format": "zoo"``, or a Hugging
            Face ``model_type``); otherwise ``"zoo"`` or a layout an architecture declares
            (``"hf-gpt2"``), used with the config of ``model_name`` when there is no
            ``config.json``.
        sha256: the pinned hash of the weights file (of the index, when sharded); it overrides
            the one in ``config.json``.
        model_name: the named model these weights belong to (sets ``model.name`` and the
            default tokenizer; gives the config when the directory has none).
        filename: the weights file in a directory.
        device, dtype, strict, verify, tokenizer, quantize: as for :func:`zoo.load`
            (``verify`` covers every shard).
        shard_sha256: the expected sha256 of each shard (the Hub's, for a download); it
            overrides the ones in ``config.json``.
    """
    target = checked_target(device, dtype, quantize)
    path = existing_checkpoint(Path(path))  # a training run's folder stands for its model
    folder = path.parent if path.is_file() else path
    clean_stale(folder)  # versions a killed zoo.save left behind (never one in progress)
    with pinned_version(folder) as version:
        # Every file comes from the one version resolved here, which a concurrent save may
        # replace but never removes while it is pinned: config.json of one save never pairs
        # with the weights of another.
        if version != folder and path.is_dir():
            path = version
        elif version != folder and (version / path.name).is_file():
            path = version / path.name  # (a file of the folder's own stays as it is)
        return _load_files(
            path,
            shown=folder,
            layout=layout, sha256=sha256, model_name=model_name, filename=filename,
            target=target, dtype=dtype, strict=strict, verify=verify,
            tokenizer=tokenizer, quantize=quantize, shard_sha256=shard_sha256,
        )  # fmt: skip


def _load_files(
    path: Path,
    *,
    shown: Path,
    layout: str,
    sha256: str | None,
    model_name: str | None,
    filename: str,
    target: torch.device,
    dtype: torch.dtype | None,
    strict: bool,
    verify: bool | None,
    tokenizer: bool,
    quantize: str | None,
    shard_sha256: Mapping[str, str | None] | None,
) -> ZooModel:
    """:func:`load_local`'s reading and assembling; messages name ``shown``, the folder the
    caller gave, rather than the version folder inside it that ``path`` may be."""
    found, directory = _recognise(path, shown, layout, model_name, filename)
    # checked before the weights are read; beside them, or in the folder given (zoo keeps a
    # saved model's own files in a version folder inside it)
    generation = read_generation_file(directory)
    if generation is None and shown != directory and shown.is_dir():
        generation = read_generation_file(shown)
    weights, arch, config = found.weights, found.architecture, found.config
    model_name = model_name or found.model_name
    tensors, hasher = _read_weights(found, shown, sha256, shard_sha256, verify)
    unexpected: tuple[str, ...] = ()
    if found.keymap is not None:
        settle = getattr(found.keymap, "config_from_weights", None)
        config = config if settle is None else settle(config, tensors)
        tensors, conversion = found.keymap.to_zoo(tensors, config)
        unexpected = conversion.unexpected
    try:
        model = assembled(
            arch, config, tensors,
            target=target, dtype=dtype, strict=strict, unexpected=unexpected,
            what=str(shown / weights.name), model_name=model_name, quantize=quantize,
        )  # fmt: skip
    finally:
        del tensors
        if hasher is not None:
            hasher.verify()
    if hasher is not None:  # the files were read in full just now: check the values too, once
        hasher.remember()
        if quantize is None:  # (quantization checks each weight as it reads it)
            _warn_non_finite(model, str(shown / weights.name))
    quantized(model, quantize, target=target, dtype=dtype)
    model.tokenizer, model.tokenizer_error = (
        checkpoint_tokenizer(found.tokenizer, directory, arch, config, model_name, shown=shown)
        if tokenizer
        else (None, "loaded with tokenizer=False")
    )
    model.generation_config = generation
    return model


def checked_target(
    device: str | torch.device | None, dtype: torch.dtype | None, quantize: str | None
) -> torch.device:
    """The device a load puts the weights on, once ``dtype`` and ``quantize`` are checked
    (refused before anything is read)."""
    from ..quant.layers import QUANTIZE_MODES

    check_dtype(dtype)
    if quantize is not None and quantize not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {quantize!r}")
    return check_device(device)


def assembled(
    arch: ArchitectureSpec,
    config: Any,
    tensors: Mapping[str, Tensor],
    *,
    target: torch.device,
    dtype: torch.dtype | None,
    strict: bool,
    unexpected: tuple[str, ...],
    what: str,
    model_name: str | None,
    quantize: str | None = None,
) -> Any:
    """The model ``arch`` builds from ``config`` with ``tensors`` (zoo keys) assigned, named
    ``model_name``, its :class:`LoadReport` in ``model.load_report`` (a :class:`ZooModel`,
    or whatever the plugin's class is). Weights to ``quantize`` keep a foreign layout's views:
    quantizing copies them one at a time."""
    import torch

    from .state import assemble

    with torch.no_grad():
        model, report = assemble(
            get_registry().model_factory(arch),
            config,
            tensors,
            device=target,
            dtype=dtype,
            strict=strict,
            unexpected=unexpected,
            what=what,
            contiguous=quantize is None,
        )
    if model_name is not None and hasattr(model, "name"):
        model.name = model_name
    model.load_report = report
    return model


def quantized(
    model: ZooModel, quantize: str | None, *, target: torch.device, dtype: torch.dtype | None
) -> None:
    """Quantize ``model`` in place by ``quantize`` (nothing for ``None``)."""
    if quantize is None:
        return
    import torch

    from ..quant.layers import quantize_

    with torch.no_grad():  # CPU weights still mapped from the file: give their pages back
        quantize_(model, quantize, release=target.type == "cpu" and dtype is None)


def _read_weights(
    found: Recognised,
    shown: Path,
    sha256: str | None,
    shard_sha256: Mapping[str, str | None] | None,
    verify: bool | None,
) -> tuple[dict[str, Tensor], BackgroundHash | None]:
    """The tensors of the checkpoint ``found`` (one file or every shard), memory-mapped, and
    their hashing, against the pinned ``sha256`` and ``shard_sha256`` where given, else what
    ``config.json`` records."""
    expected = sha256 or found.sha256
    what = "the pinned sha256" if sha256 else str(shown / CONFIG_FILE)
    if not is_index(found.weights):
        return _read_single(found.weights, expected, what, verify)
    recorded = found.shards if shard_sha256 is None else shard_sha256
    where = "the caller (shard_sha256)" if shard_sha256 is not None else what
    return _read_sharded(found.weights, shown, expected, what, recorded, where, verify)


def _read_single(
    weights: Path, expected: str | None, what: str, verify: bool | None
) -> tuple[dict[str, Tensor], BackgroundHash | None]:
    """The tensors of one weights file, memory-mapped, and its hashing when it is verified:
    always with ``verify=True`` (which needs a known hash), by default when not verified
    before."""
    if verify and expected is None:
        raise CheckpointError(
            f"verify=True but no sha256 is recorded or pinned for {weights}; pass sha256=...",
            path=weights,
        )
    hasher = None
    if expected and to_hash(weights, expected, verify):
        hasher = BackgroundHash({weights: expected}, what=what)
    try:
        tensors, _ = read_safetensors(weights)
    except CorruptCheckpointError:
        if hasher is not None:
            hasher.verify()  # a damaged file whose hash is known: say it does not match
        raise
    return tensors, hasher


def _read_sharded(
    index_path: Path,
    shown: Path,
    expected: str | None,
    what: str,
    recorded: Mapping[str, str | None] | None,
    recorded_by: str,
    verify: bool | None,
) -> tuple[dict[str, Tensor], BackgroundHash | None]:
    """The tensors of every shard of ``index_path``, memory-mapped, and their hashing.

    The index is hashed at once when its sha256 is known (``expected``: pinned or recorded;
    it is small); each shard in the background against ``recorded`` (shard -> sha256, from
    ``config.json`` or the Hub), when ``verify`` is true or the shard was not verified
    before. ``verify=True`` needs a sha256 for every shard."""
    if expected and to_hash(index_path, expected, verify):
        _verify_index(index_path, shown, expected, what)
    index = read_index(index_path, shown=shown)
    check_recorded_shards(
        index.shards,
        recorded,
        where=str(shown / index_path.name),
        recorded_by=recorded_by,
        hint="the index is not the one saved",
    )
    sums = {index_path.parent / name: (recorded or {}).get(name) for name in index.shards}
    unknown = [path.name for path, sha in sums.items() if not sha]
    if verify and unknown:
        raise CheckpointError(
            f"verify=True but no sha256 is recorded for the shard(s) {unknown[:5]} of "
            f"{shown / index_path.name} (a transformers folder records none); pass "
            "verify=None to load it unverified, or save it with zoo.save"
        )
    todo = {path: sha for path, sha in sums.items() if sha and to_hash(path, sha, verify)}
    hasher = BackgroundHash(todo, what=recorded_by) if todo else None
    try:
        return read_shards(index, shown=shown), hasher
    except CheckpointError:
        if hasher is not None:
            hasher.verify()  # a damaged shard whose hash is known: say it does not match
        raise


def _verify_index(index_path: Path, shown: Path, expected: str, what: str) -> None:
    """Hash the index of a sharded checkpoint (it is small) against ``expected``."""
    actual = sha256_file(index_path)
    if actual != expected.lower():
        raise ChecksumMismatchError.of_file(
            shown / index_path.name,
            actual=actual,
            expected=expected.lower(),
            says=what,
            advice="the index is damaged or not the one saved. Save or download the "
            "checkpoint again (or pass verify=False, at your own risk).",
        )
    remember_verified(index_path, expected)


def _recognise(
    path: Path, shown: Path, layout: str, model_name: str | None, filename: str
) -> tuple[Recognised, Path]:
    """What the checkpoint at ``path`` (a folder, its weights file or its index) is, and its
    folder; a missing weights file is a :class:`CheckpointError` listing what the folder
    holds. A folder whose weights file is missing but whose index (``model.safetensors`` ->
    ``model.safetensors.index.json``) is there is the sharded checkpoint of that index."""
    if path.is_file():
        check_weights_file(path)
        directory, weights = path.parent, path
    else:
        directory, weights = path, path / filename
    request = Request(
        directory,
        weights,
        read_config_json(directory),
        layout,
        model_name,
        file_given=path.is_file(),
        shown=shown,
    )
    found = recognise(request)
    if not found.weights.is_file() and index_file(found.weights).is_file():
        found = dataclasses.replace(found, weights=index_file(found.weights))
    if not found.weights.is_file():
        raise _missing_weights(directory, found.weights.name)
    return found, directory


def to_hash(path: Path, sha: str, verify: bool | None) -> bool:
    """Whether a file whose sha256 is known is hashed: always with ``verify=True``, never
    with ``verify=False``, by default unless it was verified before and is unchanged."""
    return bool(verify or (verify is None and not was_verified(path, sha)))


def _warn_non_finite(model: ZooModel, what: str) -> None:
    """Warn, naming the tensors, when weights hold NaN or infinity (a diverged training run,
    a corrupted conversion): such a model loads but every output is garbage."""
    from itertools import chain

    from .state import all_finite

    tensors = chain(model.named_parameters(), model.named_buffers())  # tied ones once
    bad = [name for name, tensor in tensors if not all_finite(tensor)]
    if bad:
        warnings.warn(
            f"{what}: {len(bad)} tensor(s) hold NaN or infinite values ({', '.join(bad[:5])}"
            f"{', ...' if len(bad) > 5 else ''}); the model's outputs will not be finite",
            RuntimeWarning,
            stacklevel=3,
        )
