"""``zoo.info``: what a named model, a checkpoint, a GGUF file or a LoRA adapter is (its
architecture, components, effective config and size), read without building it or reading its
weights."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .config import ModelConfig, TransformerConfig
from .errors import UnknownModelError, ZooError
from .plugin.current import get_registry
from .plugin.specs import COMPONENT_KINDS, ArchitectureSpec, WeightsSource

if TYPE_CHECKING:
    from pathlib import Path

    from .hub.download import Pinned

__all__ = ["AdapterInfo", "ModelInfo", "inert_fields", "info"]


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What ``zoo info NAME`` shows."""

    name: str
    aliases: tuple[str, ...]
    description: str
    architecture: str
    architecture_description: str
    plugin: str
    model_source: str
    blocks: tuple[str, ...]
    positions: str
    tokenizer: str | None
    config: Mapping[str, Any]
    parameters: int
    weights: WeightsSource | None
    tokenizer_description: str | None = None
    #: ``(kind, name, source)`` of each component the model is composed of.
    components: tuple[tuple[str, str, str], ...] = ()
    #: The weights file, when described from a checkpoint rather than a named model.
    checkpoint: str | None = None
    #: A LoRA adapter's facts when ``info`` was given one (the rest describes its base).
    adapter: AdapterInfo | None = None


@dataclasses.dataclass(frozen=True)
class AdapterInfo:
    """What ``zoo info ADAPTER`` shows of a LoRA adapter: the base it records (``base_name``,
    ``base_repo``, ``base_revision``, ``base_sha256``; ``None`` where it records none, as in
    an adapter peft wrote, whose ``base_model_name_or_path`` stands in), its ``rank``,
    ``alpha`` and ``targets`` (peft's ``target_modules``), its ``parameters`` and ``size``
    on disk in bytes, the ``directory`` it was read from."""

    base_name: str | None
    base_repo: str | None
    base_revision: str | None
    base_sha256: str | None
    rank: int | None
    alpha: float | None
    targets: tuple[str, ...]
    parameters: int
    size: int
    directory: str


def info(source: str) -> ModelInfo:
    """Describe a model: its architecture, plugin, components, the config fields that take
    effect, and its parameter count. Nothing is initialised and no weights are read.

    Args:
        source: a named model or alias, or anything :func:`zoo.load` accepts: a checkpoint
            directory (or its weights file) or ``"hf:org/name[@revision]"`` (fetched into the
            Hugging Face cache first). A checkpoint's config is read from its ``config.json``
            (or its weights file's header).
    """
    from .loading import _looks_like_path

    if source.startswith("hf:") or _looks_like_path(source):
        from .hub.download import pin
        from .hub.source import parse_hf_source

        pinned = pin(parse_hf_source(source)) if source.startswith("hf:") else None
        adapter = _adapter(source, pinned)  # the revision resolved once for both
        return _checkpoint_info(source, pinned) if adapter is None else _with_base(source, adapter)
    registry = get_registry()
    if registry.is_adapter(source):
        return _named_adapter(source)
    try:
        arch, spec, config = registry.resolve(source)
    except UnknownModelError as exc:
        raise UnknownModelError(
            f"{exc} (zoo info also takes a checkpoint directory or hf:org/name; {source!r} "
            "is neither)"
        ) from None
    assert spec is not None
    return ModelInfo(
        name=spec.name,
        aliases=spec.aliases,
        description=spec.description,
        architecture=arch.name,
        architecture_description=arch.description,
        plugin=registry.source("architecture", arch.name),
        model_source=registry.source("model", spec.name),
        blocks=_blocks(arch, config),
        positions=getattr(config, "positions", "n/a"),
        tokenizer=spec.tokenizer,
        config=_effective(config),
        parameters=_parameters(config),
        weights=spec.weights,
        tokenizer_description=_tokenizer_description(spec.tokenizer),
        components=_components(config),
    )


def _adapter(source: str, pinned: Pinned | None) -> AdapterInfo | None:
    """The facts of the LoRA adapter ``source`` is (a folder, a LoRA run's folder, an ``hf:``
    repo that holds one, ``pinned``, fetched), or ``None`` when it is a model."""
    from pathlib import Path

    from .hub.adapter import adapter_folder, describe_adapter, fetch_adapter, is_adapter
    from .hub.source import parse_hf_source

    if pinned is not None:
        hub_source = parse_hf_source(source)
        if not is_adapter(pinned, hub_source):
            return None
        folder: Path | None = fetch_adapter(hub_source, pinned=pinned).directory
    else:
        folder = adapter_folder(Path(os.path.expanduser(source)))
    if folder is None:
        return None
    facts = describe_adapter(folder)
    config, base = facts.config, facts.base
    peft_base = config.get("base_model_name_or_path")
    targets = config.get("target_modules")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    return AdapterInfo(
        base_name=base.get("name") if base else None,
        base_repo=base.get("repo") if base else (peft_base if isinstance(peft_base, str) else None),
        base_revision=base.get("revision"),
        base_sha256=base.get("sha256"),
        rank=rank if isinstance(rank, int) else None,
        alpha=float(alpha) if isinstance(alpha, (int, float)) else None,
        targets=tuple(map(str, targets)) if isinstance(targets, list) else (str(targets),),
        parameters=facts.parameters,
        size=sum(facts.files.values()),
        directory=str(folder),
    )


def _named_adapter(name: str) -> ModelInfo:
    """:func:`info` of a named adapter: its base's, under the adapter's name, saying whose
    adapter it is and where it is pinned (nothing is fetched)."""
    registry = get_registry()
    spec = registry.adapter(name)
    what = f"a LoRA adapter of {spec.base}, pinned at {spec.source}" + (
        f" (sha256 {spec.sha256})" if spec.sha256 else ""
    )
    return dataclasses.replace(
        info(spec.base),
        name=spec.name,
        aliases=(),
        description=f"{what}: {spec.description}" if spec.description else what,
        model_source=registry.source("adapter", spec.name),
    )


def _with_base(source: str, adapter: AdapterInfo) -> ModelInfo:
    """:func:`info` of an adapter: its base described when it is a named model (no weights
    read), else only named."""
    base = adapter.base_name or adapter.base_repo or "a base known by its sha256 only"
    what = f"a LoRA adapter (rank {adapter.rank}) for {base}"
    if adapter.base_name is not None and adapter.base_name in get_registry():
        named = info(adapter.base_name)
        return dataclasses.replace(
            named, name=source, aliases=(), description=what, adapter=adapter
        )
    return ModelInfo(
        name=source, aliases=(), description=what, architecture="-",
        architecture_description=f"the base's; see zoo info {base}", plugin="-",
        model_source=adapter.directory, blocks=(), positions="-", tokenizer=None, config={},
        parameters=0, weights=None, adapter=adapter,
    )  # fmt: skip


def _blocks(arch: ArchitectureSpec, config: ModelConfig) -> tuple[str, ...]:
    """The blocks as ``config`` makes them (layer counts, norm placement, final norm) for a
    Transformer; otherwise as the architecture declares them. A config whose ``block``
    names another block component than ``transformer`` shows that component's description
    (its norm placement is the block's, not ``norm_first``'s)."""
    if not isinstance(config, TransformerConfig):
        return arch.blocks
    stacks = [
        f"{getattr(config, field)} {label}"
        for field, label in (
            ("n_layers", "blocks"),
            ("n_encoder_layers", "encoder blocks"),
            ("n_decoder_layers", "decoder blocks with cross-attention"),
        )
        if hasattr(config, field)
    ]
    norm = "pre-LN, x + f(norm(x))" if config.norm_first else "post-LN, norm(x + f(x))"
    if config.parallel_residual:
        norm = "parallel, x + attn(norm1(x)) + ffn(norm2(x))"
    block = getattr(config, "block", "transformer")
    if isinstance(block, str) and block != "transformer":  # a declared block says what it is
        description = get_registry().component("block", block).description
        norm = f"{block}: {description}" if description else block
    final = [f"a final norm after {'each stack' if len(stacks) > 1 else 'the blocks'}"]
    final = final if config.final_norm else []
    inside = []
    if config.head_dim is not None:
        inside.append(f"heads {config.head_dim} wide (not d_model / n_heads)")
    if config.qk_norm:
        if getattr(config, "qk_norm_scope", "head") == "full":
            inside.append(f"{config.norm} on the queries and keys, across all heads")
        else:
            inside.append(f"{config.norm} on each head's queries and keys")
    if config.n_experts is not None:
        inside.append(
            f"feed-forward: {config.n_experts} {config.ffn} experts, "
            f"{config.experts_per_token} per token"
        )
    return (f"{' + '.join(stacks)} ({norm})", *inside, *final)


def _effective(config: ModelConfig) -> dict[str, Any]:
    """``config`` as a dict without its inert fields (:func:`inert_fields`)."""
    inert = inert_fields(config)
    return {k: v for k, v in config.to_dict().items() if k not in inert}


def _parameters(config: ModelConfig) -> int:
    """Distinct parameters of a model of ``config``, counted on the meta device."""
    from .checkpoint.state import build_on_meta

    arch = get_registry().architecture(type(config).architecture)
    model = build_on_meta(get_registry().model_factory(arch), config)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _components(config: ModelConfig) -> tuple[tuple[str, str, str], ...]:
    registry = get_registry()
    return tuple(
        (kind, getattr(config, kind), registry.source(kind, getattr(config, kind)))  # type: ignore[arg-type]
        for kind in COMPONENT_KINDS
        if isinstance(getattr(config, kind, None), str)
    )


def _checkpoint_info(source: str, pinned: Pinned | None = None) -> ModelInfo:
    """:func:`info` for a checkpoint: recognised as :func:`zoo.load` recognises it, from its
    config, without reading the weights."""
    import os
    from pathlib import Path

    from .checkpoint.files import WEIGHTS_FILE
    from .checkpoint.gguf.header import is_gguf
    from .checkpoint.manifest import read_config_json
    from .checkpoint.readers import Request, existing_checkpoint, recognise

    layout, model_name = "auto", None
    if source.startswith("hf:"):
        from .hub.download import fetch
        from .hub.source import parse_hf_source

        hub_source = parse_hf_source(source)
        snapshot = fetch(hub_source, verify=False, pinned=pinned)
        directory, weights, file_given = snapshot.directory, snapshot.weights, False
        layout, model_name = hub_source.layout, hub_source.model_name
    else:
        path = existing_checkpoint(Path(os.path.expanduser(source)))
        file_given = path.is_file()
        directory, weights = (path.parent, path) if file_given else (path, path / WEIGHTS_FILE)
        if file_given and is_gguf(path):
            return _gguf_info(source, path)
    request = Request(
        directory, weights, read_config_json(directory), layout, model_name, file_given
    )
    found = recognise(request)
    registry = get_registry()
    arch, config = found.architecture, found.config
    name = found.model_name
    tokenizer = None
    if found.tokenizer is not None:
        tokenizer = str(found.tokenizer.get("name") or found.tokenizer.get("kind") or "saved")
    elif name is not None:
        tokenizer = registry.model(name).tokenizer if name in registry else None
    fmt = "a zoo checkpoint" if found.format == "zoo" else f"a {found.format} checkpoint"
    labels = getattr(config, "labels", None)
    what = f"{fmt} of {arch.name}" + (f" ({name})" if name else "")
    if isinstance(labels, list):
        what += f", a classifier over labels {', '.join(map(str, labels))}"
    return ModelInfo(
        name=source,
        aliases=(),
        description=what,
        architecture=arch.name,
        architecture_description=arch.description,
        plugin=registry.source("architecture", arch.name),
        model_source=str(directory),
        blocks=_blocks(arch, config),
        positions=getattr(config, "positions", "n/a"),
        tokenizer=tokenizer,
        config=_effective(config),
        parameters=_parameters(config),
        weights=None,
        tokenizer_description=None,
        components=_components(config),
        checkpoint=str(found.weights),
    )


def _gguf_info(source: str, path: Path) -> ModelInfo:
    """:func:`info` for a GGUF file: its metadata and tensor types (no tensor read)."""
    from collections import Counter

    from .checkpoint.gguf.header import read_header
    from .checkpoint.gguf.read import read_config
    from .checkpoint.gguf.tensors import type_name

    header = read_header(path)
    found = read_config(header)
    arch, config, meta = found.architecture, found.config, header.metadata
    kinds = Counter(type_name(t.ggml_type) for t in header.tensors)
    named = f" ({meta['general.name']})" if isinstance(meta.get("general.name"), str) else ""
    tensors = ", ".join(f"{kind} x{count}" for kind, count in kinds.most_common())
    vocabulary = meta.get("tokenizer.ggml.model")
    return ModelInfo(
        name=source,
        aliases=(),
        description=f"a GGUF file of {arch.name}{named}: tensors {tensors}",
        architecture=arch.name,
        architecture_description=arch.description,
        plugin=get_registry().source("architecture", arch.name),
        model_source=str(path),
        blocks=_blocks(arch, config),
        positions=getattr(config, "positions", "n/a"),
        tokenizer=f"in the file (llama.cpp's {vocabulary!r} vocabulary)" if vocabulary else None,
        config=_effective(config),
        parameters=_parameters(config),
        weights=None,
        components=_components(config),
        checkpoint=str(path),
    )


def _tokenizer_description(name: str | None) -> str | None:
    """The registered description of tokenizer ``name`` (nothing is loaded or downloaded)."""
    if name is None:
        return None
    try:
        return get_registry().tokenizer(name).description or name
    except ZooError as exc:
        return f"not available: {exc}"


def inert_fields(config: ModelConfig) -> frozenset[str]:
    """The fields of ``config`` that take no effect given its components: a field that some
    component of a kind reads (:attr:`ComponentSpec.reads`) while the component of that kind
    this config names declares that it does not (``activation`` beside ``ffn = "swiglu"``).
    A component that declares nothing (``reads=None``) leaves every field in effect; a field
    only another family's config has (T5's relative attention buckets) is not ``config``'s."""
    registry = get_registry()
    inert: set[str] = set()
    kept: set[str] = set()
    for kind in COMPONENT_KINDS:
        chosen = getattr(config, kind, None)
        if not isinstance(chosen, str):
            continue
        reads = registry.component(kind, chosen).reads
        owned = {
            field
            for name in registry.components(kind)
            for field in registry.component(kind, name).reads or ()
        }
        if reads is None:
            kept |= owned
        else:
            inert |= owned - set(reads)
            kept |= set(reads)
    return frozenset((inert - kept) & set(type(config).field_names()))  # fields it has
