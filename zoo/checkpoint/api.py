"""The public checkpoint functions: save, load, export and convert."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import ModelConfig
from ..devices import check_device, check_dtype
from ..errors import (
    CheckpointError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    UnknownArchitectureError,
    UnknownModelError,
    UnsafeCheckpointError,
    ZooError,
)
from ..plugin.registry import get_registry
from ..plugin.specs import ArchitectureSpec
from ..settings import Settings
from .commit import atomic_directory, clean_stale, pinned_version
from .files import (
    PICKLE_SUFFIXES,
    WEIGHTS_FILE,
    BackgroundHash,
    check_not_pickle,
    read_safetensors,
    remember_verified,
    sha256_file,
    was_verified,
)
from .manifest import (
    CONFIG_FILE,
    FORMAT_VERSION,
    Manifest,
    read_config_json,
    weights_record,
)
from .readers import (
    METADATA_KEY,
    Recognised,
    Request,
    architecture,
    existing_checkpoint,
    recognise,
)
from .shards import (
    check_recorded_shards,
    index_file,
    is_index,
    parse_max_shard_size,
    read_index,
    read_shards,
    write_weights,
)

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from ..nn.base import ZooModel

__all__ = [
    "WEIGHTS_DIR_ENV",
    "export",
    "load_local",
    "local_weights_path",
    "save",
]

log = logging.getLogger("zoo.checkpoint")

#: Environment variable naming a folder of checkpoints, one sub-folder per named model.
WEIGHTS_DIR_ENV = "ZOO_WEIGHTS_DIR"


# -- helpers --------------------------------------------------------------------------------
def _target_device(device: str | torch.device | None) -> torch.device:
    return check_device(device)


def _config_of(model: Any) -> ModelConfig:
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise CheckpointError(
            f"{type(model).__name__} has no zoo config (model.config); only models built by "
            "zoo (zoo.build / zoo.load) can be saved"
        )
    return config


def _plugin_of(architecture: str) -> dict[str, Any] | None:
    registry = get_registry()
    try:
        source = registry.source("architecture", architecture)
    except UnknownArchitectureError:
        return None
    name = source.removeprefix("plugin ")
    dist = next((p.distribution for p in registry.plugins if p.name == name), None)
    return {"name": name, "distribution": dist}


def _cpu_tensors(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    meta = [k for k, t in state.items() if t.is_meta]
    if meta:
        raise CheckpointError(
            f"cannot save: {len(meta)} tensor(s) are on the meta device (e.g. {meta[:3]}); "
            "load or initialise the weights first"
        )
    return {k: t.to("cpu").contiguous() for k, t in state.items()}


def _dtype_name(tensors: Mapping[str, Tensor]) -> str | None:
    names = {str(t.dtype).removeprefix("torch.") for t in tensors.values() if t.is_floating_point()}
    return names.pop() if len(names) == 1 else ("mixed" if names else None)


# -- save -----------------------------------------------------------------------------------
def save(
    model: nn.Module,
    directory: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    max_shard_size: int | str | None = None,
) -> Path:
    """Save a zoo model as ``model.safetensors`` + ``config.json`` in ``directory``.

    Args:
        model: a model built by zoo (it carries ``model.config`` and ``model.name``).
        directory: created if needed. Files of an earlier checkpoint there are replaced
            atomically; a failed save leaves them untouched and no temporary files behind.
        tokenizer: saved with the weights (its files too when it is not a shipped one, e.g. a
            trained subword tokenizer); by default ``model.tokenizer`` when the model has one.
        max_shard_size: split the weights into shards of at most this size, as transformers'
            ``save_pretrained`` does: bytes, or a string such as ``"5GB"`` or ``"500MB"``
            (``model-00001-of-00003.safetensors`` ... and ``model.safetensors.index.json``;
            a tensor larger than the limit gets a shard of its own). Default: one file.

    Tied weights are stored once. ``config.json`` records the architecture, named model,
    config, tokenizer spec, zoo version, format version and the weights' sha256 (each
    shard's when sharded), which :func:`load` verifies.

    Returns:
        the directory.
    """
    from .._version import __version__
    from .state import unique_state

    config = _config_of(model)
    if max_shard_size is not None:
        parse_max_shard_size(max_shard_size)  # a bad size is refused before anything is written
    arch_name = type(config).architecture
    if not arch_name:  # zoo.load could not rebuild it: refuse before writing anything
        raise CheckpointError(
            f"{type(config).__name__} names no architecture (its class variable "
            "`architecture` is empty), so zoo.load could not rebuild this model; save a model "
            "of a registered architecture (zoo.build(name) or its config class)"
        )
    model_name = getattr(model, "name", None)
    tensors = _cpu_tensors(unique_state(model))
    if tokenizer is None:
        tokenizer = getattr(model, "tokenizer", None)
    parameters = sum(t.numel() for k, t in tensors.items() if _is_parameter(model, k))
    description = {
        "format_version": FORMAT_VERSION,
        "architecture": arch_name,
        "model_name": model_name,
        "config": config.to_dict(),
    }
    with atomic_directory(directory) as staging:
        tokenizer_spec = None
        if tokenizer is not None:
            from ..tokenizers import save_tokenizer

            tokenizer_spec = save_tokenizer(tokenizer, staging)
        metadata = {"format": "pt", METADATA_KEY: json.dumps(description)}
        written = write_weights(
            tensors,
            staging,
            metadata,
            max_shard_size=max_shard_size,
            total_parameters=parameters,
        )
        manifest = Manifest(
            architecture=arch_name,
            config=config.to_dict(),
            model_name=model_name,
            tokenizer=tokenizer_spec,
            dtype=_dtype_name(tensors),
            parameters=parameters,
            plugin=_plugin_of(arch_name),
            zoo_version=__version__,
            **weights_record(staging, written),
        )
        text = json.dumps(manifest.to_json(), indent=2) + "\n"
        (staging / CONFIG_FILE).write_text(text, encoding="utf-8")
    return Path(directory)


def _is_parameter(model: nn.Module, key: str) -> bool:
    path, _, leaf = key.rpartition(".")
    module = model.get_submodule(path) if path else model
    return leaf in module._parameters


# -- load -----------------------------------------------------------------------------------
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
        f"{directory} has no {filename} (it has: {', '.join(present) or 'nothing'})"
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
    from ..nn.quant import QUANTIZE_MODES

    check_dtype(dtype)
    if quantize is not None and quantize not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {quantize!r}")
    target = _target_device(device)
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
    import torch

    from .state import assemble

    found, directory = _recognise(path, shown, layout, model_name, filename)
    weights, arch, config = found.weights, found.architecture, found.config
    model_name = model_name or found.model_name
    expected = sha256 or found.sha256
    what = "the pinned sha256" if sha256 else str(shown / CONFIG_FILE)
    hasher: BackgroundHash | None
    if is_index(weights):
        recorded = found.shards if shard_sha256 is None else shard_sha256
        where = "the caller (shard_sha256)" if shard_sha256 is not None else what
        tensors, hasher = _read_sharded(weights, shown, expected, what, recorded, where, verify)
    else:
        tensors, hasher = _read_single(weights, expected, what, verify)
    unexpected: tuple[str, ...] = ()
    if found.keymap is not None:
        tensors, conversion = found.keymap.to_zoo(tensors, config)
        unexpected = conversion.unexpected
    try:
        with torch.no_grad():
            model, report = assemble(
                get_registry().model_factory(arch),
                config,
                tensors,
                device=target,
                dtype=dtype,
                strict=strict,
                unexpected=unexpected,
                what=str(shown / weights.name),
            )
    finally:
        del tensors
        if hasher is not None:
            hasher.verify()
    if hasher is not None:  # the files were read in full just now: check the values too, once
        hasher.remember()
        if quantize is None:  # (quantization checks each weight as it reads it)
            _warn_non_finite(model, str(shown / weights.name))
    if model_name is not None and hasattr(model, "name"):
        model.name = model_name
    model.load_report = report
    if quantize is not None:
        from ..nn.quant import quantize_

        with torch.no_grad():  # CPU weights still mapped from the file: give their pages back
            quantize_(model, quantize, release=target.type == "cpu" and dtype is None)
    model.tokenizer, model.tokenizer_error = (
        _load_tokenizer(found.tokenizer, directory, arch, config, model_name, shown=shown)
        if tokenizer
        else (None, "loaded with tokenizer=False")
    )
    return model


def _read_single(
    weights: Path, expected: str | None, what: str, verify: bool | None
) -> tuple[dict[str, Tensor], BackgroundHash | None]:
    """The tensors of one weights file, memory-mapped, and its hashing when it is verified:
    always with ``verify=True`` (which needs a known hash), by default when not verified
    before."""
    if verify and expected is None:
        raise CheckpointError(
            f"verify=True but no sha256 is recorded or pinned for {weights}; pass sha256=..."
        )
    hasher = None
    if expected and _to_hash(weights, expected, verify):
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
    if expected and _to_hash(index_path, expected, verify):
        actual = sha256_file(index_path)
        if actual != expected.lower():
            raise ChecksumMismatchError(
                f"{shown / index_path.name} has sha256 {actual}, but {what} says "
                f"{expected.lower()}: the index is damaged or not the one saved. Save or "
                "download the checkpoint again (or pass verify=False, at your own risk)."
            )
        remember_verified(index_path, expected)
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
    todo = {path: sha for path, sha in sums.items() if sha and _to_hash(path, sha, verify)}
    hasher = BackgroundHash(todo, what=recorded_by) if todo else None
    try:
        return read_shards(index, shown=shown), hasher
    except CheckpointError:
        if hasher is not None:
            hasher.verify()  # a damaged shard whose hash is known: say it does not match
        raise


def _recognise(
    path: Path, shown: Path, layout: str, model_name: str | None, filename: str
) -> tuple[Recognised, Path]:
    """What the checkpoint at ``path`` (a folder, its weights file or its index) is, and its
    folder; a missing weights file is a :class:`CheckpointError` listing what the folder
    holds. A folder whose weights file is missing but whose index (``model.safetensors`` ->
    ``model.safetensors.index.json``) is there is the sharded checkpoint of that index."""
    if path.is_file():
        check_not_pickle(path)
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


def _to_hash(path: Path, sha: str, verify: bool | None) -> bool:
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


def _registry_tokenizer(
    arch: ArchitectureSpec, config: Any, model_name: str | None, directory: Path
) -> str | None:
    """The registered tokenizer these weights come with, never a guess.

    With ``model_name``: the tokenizer that named model declares, when the vocabulary sizes
    agree (a shrunken test model keeps its name but not the tokenizer). Without one (an
    imported checkpoint): a tokenizer of the architecture's named models that reads its own
    files from the checkpoint (``TokenizerSpec.checkpoint_files``), when all the files of one
    of its sets are in ``directory``; a matching vocabulary size alone attaches nothing.
    """
    registry = get_registry()
    candidates = [model_name] if model_name is not None else registry.models()
    for name in candidates:
        try:
            spec = registry.model(name)
        except UnknownModelError:
            return None
        if spec.architecture != arch.name or spec.tokenizer is None:
            continue
        if model_name is None:
            try:
                sets = registry.tokenizer(spec.tokenizer).checkpoint_file_sets
            except ZooError:
                continue
            if not any(all((directory / f).is_file() for f in files) for files in sets):
                continue
        named_vocab = getattr(registry.resolve(name)[2], "vocab_size", None)  # defaults too
        if named_vocab == getattr(config, "vocab_size", None):
            return spec.tokenizer
    return None


def _own_tokenizer(
    directory: Path, arch: ArchitectureSpec, config: Any, model_name: str | None, *, shown: Path
) -> Any:
    """The tokenizer of a checkpoint that names none, or ``None``: never a guess.

    A Hugging Face ``tokenizer.json`` (beside the weights, or in the folder given: zoo keeps
    a saved model's own files in a version folder inside it) is the tokenizer transformers
    uses, and zoo uses it as written, through the ``tokenizers`` library, whichever family it
    sits beside (:func:`~zoo.tokenizers.pretrained.from_pretrained`, with the roles, chat
    template and end ids of the ``tokenizer_config.json`` and ``generation_config.json``
    beside it). The registered tokenizer of the model named, or of a named model of the
    architecture whose files the folder holds (:func:`_registry_tokenizer`), takes its place
    only when its factory accepts the folder's files: ``gpt2-bpe`` checks them to be GPT-2's
    own (the same ids, through tiktoken), Llama's reads that very ``tokenizer.json``. When
    the factory refuses them, the file is used as written; only a file the library cannot
    read is refused (both reasons are given).

    Raises:
        TokenizerError: the registered tokenizer cannot be made and the folder holds no
            ``tokenizer.json`` the library reads.
    """
    from ..tokenizers import TokenizerError, VocabularyFileError
    from ..tokenizers.hf_backend import TOKENIZER_FILE
    from ..tokenizers.pretrained import from_pretrained

    name = _registry_tokenizer(arch, config, model_name, directory)
    folder = next((d for d in (directory, shown) if (d / TOKENIZER_FILE).is_file()), None)
    if name is None:
        return None if folder is None else from_pretrained(folder, name=model_name or shown.name)
    factory = get_registry().tokenizer(name)
    try:
        return factory.load(directory=directory) if factory.reads_checkpoint else factory.load()
    except TokenizerError as refused:
        if folder is None:
            raise
        try:
            own = from_pretrained(folder, name=model_name or shown.name)
        except TokenizerError as exc:
            raise VocabularyFileError(
                f"{str(refused).rstrip('.')}; nor can zoo use it as written: {exc}"
            ) from None
        log.info("%s: %s; its %s is used as written", shown, refused, TOKENIZER_FILE)
        return own


def _load_tokenizer(
    spec: Mapping[str, Any] | None,
    directory: Path,
    arch: ArchitectureSpec,
    config: Any,
    model_name: str | None,
    *,
    shown: Path,
) -> tuple[Any, str | None]:
    """The tokenizer for a loaded model, or ``None`` and the reason there is none.

    A tokenizer whose files the checkpoint holds must load (an error otherwise: the
    checkpoint is incomplete). A tokenizer named in the checkpoint or inferred from the
    registry is best effort: if it cannot be created here (e.g. its vocabulary is on the Hub
    and this machine is offline) the model still loads, with a warning and the reason in
    ``model.tokenizer_error``. A checkpoint that names no tokenizer gets its own
    (:func:`_own_tokenizer`): a registered tokenizer that accepts its files (read from the
    checkpoint directory, never downloaded), else its Hugging Face ``tokenizer.json`` as
    written. Every tokenizer must fit the model's vocabulary.
    """
    from ..tokenizers import check_fits, load_tokenizer

    vocab_size = getattr(config, "vocab_size", None)
    if spec is not None and spec.get("files"):
        try:
            tokenizer = load_tokenizer(dict(spec), directory)
            if vocab_size is not None:
                check_fits(tokenizer, vocab_size, what=f"the model in {shown}")
        except Exception as exc:
            raise CheckpointError(
                f"{shown}: the checkpoint's tokenizer {dict(spec)} cannot be loaded: {exc}"
            ) from exc
        return tokenizer, None
    try:
        if spec is not None:
            tokenizer = load_tokenizer(dict(spec), directory)
        else:
            tokenizer = _own_tokenizer(directory, arch, config, model_name, shown=shown)
            if tokenizer is None:
                return None, (
                    f"{shown} holds no tokenizer zoo can read and names no model whose "
                    f"tokenizer fits its {vocab_size}-id vocabulary (zoo never guesses one); "
                    "give one with tokenizer=zoo.tokenizer(NAME) or `zoo generate "
                    "--tokenizer NAME`, save it with the weights (zoo.save(model, DIR, "
                    "tokenizer=...)), or pass token ids"
                )
        if vocab_size is not None:
            check_fits(tokenizer, vocab_size)
    except Exception as exc:
        log.warning("model loaded without its tokenizer: %s", exc)
        return None, str(exc)
    return tokenizer, None


# -- export / convert -----------------------------------------------------------------------
def _hf_layouts(arch: ArchitectureSpec) -> list[str]:
    """The layouts of ``arch`` that are Hugging Face checkpoints (declare a ``model_type``)."""
    return sorted(
        lay
        for lay in arch.checkpoint_layouts
        if getattr(arch.checkpoint_layout(lay), "model_type", None) is not None
    )


def export(
    model: nn.Module,
    directory: str | os.PathLike[str],
    layout: str | None = None,
    *,
    max_shard_size: int | str | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint that ``transformers`` loads unchanged.

    Args:
        model: a zoo model whose architecture declares the layout (gpt2 -> ``"hf-gpt2"``,
            gpt1 -> ``"hf-openai-gpt"``).
        directory: receives ``config.json`` and ``model.safetensors`` (atomically), and
            when the model has a tokenizer, ``tokenizer.json`` + ``tokenizer_config.json``
            (and ``vocab.json`` + ``merges.txt`` for a byte-level BPE), which
            ``transformers.AutoTokenizer`` loads as the same tokenizer (a tokenizer that
            cannot be written so is a warning; the weights are still written).
        layout: the layout; optional when the architecture declares only one.
        max_shard_size: split the weights as ``save_pretrained(max_shard_size=...)`` does
            (bytes, or ``"5GB"``, ``"500MB"``...): ``model-00001-of-00003.safetensors`` ...
            and ``model.safetensors.index.json``. Default: one ``model.safetensors``.

    Conv1D weights are transposed back and written contiguous; a tied LM head is omitted
    (transformers re-ties it from ``tie_word_embeddings``). ``config.json`` carries
    ``pad_token_id``, ``bos_token_id`` and ``eos_token_id``: the model's tokenizer's ids,
    null where it has none (never the config class's defaults, which may not fit the
    vocabulary).

    Raises:
        CheckpointError: the layout cannot represent the model (its config differs from what
            the layout holds, e.g. a post-LN model as ``hf-gpt2``), or leaves one of the
            layout's keys unwritten.
    """
    from .state import unique_state

    config = _config_of(model)
    if max_shard_size is not None:
        parse_max_shard_size(max_shard_size)  # a bad size is refused before anything is written
    arch = architecture(type(config).architecture, where="export", plugin=None)
    layouts = _hf_layouts(arch) if layout is None else [layout]
    if len(layouts) != 1:
        raise CheckpointError(
            f"architecture {arch.name!r} declares layouts {_hf_layouts(arch) or 'none'}; "
            "pass layout=... to choose one"
        )
    try:
        keymap = arch.checkpoint_layout(layouts[0])
    except KeyError as exc:
        raise CheckpointError(str(exc.args[0])) from None
    if keymap.config_to_foreign is None:
        raise CheckpointError(f"layout {layouts[0]!r} cannot write a config.json")
    differs = keymap.misrepresented(config)
    if differs:
        raise CheckpointError(
            f"the {layouts[0]!r} layout cannot hold this model: it has {'; '.join(differs)}. "
            "Written anyway it would load as a different model; save it with zoo.save instead"
        )
    try:
        foreign_config = dict(keymap.config_to_foreign(config))
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{arch.name} cannot be exported as {layouts[0]!r}: {exc}") from None
    foreign, report = keymap.from_zoo(unique_state(model), config)
    if report.unexpected:
        raise CheckpointError(
            f"layout {layouts[0]!r} has no place for {list(report.unexpected)[:5]}; this model "
            "cannot be exported to it"
        )
    if report.missing:
        raise CheckpointError(
            f"exporting as {layouts[0]!r} would leave {list(report.missing)[:5]} unwritten; "
            "the model lacks weights that layout needs"
        )
    foreign_config.update(_special_token_ids(model))
    tensors = _cpu_tensors(foreign)
    dtype = _dtype_name(tensors)
    if dtype and dtype != "mixed":
        foreign_config["dtype"] = dtype
    tokenizer_files = _hf_tokenizer_files(model, config, directory)
    with atomic_directory(directory) as staging:
        write_weights(
            tensors,
            staging,
            {"format": "pt"},
            max_shard_size=max_shard_size,
            total_parameters=sum(p.numel() for p in model.parameters()),
        )
        text = json.dumps(foreign_config, indent=2) + "\n"
        (staging / CONFIG_FILE).write_text(text, encoding="utf-8")
        for name, data in tokenizer_files.items():
            (staging / name).write_bytes(data)
    return Path(directory)


#: The special token ids an exported ``config.json`` carries, by tokenizer role.
SPECIAL_TOKEN_KEYS = {"pad": "pad_token_id", "bos": "bos_token_id", "eos": "eos_token_id"}


def _special_token_ids(model: nn.Module) -> dict[str, int | None]:
    """``pad_token_id``, ``bos_token_id`` and ``eos_token_id`` of an export: the ids of the
    tokenizer saved with the model, null for a role it lacks or when there is none. Written
    always: a transformers config class fills an absent key with its own default, which can
    lie outside the vocabulary (Phi-3's ``pad_token_id = 32000``: ``from_pretrained`` then
    fails, ``padding_idx must be within num_embeddings``)."""
    tokenizer = getattr(model, "tokenizer", None)
    return {
        key: None if tokenizer is None else getattr(tokenizer, f"{role}_id", None)
        for role, key in SPECIAL_TOKEN_KEYS.items()
    }


def _hf_tokenizer_files(
    model: nn.Module, config: Any, directory: str | os.PathLike[str]
) -> dict[str, bytes]:
    """The Hugging Face tokenizer files of ``model.tokenizer`` (none when it has none); a
    tokenizer that cannot be written is a warning saying so, and the weights are still
    exported."""
    from .hf_tokenizer import TokenizerExportError, hf_tokenizer_files

    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return {}
    try:
        return hf_tokenizer_files(
            tokenizer, model_max_length=getattr(config, "context_length", None)
        )
    except TokenizerExportError as exc:
        warnings.warn(
            f"{directory}: no tokenizer files written, so transformers' AutoTokenizer will "
            f"not load one from it: {exc}. Give the tokenizer separately.",
            UserWarning,
            stacklevel=3,
        )
        return {}
