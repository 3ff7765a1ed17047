"""Writing checkpoints: a zoo model as zoo's own (:func:`save`: ``model.safetensors`` +
``config.json``) or as a Hugging Face checkpoint that ``transformers`` loads (:func:`export`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, UnknownArchitectureError
from ..plugin.current import get_registry
from .commit import atomic_directory
from .generation_file import GENERATION_FILE, GenerationFile
from .hf_form import config_of, foreign_form, hf_layouts
from .manifest import CONFIG_FILE, FORMAT_VERSION, Manifest, weights_record
from .readers import METADATA_KEY
from .shards import parse_max_shard_size, write_weights
from .tokenizer import export_tokenizer_files

if TYPE_CHECKING:
    from torch import Tensor, nn

__all__ = ["export", "hf_layouts", "save"]


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

    config = config_of(model)
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
        _write_generation_file(model, staging)
    return Path(directory)


def _write_generation_file(model: nn.Module, staging: Path) -> None:
    """The model's ``generation_config.json`` (:attr:`zoo.load`'s ``generation_config``) beside
    the weights, so a saved or exported checkpoint keeps its generation defaults."""
    found = getattr(model, "generation_config", None)
    keys = found.to_json() if isinstance(found, GenerationFile) else {}
    if keys:  # nothing zoo honours set: no file
        text = json.dumps(keys, indent=2) + "\n"
        (staging / GENERATION_FILE).write_text(text, encoding="utf-8")


def _is_parameter(model: nn.Module, key: str) -> bool:
    path, _, leaf = key.rpartition(".")
    module = model.get_submodule(path) if path else model
    return leaf in module._parameters


def export(
    model: nn.Module,
    directory: str | os.PathLike[str],
    layout: str | None = None,
    *,
    max_shard_size: int | str | None = None,
    type: str | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint that ``transformers`` loads unchanged, or
    with ``layout="gguf"`` as a GGUF file that llama.cpp runs (:mod:`zoo.checkpoint.gguf.write`).

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
        type: with ``layout="gguf"``, the tensors' type: ``"f32"`` (default), ``"f16"``,
            ``"bf16"``, ``"q8_0"`` or ``"q4_0"``; ``directory`` is then the file to write.

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
    if layout == "gguf" or type is not None:
        return _export_gguf(model, directory, layout, type, max_shard_size)
    config = config_of(model)
    if max_shard_size is not None:
        parse_max_shard_size(max_shard_size)  # a bad size is refused before anything is written
    _, foreign_config, foreign = foreign_form(model, layout)
    foreign_config.update(_special_token_ids(model))
    tensors = _cpu_tensors(foreign)
    dtype = _dtype_name(tensors)
    if dtype and dtype != "mixed":
        foreign_config["dtype"] = dtype
    tokenizer_files = export_tokenizer_files(model, config, directory)
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
        _write_generation_file(model, staging)
    return Path(directory)


def _export_gguf(
    model: nn.Module,
    path: str | os.PathLike[str],
    layout: str | None,
    kind: str | None,
    max_shard_size: int | str | None,
) -> Path:
    """:func:`export` as a GGUF file (``type=`` is GGUF's alone; one file, never shards)."""
    if layout != "gguf":
        raise ValueError(f"type={kind!r} is a GGUF tensor type: pass layout='gguf' with it")
    if max_shard_size is not None:
        raise ValueError("a GGUF file is written whole: max_shard_size does not apply")
    from .gguf.write import write_gguf

    return write_gguf(model, path, type=kind or "f32")


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
