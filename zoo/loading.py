"""``zoo.load``: from any source to a model. A source is resolved to a local checkpoint
directory first (a path as it is; a named model's local weights; ``hf:`` sources and named
models published on the Hub through :mod:`zoo.hub`, which fetches a snapshot), then
:mod:`zoo.checkpoint` loads that directory. This module sits above both packages, so the
checkpoint package never imports the Hub.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint.files import PICKLE_SUFFIXES, WEIGHTS_FILE
from .checkpoint.gguf.header import is_gguf
from .checkpoint.load import WEIGHTS_DIR_ENV, load_local, local_weights_path
from .checkpoint.readers import existing_checkpoint, model_folder
from .checkpoint.write import export, save
from .errors import CheckpointError, UnknownModelError
from .hub.adapter import adapter_folder
from .hub.download import ADAPTER_CONFIG
from .hub.snapshot import load_hf, load_hf_gguf, load_named
from .hub.source import PREFIX, parse_hf_source
from .plugin.current import get_registry

if TYPE_CHECKING:
    import torch

    from .adapters import BaseRecord
    from .nn.base import ZooModel
    from .plugin.specs import AdapterSpec, ModelSpec
    from .tokenizers import Tokenizer

__all__ = [
    "adapter_directory",
    "check_adapter",
    "check_source",
    "convert_checkpoint",
    "load",
    "merge",
    "merge_to",
]


def _looks_like_path(source: str) -> bool:
    """Whether ``zoo.load(source)`` reads a path rather than a named model. A registered name
    always means the named model, even when a folder of that name is in the current directory
    (``./gpt2-124m`` loads the folder); anything else that exists is a path."""
    spelled_as_path = (
        "/" in source
        or os.sep in source
        or source.startswith(("~", "."))
        or Path(source).suffix.lower() in {".safetensors", ".json", ".gguf", *PICKLE_SUFFIXES}
    )
    registry = get_registry()
    named = source in registry or registry.is_adapter(source)
    return spelled_as_path or (not named and Path(source).exists())


def _named_adapter(source: object) -> AdapterSpec | None:
    """The named adapter (a registry entry) ``source`` is, or ``None``."""
    if not isinstance(source, str) or source.startswith(PREFIX) or _looks_like_path(source):
        return None
    registry = get_registry()
    return registry.adapter(source) if registry.is_adapter(source) else None


def load(
    source: str | os.PathLike[str],
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    strict: bool = True,
    verify: bool | None = None,
    tokenizer: bool = True,
    quantize: str | None = None,
    onednn: bool = True,
    adapter: str | os.PathLike[str] | None = None,
    gguf: str | None = None,
) -> ZooModel:
    """Load a model with its weights, ready for inference.

    Args:
        source: one of

            - a directory written by :func:`save` (or its ``model.safetensors``);
            - a directory holding a Hugging Face checkpoint (``config.json`` with a
              ``model_type`` some plugin imports, e.g. ``gpt2`` or ``openai-gpt``, plus
              ``model.safetensors``);
            - a named model (``"gpt2-124m"``) whose weights are on this machine: at the
              registry entry's ``weights.path``, or in ``$ZOO_WEIGHTS_DIR/<name>/``;
              otherwise fetched from the entry's Hub repo (:mod:`zoo.hub`);
            - ``"hf:org/name"`` or ``"hf:org/name@revision"``: a Hub repo (:mod:`zoo.hub`);
            - a GGUF file (llama.cpp's format, :mod:`zoo.checkpoint.gguf`): the model, its
              tokenizer and chat template from the file; ``"hf:org/name"`` with
              ``gguf="file.gguf"``: that file of the repo;
            - a named adapter (``[adapters.NAME]`` in a registry file, or a plugin's
              ``zoo_adapters``): its base model, with it applied.
        device: where the weights go (default CPU). CPU weights stay memory-mapped from the
            file (copy-on-write) and are never copied.
        dtype: floating dtype to convert to (default: keep the file's).
        strict: raise :class:`~zoo.errors.StateDictMismatchError` when keys are missing,
            unexpected or mis-shaped; with ``False``, load what matches, initialise the rest,
            log a warning and keep the report in ``model.load_report``.
        verify: check the file's sha256 (pinned for the named model, or recorded by
            :func:`save`); the hash runs on a background thread while the model is
            assembled. ``None`` (default) verifies whenever a hash is known, skipping files
            verified before and not modified since (same inode, size and mtime; recorded in
            ``$ZOO_CACHE_DIR/verified-sha256.json``); ``True`` always hashes; ``False``
            never does.
        tokenizer: also load the tokenizer into ``model.tokenizer``.
        quantize: one of :data:`zoo.options.QUANTIZE_MODES`: ``"int8"`` (int8 weights and,
            on the CPU, int8 activations quantized per call), ``"int8-weight"`` (weight-only
            int8) or ``"int4"`` (weight-only int4), through :func:`zoo.quant.layers.quantize_` on
            PyTorch's kernels. Each weight is quantized from the memory-mapped file and its
            float pages given back, so the float model is never resident.
        onednn: run the CPU model's linear layers on oneDNN's kernels where this torch has
            them (:mod:`zoo.kernels.onednn`: faster decoding; the weights are unchanged);
            ``False`` keeps PyTorch's default kernels.
        adapter: a LoRA adapter to apply (:mod:`zoo.adapters`): a folder holding
            ``adapter_config.json`` and ``adapter_model.safetensors`` (peft's or zoo's), a LoRA
            training run's folder (its ``adapter/``), or ``"hf:org/name[@revision]"`` (pulled,
            pinned to one commit and checked as weights are), or a named adapter (its pinned
            repo, its ``sha256`` checked; ``source`` must be the named base it declares, or
            a copy of that base's weights). The adapter's recorded base
            must be ``source``: its sha256 fingerprint is compared on the float weights,
            before any ``quantize``, and a different base is refused naming both. ``source``
            may itself be an adapter folder or a LoRA run's folder: its base is loaded from
            the name or repo it records.
        gguf: with an ``"hf:"`` source, the GGUF file of the repo to load (pinned to the
            revision's commit and checked against the Hub's sha256 like any weights).

    Returns:
        the model in eval mode, with ``model.tokenizer`` (``None`` when it has none or
        ``tokenizer=False``) and ``model.load_report`` (a :class:`LoadReport`). Its CPU
        weights are memory-mapped from the file (read as they are used); the first decoding
        session moves them into the process's own memory
        (:func:`zoo.kernels.pages.make_resident`).
    """
    options: dict[str, Any] = {
        "device": device,
        "dtype": dtype,
        "strict": strict,
        "verify": verify,
        "tokenizer": tokenizer,
        "quantize": quantize,
    }
    if gguf is not None:
        options["gguf"] = gguf
    elif adapter is None and (named := _named_adapter(source)) is not None:
        source, adapter = named.base, named.name
    elif adapter is None and (folder := _adapter_folder_of(source)) is not None:
        source, adapter = _recorded_base(folder), folder
    if adapter is not None:
        model = _load_adapted(source, adapter, options)
    else:
        model = _load_base(source, options)
    if onednn:
        from .nn.linear import use_onednn

        use_onednn(model)  # in place (same modules, class changed): adapters' hooks stay
    return model


def _load_base(source: str | os.PathLike[str], options: dict[str, Any]) -> ZooModel:
    """:func:`load` of ``source`` without an adapter or oneDNN."""
    options = dict(options)
    if (gguf := options.pop("gguf", None)) is not None:
        model = load_hf_gguf(source, gguf, **options)
    elif isinstance(source, str) and source.startswith("hf:"):
        model = load_hf(source, **options)
    elif isinstance(source, os.PathLike) or (isinstance(source, str) and _looks_like_path(source)):
        path = Path(os.path.expanduser(os.fspath(source)))
        if is_gguf(path):
            from .checkpoint.gguf.load import load_gguf

            model = load_gguf(path, **options)
        else:
            model = load_local(path, **options)
    elif isinstance(source, str):
        model = _load_named(source, **options)
    else:
        raise TypeError(f"source must be a path or a model name, got {type(source).__name__}")
    return model


def _adapter_folder_of(source: object) -> Path | None:
    """The adapter folder a local ``source`` of :func:`load` is (an adapter folder or a LoRA
    run's folder), or ``None``: a model."""
    if isinstance(source, str) and (source.startswith(PREFIX) or not _looks_like_path(source)):
        return None
    if not isinstance(source, (str, os.PathLike)):
        return None
    return adapter_folder(Path(os.path.expanduser(os.fspath(source))))


def adapter_directory(adapter: str | os.PathLike[str]) -> Path:
    """The local folder of ``adapter``: a folder as it is (or a run's ``adapter/``); an
    ``hf:`` adapter is fetched (pinned to one commit, each file checked) into the cache."""
    if isinstance(adapter, str) and adapter.startswith(PREFIX):
        from .hub.adapter import fetch_adapter

        return fetch_adapter(parse_hf_source(adapter)).directory
    if (named := _named_adapter(adapter)) is not None:
        from .hub.adapter import fetch_named_adapter

        return fetch_named_adapter(named).directory
    if not isinstance(adapter, (str, os.PathLike)):
        raise TypeError(f"adapter must be a path or hf:org/name, got {type(adapter).__name__}")
    path = Path(os.path.expanduser(os.fspath(adapter)))
    folder = adapter_folder(path)
    if folder is None:
        what = "does not exist" if not path.exists() else f"has no {ADAPTER_CONFIG}"
        raise CheckpointError(
            f"adapter {path} {what}: give a folder holding {ADAPTER_CONFIG} and "
            "adapter_model.safetensors (peft's save_pretrained or zoo train --lora writes "
            "one), a LoRA training run's folder, hf:org/name[@revision] or a named adapter "
            "(`zoo list` shows them)",
            path=path,
        )
    return folder


def _recorded_base(folder: Path) -> str:
    """What :func:`load` loads as the base of the adapter in ``folder``: the named model, or
    the Hub repo at the revision, that zoo's record names; for an adapter without one (peft
    wrote it), peft's ``base_model_name_or_path`` (and ``revision``)."""
    from .adapters import WEIGHTS_FILE, BaseRecord
    from .checkpoint.files import read_safetensors
    from .hub.adapter import describe_adapter

    _, metadata = read_safetensors(folder / WEIGHTS_FILE)
    record = BaseRecord.from_metadata(metadata, where=str(folder / WEIGHTS_FILE))
    if record is not None:
        name, repo, revision = record.name, record.repo, record.revision
    else:
        config = describe_adapter(folder).config
        named, revision = config.get("base_model_name_or_path"), config.get("revision")
        name = named if isinstance(named, str) and named in get_registry() else None
        repo = named if isinstance(named, str) and name is None else None
        revision = revision if isinstance(revision, str) and revision else None
    if name:
        return name
    if repo and Path(os.path.expanduser(repo)).exists():
        return repo  # peft recorded a local folder
    if repo:
        return f"{PREFIX}{repo}" + (f"@{revision}" if revision else "")
    raise CheckpointError(
        f"{folder} names no base model (by name or Hub repo); give the base: "
        f"zoo.load(BASE, adapter={str(folder)!r}), or --adapter on the command line",
        path=folder,
    )


def _load_adapted(
    source: str | os.PathLike[str], adapter: str | os.PathLike[str], options: dict[str, Any]
) -> ZooModel:
    """:func:`load` with ``adapter``: fetched first (a bad adapter loads no base), then the
    base as stored, whose fingerprint the adapter's record must match (before any ``dtype``
    conversion or quantization), then the quantization (which replaces the linear layers),
    then the adapter on top. Nothing is returned (or kept) when any step fails."""
    import torch

    from .adapters import apply_adapter, read_adapter

    _check_named_base(source, adapter)
    folder = adapter_directory(adapter)
    quantize, dtype = options["quantize"], options["dtype"]
    model = _load_base(source, {**options, "quantize": None, "dtype": None})
    found = read_adapter(folder, model=model)
    fingerprint = _fingerprint(model, found.base, dtype)
    if quantize is not None:
        from .quant.layers import quantize_

        release = dtype is None and all(p.is_cpu for p in model.parameters())
        with torch.no_grad():
            quantize_(model, quantize, release=release)
    apply_adapter(model, found, fingerprint=fingerprint)
    tokenizer = _adapter_tokenizer(folder) if options["tokenizer"] else None
    if tokenizer is not None:
        model.tokenizer = tokenizer
    return model


def _check_named_base(source: str | os.PathLike[str], adapter: str | os.PathLike[str]) -> None:
    """Refuse a named adapter given with another named model than the base it declares,
    naming both, before anything is fetched. A base given as a folder or ``hf:`` repo is
    checked by the adapter's recorded fingerprint instead."""
    named = _named_adapter(adapter)
    if named is None or not isinstance(source, str) or _named_adapter(source) is not None:
        return
    if source.startswith(PREFIX) or _looks_like_path(source):
        return
    registry = get_registry()
    if registry.model(source).name != registry.model(named.base).name:
        raise ValueError(
            f"adapter {named.name!r} is for base model {named.base!r}, not {source!r}: load "
            f"it with its own base (zoo.load({named.name!r}), or --adapter {named.name} "
            f"with {named.base})"
        )


def _fingerprint(model: ZooModel, base: BaseRecord | None, dtype: torch.dtype | None) -> str | None:
    """The fingerprint to hold against the adapter's record ``base`` (``None``: it has none):
    of the weights as stored, or of them converted to ``dtype`` when that is what the
    adapter was trained on. The model is converted to ``dtype`` either way."""
    from .adapters import base_fingerprint

    fingerprint = base_fingerprint(model) if base is not None else None
    if dtype is not None:
        model.to(dtype)  # what load(dtype=) gives: floating weights and buffers converted
        if base is not None and fingerprint != base.sha256:
            fingerprint = base_fingerprint(model)
    return fingerprint


def _adapter_tokenizer(folder: Path) -> Tokenizer | None:
    """The tokenizer that came with an adapter, which replaces the base's (a chat
    fine-tune's template): saved in the adapter folder (peft users save it there) or in
    the LoRA run's ``tokenizer/`` beside ``adapter/``; ``None`` when there is none."""
    from .tokenizers import load_folder

    for where in (folder, folder.parent / "tokenizer" if folder.name == "adapter" else None):
        if where is not None and any(
            (where / name).is_file() for name in ("zoo_tokenizer.json", "tokenizer.json")
        ):
            return load_folder(where)
    return None


def merge(
    base: str | os.PathLike[str],
    adapter: str | os.PathLike[str],
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> ZooModel:
    """The model ``base`` with ``adapter`` folded into its weights: a plain model (no
    adapter modules, the base's own state dict keys) that computes what the adapted one
    does. ``base`` and ``adapter`` are what :func:`load` takes (``adapter``: a folder, a LoRA
    run's folder or ``hf:org/name[@rev]``). :func:`zoo.save` (or ``zoo merge BASE ADAPTER
    OUT``) writes it as a plain checkpoint.

    Raises:
        zoo.CheckpointError: ``adapter`` is no adapter, or its update is not finite or out of
            range; ValueError: its base is not ``base``, or a tensor of the merged model
            would not be finite (named; nothing is returned, so nothing is written).
    """
    import torch

    from .adapters.lora import merge_lora

    model = load(base, adapter=adapter, device=device, dtype=dtype, onednn=False)
    merge_lora(model)
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(
                f"the merged model's {name} holds NaN or infinite values; nothing was written "
                f"(check the base's weights and the adapter {str(adapter)!r})"
            )
    return model


def merge_to(
    base: str | os.PathLike[str],
    adapter: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    to: str | None = None,
) -> tuple[Path, str]:
    """Write :func:`merge`'s model to ``destination`` (atomically) in the base's own format
    (a zoo checkpoint, or the Hugging Face layout the base was stored in), or in ``to``;
    the tokenizer (and its chat template) go with it. Returns the folder and the format."""
    if to is not None and not _LAYOUT.match(to):
        raise CheckpointError(f"{to!r} is not a layout name; use 'zoo' or one such as 'hf-gpt2'")
    model = merge(base, adapter)
    layout = to or _own_format(base)
    if layout == "zoo":
        return save(model, destination), layout
    return export(model, destination, layout=None if layout == "hf" else layout), layout


def _own_format(source: str | os.PathLike[str]) -> str:
    """``"zoo"`` when ``source`` is stored as a zoo checkpoint, else ``"hf"`` (the layout is
    the architecture's Hugging Face one) or the named model's declared layout."""
    from .checkpoint.manifest import config_format, read_config_json

    if isinstance(source, str) and not _looks_like_path(source) and not source.startswith(PREFIX):
        weights = _named_spec(source).weights
        if weights is not None and weights.layout != "auto":
            return weights.layout
        path = local_weights_path(source)
        if path is None:  # Hub weights, fetched by the load just made: read from the cache
            from .hub.download import fetch
            from .hub.source import resolve_source

            path = fetch(resolve_source(source), verify=False).directory
    elif isinstance(source, str) and source.startswith(PREFIX):
        from .hub.download import fetch

        path = fetch(parse_hf_source(source), verify=False).directory
    else:
        path = model_folder(Path(os.path.expanduser(os.fspath(source))))
    folder = path if path.is_dir() else path.parent
    data = read_config_json(folder)
    return "zoo" if data is None or config_format(data, where=str(folder)) == "zoo" else "hf"


def check_source(source: str, *, named_adapter: bool = False) -> None:
    """Refuse what :func:`load` would refuse before reading anything: a malformed ``hf:``
    source, a path that does not exist, a name no registry knows. Nothing is read or
    imported (no torch), so the command line reports a typo at once. A named adapter (whose
    base loads with it) is a source only with ``named_adapter``: ``zoo generate``, ``chat``
    and ``serve`` take one, commands that need a model (``zoo train``, ``zoo merge``'s
    base) are told it is an adapter."""
    if source.startswith(PREFIX):
        parse_hf_source(source)
    elif _looks_like_path(source):
        existing_checkpoint(Path(os.path.expanduser(source)))
    elif named_adapter and (named := _named_adapter(source)) is not None:
        _named_spec(named.base)
    else:
        _named_spec(source)


def check_adapter(adapter: str) -> None:
    """Refuse an adapter :func:`load` would refuse before reading anything (no torch): a
    malformed ``hf:`` source, a folder that is no adapter. A named adapter is fetched only
    when it loads."""
    if adapter.startswith(PREFIX):
        parse_hf_source(adapter)
    elif _named_adapter(adapter) is None:
        adapter_directory(adapter)


def _named_spec(name: str) -> ModelSpec:
    """The registry entry of named model ``name``; unknown, the error says what else loads."""
    try:
        return get_registry().model(name)
    except UnknownModelError as exc:
        raise UnknownModelError(
            f"{exc} (zoo.load also accepts a checkpoint directory; {name!r} is not one)"
        ) from None


def _load_named(name: str, **kwargs: Any) -> ZooModel:
    spec = _named_spec(name)
    path = local_weights_path(spec.name)
    if path is None and spec.weights is not None and spec.weights.repo:
        return load_named(spec.name, **kwargs)
    if path is None:
        where = f" Its weights are published at {spec.weights}." if spec.weights else ""
        raise CheckpointError(
            f"no local weights for {spec.name!r}.{where} Put a checkpoint directory at "
            f"${WEIGHTS_DIR_ENV}/{spec.name}/, set weights.path in a registry file, or pass "
            "a directory to zoo.load()."
        )
    weights = spec.weights
    return load_local(
        path,
        layout=weights.layout if weights else "auto",
        sha256=weights.sha256 if weights else None,
        model_name=spec.name,
        filename=weights.filename if weights else WEIGHTS_FILE,
        **kwargs,
    )


_LAYOUT = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def convert_checkpoint(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    to: str = "zoo",
    strict: bool = True,
    max_shard_size: int | str | None = None,
    type: str | None = None,
) -> Path:
    """Read any checkpoint :func:`load` reads (a LoRA adapter or run: merged into its base)
    and write it as ``to``: ``"zoo"`` (:func:`save`), a Hugging Face layout such as
    ``"hf-gpt2"`` (:func:`export`, in shards of at most ``max_shard_size``), or ``"gguf"``
    (one file, tensors of ``type``: f32, f16, bf16, q8_0, q4_0). ``zoo convert`` calls it."""
    if not _LAYOUT.match(to):
        raise CheckpointError(
            f"{to!r} is not a layout name; use 'zoo', 'gguf' or a layout such as 'hf-gpt2'"
        )
    if type is not None and to != "gguf":
        raise CheckpointError(f"--type {type} is a GGUF tensor type: use it with --to gguf")
    folder = _adapter_folder_of(source)
    if folder is not None:
        model = merge(_recorded_base(folder), folder)
    else:
        model = load(source, strict=strict, onednn=False)
    if to == "zoo":
        return save(model, destination, max_shard_size=max_shard_size)
    return export(model, destination, layout=to, max_shard_size=max_shard_size, type=type)
