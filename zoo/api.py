"""The public functions: list, describe and build named models."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .config import ModelConfig
from .describe import AdapterInfo, ModelInfo, inert_fields, info
from .devices import check_device, check_dtype
from .errors import UnknownModelError
from .plugin.current import get_registry
from .plugin.host import PluginInfo
from .plugin.specs import ArchitectureSpec, ModelSpec

if TYPE_CHECKING:
    import torch

    from .nn.base import ZooModel
    from .tokenizers import Tokenizer

__all__ = [
    "AdapterInfo",
    "ModelInfo",
    "build",
    "inert_fields",
    "info",
    "list_models",
    "plugins",
    "resolve_config",
    "tokenizer",
]


def list_models() -> list[str]:
    """Names of the named models whose architecture is installed (builds nothing)."""
    return get_registry().models()


def plugins() -> list[PluginInfo]:
    """Every plugin found, with its status and the reason when it failed."""
    return get_registry().plugins


def resolve_config(
    name_or_config: str | ModelConfig, **overrides: Any
) -> tuple[ArchitectureSpec, ModelSpec | None, ModelConfig]:
    """Resolve a model name (or a config) plus overrides to its architecture, spec and config."""
    return get_registry().resolve(name_or_config, **overrides)


def build(
    name_or_config: str | ModelConfig,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    onednn: bool = True,
    **overrides: Any,
) -> ZooModel:
    """Build a randomly initialised model.

    Args:
        name_or_config: a named model (``"gpt2-124m"``) or a config instance.
        device: where parameters are created (``"cpu"``, ``"cuda"``, ``"meta"``...); they are
            created there directly, never on another device first.
        dtype: floating dtype of the parameters (default float32).
        onednn: run a CPU model's linear layers on oneDNN's kernels where this torch has them
            (:mod:`zoo.kernels.onednn`, a build-time transform of the built model; inference only:
            training computes as PyTorch does). The swapped layers are listed in
            ``model.onednn_linears`` and shown in ``repr(model)``; ``onednn=False`` keeps
            PyTorch's ``F.linear`` everywhere.
        **overrides: config fields to change, e.g. ``n_layers=2``.

    Returns:
        The model in training mode, with ``model.config`` (frozen) and ``model.name`` set.
    """
    arch, spec, config = resolve_config(name_or_config, **overrides)
    check_dtype(dtype)
    target = check_device(device)
    from .checkpoint.state import build_on_meta

    make = get_registry().model_factory(arch)  # the names in config resolved once
    model: ZooModel = build_on_meta(make, config)  # no initialisation on meta
    if target.type != "meta":
        from .memory import check_build_fits
        from .nn.materialize import materialize, replays_init

        what = spec.name if spec is not None else f"a {arch.name} model"
        # sizes each within bounds can multiply to terabytes: count on meta, refuse early
        check_build_fits(model, device=target, dtype=dtype, what=what)
        if replays_init(model):  # that model made real, initialised as its constructor does
            materialize(model, target)
        else:  # initialisation outside reset_parameters(): construct it on the target
            with target:
                model = make(config)
    if dtype is not None:
        model = model.to(dtype)
    if spec is not None and hasattr(model, "name"):
        model.name = spec.name
    if onednn and target.type == "cpu":
        from .nn.linear import use_onednn

        use_onednn(model)
    return model


def _unknown_tokenizer(exc: UnknownModelError) -> UnknownModelError:
    """:func:`tokenizer`'s error for a name that is no model, no tokenizer and no folder."""
    known = ", ".join(get_registry().tokenizers()) or "none"
    return UnknownModelError(f"{exc} Registered tokenizers: {known}.")


def check_tokenizer(name: str | os.PathLike[str]) -> None:
    """Refuse, as :func:`tokenizer` would, a name that is neither a named model, a registered
    tokenizer nor a folder; nothing is loaded (no torch), so a typo is reported at once."""
    registry = get_registry()
    name = os.fspath(name)
    try:
        registry.model(name)
    except UnknownModelError as exc:
        if name not in registry.tokenizers() and not os.path.isdir(name):
            raise _unknown_tokenizer(exc) from None


def tokenizer(name: str | os.PathLike[str], **kwargs: Any) -> Tokenizer:
    """The tokenizer of a named model (or alias), a registered tokenizer by its own name, or
    the tokenizer in a folder.

        >>> zoo.tokenizer("gpt2-124m").encode("Every effort moves you")
        [6109, 3626, 6100, 345]

    Args:
        name: a named model (``"gpt2-124m"``), an alias, a tokenizer name (``"gpt2-bpe"``),
            or a folder: a Hugging Face tokenizer (``tokenizer.json`` with
            ``tokenizer_config.json``, its chat template and end ids; see
            :func:`zoo.tokenizers.from_pretrained`) or one saved by zoo.
        **kwargs: passed to the tokenizer's factory, e.g. ``directory=...`` to load
            ``gpt1``'s files or a trained ``transformer-encdec`` tokenizer from a directory.

    Raises:
        UnknownModelError: neither a named model nor a tokenizer.
        ZooError: the model declares no tokenizer, or its plugin supplies none.
        zoo.tokenizers.TokenizerError: the tokenizer cannot be created (see its message).
    """
    registry = get_registry()
    name = os.fspath(name)
    try:
        registry.model(name)
    except UnknownModelError as exc:
        if name in registry.tokenizers():
            return registry.tokenizer(name).load(**kwargs)
        if os.path.isdir(name) and not kwargs:
            from .tokenizers import load_folder

            return load_folder(name)
        raise _unknown_tokenizer(exc) from None
    return registry.model_tokenizer(name).load(**kwargs)
