"""Reading a GGUF file as a zoo model's config and state.

The file is read as the Hugging Face checkpoint llama.cpp's converter made it from: its
metadata as ``config.json`` (:func:`hf_config`: each key of the family's table, every other
key of the architecture refused by name), its tensors renamed by the ``gguf`` package's map and
undone of llama.cpp's transforms (:mod:`zoo.checkpoint.gguf.families`). The family's own
Hugging Face layout then reads both, exactly as it reads a ``transformers`` folder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import CheckpointError
from .families import Family, family_of
from .header import GGUFHeader, TensorInfo, read_header
from .tensors import read_tensors, type_name

if TYPE_CHECKING:
    from torch import Tensor

    from ...plugin.specs import ArchitectureSpec

__all__ = ["GGUFCheckpoint", "GGUFConfig", "hf_config", "read_config", "read_gguf"]

#: Token-id keys of the metadata -> ``config.json``'s.
_TOKEN_IDS = {
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}
#: Keys of the architecture checked rather than copied (rope scaling must be none).
_INERT = ("rope.scaling.type",)


@dataclasses.dataclass(frozen=True)
class GGUFCheckpoint:
    """A GGUF file read for zoo: the architecture, its config, the state in zoo's layout, the
    metadata (the tokenizer's is :mod:`zoo.checkpoint.gguf.vocab`'s) and each tensor's ggml type."""

    architecture: ArchitectureSpec
    config: Any
    state: dict[str, Tensor]
    metadata: Mapping[str, Any]
    types: Mapping[str, str]  # GGUF tensor name -> its type: "q8_0", "f16", ...
    unexpected: tuple[str, ...] = ()


def hf_config(family: Family, header: GGUFHeader) -> dict[str, Any]:
    """The ``config.json`` (as a dict) the file's metadata stands for; a ``ValueError``
    names any key of the architecture that the family does not read."""
    meta = header.metadata
    hf = {"model_type": family.model_type_of(meta), **_values(family, meta)}
    if family.swa_period:
        hf["layer_types"] = family.layer_types(int(hf["num_hidden_layers"]))
    hf |= {hf_key: meta[key] for key, hf_key in _TOKEN_IDS.items() if key in meta}
    names = {t.name: t for t in header.tensors}
    embedding = names.get("token_embd.weight")
    if embedding is not None:  # llama.cpp writes no vocabulary size for most families
        hf.setdefault("vocab_size", embedding.shape[0])
    hf["tie_word_embeddings"] = "output.weight" not in names or _head_is_a_copy(
        family, names, header.path
    )
    if family.tensor_facts is not None:
        hf |= family.tensor_facts(set(names))
    family.check_held(hf)
    return hf


def _values(family: Family, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The ``config.json`` values of the architecture's keys; every other key of it (and of
    no other section than ``general`` and ``tokenizer``) refused by name."""
    prefix = f"{family.arch}."
    hf: dict[str, Any] = {}
    for key, hf_key in family.keys:
        if prefix + key in meta:
            hf[hf_key] = meta[prefix + key]
    for key, derive, _ in family.derived:
        if prefix + key in meta:
            derive(meta[prefix + key], hf)
    scaling = meta.get(prefix + "rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"{prefix}rope.scaling.type is {scaling!r}: zoo reads no rope scaling")
    known = {key for key, _ in family.keys} | {key for key, _, _ in family.derived}
    unread = [k for k in meta if k.startswith(prefix) and k[len(prefix) :] not in known | {*_INERT}]
    unread += [k for k in meta if not k.startswith((prefix, "general.", "tokenizer."))]
    if unread:
        raise ValueError(
            f"the GGUF metadata holds {', '.join(sorted(unread))}, which zoo does not read for "
            f"{family.arch!r}: a model that needs them would compute differently"
        )
    return hf


def _head_is_a_copy(family: Family, records: Mapping[str, TensorInfo], path: Path) -> bool:
    """Whether ``output.weight`` holds the token embedding's bytes (GPT-2's tied head)."""
    if not family.tied_head_copy:
        return False
    head, embedding = records["output.weight"], records.get("token_embd.weight")
    if embedding is None or (head.shape, head.ggml_type) != (embedding.shape, embedding.ggml_type):
        return False
    with open(path, "rb") as f:
        f.seek(head.start)
        a = f.read(head.nbytes)
        f.seek(embedding.start)
        return a == f.read(embedding.nbytes)


@dataclasses.dataclass(frozen=True)
class GGUFConfig:
    """What a GGUF file's metadata says: its family, the ``config.json`` it stands for, and
    the installed architecture, layout and zoo config that read it."""

    family: Family
    hf: Mapping[str, Any]
    architecture: ArchitectureSpec
    keymap: Any
    config: Any


def read_config(header: GGUFHeader) -> GGUFConfig:
    """The zoo config of the file ``header`` describes (no tensor read); a
    :class:`CheckpointError` names what zoo does not read."""
    from ..readers import foreign_layout, make_config

    where = str(header.path)
    try:
        family = family_of(header.architecture, where=where)
        hf = hf_config(family, header)
    except ValueError as exc:
        raise CheckpointError(f"{where}: {exc}", path=header.path) from None
    claim = foreign_layout(hf["model_type"], where=where)
    arch, keymap = claim.architecture, claim.architecture.checkpoint_layout(claim.layout)
    try:
        values = keymap.config_from_foreign(hf)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{where}: {exc}", path=header.path) from None
    return GGUFConfig(family, hf, arch, keymap, make_config(arch, values, where=where))


def read_gguf(path: Path) -> GGUFCheckpoint:
    """The zoo config and state of the GGUF file ``path``; a :class:`CheckpointError` (or
    :class:`~zoo.errors.CorruptCheckpointError`) names what is wrong."""
    header = read_header(path)
    found = read_config(header)
    family, hf, config = found.family, found.hf, found.config
    names = _hf_names(found.architecture, found.keymap, config, family, hf)
    foreign, types = _hf_state(header, family, hf, names, tied=hf["tie_word_embeddings"])
    state, report = found.keymap.to_zoo(foreign, config)
    return GGUFCheckpoint(
        found.architecture, config, state, header.metadata, types, report.unexpected
    )


def _hf_names(
    arch: ArchitectureSpec, keymap: Any, config: Any, family: Family, hf: Mapping[str, Any]
) -> dict[str, list[tuple[str, int | None]]]:
    """GGUF tensor name -> the Hugging Face keys it holds (with the expert index, for a
    mixture's stacked experts), for the model ``config`` describes."""
    import torch

    from ...plugin.current import get_registry
    from ..state import unique_state

    with torch.device("meta"):
        model = get_registry().model_factory(arch)(config)
    foreign, _ = keymap.from_zoo(unique_state(model), config)  # a tied head once
    table = family.names(hf)
    names: dict[str, list[tuple[str, int | None]]] = {}
    for key in foreign:
        name, expert = family.gguf_name(table, key)
        names.setdefault(name, []).append((key, expert))
    return names


def _hf_state(
    header: GGUFHeader,
    family: Family,
    hf: Mapping[str, Any],
    names: Mapping[str, list[tuple[str, int | None]]],
    *,
    tied: bool,
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The file's tensors under their Hugging Face keys, llama.cpp's transforms undone."""
    state: dict[str, Tensor] = {}
    types: dict[str, str] = {}
    unknown = [
        t.name for t in header.tensors
        if t.name not in names and not (tied and t.name == "output.weight")
    ]  # fmt: skip
    if unknown:
        raise CheckpointError(
            f"{header.path}: tensors zoo's {family.model_type} layout has no place for: "
            f"{', '.join(unknown[:8])}",
            path=header.path,
        )
    for info, tensor in read_tensors(header, names):  # not the tied head's copy
        types[info.name] = type_name(info.ggml_type)
        tensor = family.tensor_from_gguf(info.name, tensor, hf)
        for key, expert in names[info.name]:
            state[key] = tensor if expert is None else tensor[expert]
    return state, types
