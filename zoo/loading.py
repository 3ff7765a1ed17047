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
from .checkpoint.load import WEIGHTS_DIR_ENV, load_local, local_weights_path
from .checkpoint.readers import existing_checkpoint
from .checkpoint.write import export, save
from .errors import CheckpointError, UnknownModelError
from .hub.load import load_hf, load_named
from .hub.source import PREFIX, parse_hf_source
from .plugin.registry import get_registry

if TYPE_CHECKING:
    import torch

    from .nn.base import ZooModel
    from .plugin.specs import ModelSpec

__all__ = ["check_source", "convert_checkpoint", "load"]


def _looks_like_path(source: str) -> bool:
    """Whether ``zoo.load(source)`` reads a path rather than a named model. A registered name
    always means the named model, even when a folder of that name is in the current directory
    (``./gpt2-124m`` loads the folder); anything else that exists is a path."""
    spelled_as_path = (
        "/" in source
        or os.sep in source
        or source.startswith(("~", "."))
        or Path(source).suffix.lower() in {".safetensors", ".json", *PICKLE_SUFFIXES}
    )
    return spelled_as_path or (source not in get_registry() and Path(source).exists())


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
            - ``"hf:org/name"`` or ``"hf:org/name@revision"``: a Hub repo (:mod:`zoo.hub`).
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
            int8) or ``"int4"`` (weight-only int4), through :func:`zoo.nn.quant.quantize_` on
            PyTorch's kernels. Each weight is quantized from the memory-mapped file and its
            float pages given back, so the float model is never resident.
        onednn: run the CPU model's linear layers on oneDNN's kernels where this torch has
            them (:mod:`zoo.nn.onednn`: faster decoding; the weights are unchanged);
            ``False`` keeps PyTorch's default kernels.

    Returns:
        the model in eval mode, with ``model.tokenizer`` (``None`` when it has none or
        ``tokenizer=False``) and ``model.load_report`` (a :class:`LoadReport`).
    """
    options: dict[str, Any] = {
        "device": device,
        "dtype": dtype,
        "strict": strict,
        "verify": verify,
        "tokenizer": tokenizer,
        "quantize": quantize,
    }
    if isinstance(source, str) and source.startswith("hf:"):
        model = load_hf(source, **options)
    elif isinstance(source, os.PathLike) or (isinstance(source, str) and _looks_like_path(source)):
        model = load_local(Path(os.path.expanduser(os.fspath(source))), **options)
    elif isinstance(source, str):
        model = _load_named(source, **options)
    else:
        raise TypeError(f"source must be a path or a model name, got {type(source).__name__}")
    if onednn:
        from .nn.onednn import use_onednn

        use_onednn(model)
    return model


def check_source(source: str) -> None:
    """Refuse what :func:`load` would refuse before reading anything: a malformed ``hf:``
    source, a path that does not exist, a name no registry knows. Nothing is read or
    imported (no torch), so the command line reports a typo at once."""
    if source.startswith(PREFIX):
        parse_hf_source(source)
    elif _looks_like_path(source):
        existing_checkpoint(Path(os.path.expanduser(source)))
    else:
        _named_spec(source)


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
) -> Path:
    """Read any checkpoint :func:`load` reads and write it as ``to``: ``"zoo"`` (a
    :func:`save` directory) or a Hugging Face layout such as ``"hf-gpt2"`` (:func:`export`),
    in shards of at most ``max_shard_size`` when given. What a ``zoo convert SRC DST [--to
    LAYOUT] [--max-shard-size SIZE]`` command calls."""
    if not _LAYOUT.match(to):
        raise CheckpointError(
            f"{to!r} is not a layout name; use 'zoo' or a layout such as 'hf-gpt2'"
        )
    model = load(source, strict=strict)
    if to == "zoo":
        return save(model, destination, max_shard_size=max_shard_size)
    return export(model, destination, layout=to, max_shard_size=max_shard_size)
