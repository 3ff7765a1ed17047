"""The public functions: list, describe and build named models."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .config import ModelConfig
from .errors import ConfigError, UnknownArchitectureError
from .plugins import PluginInfo
from .registry import get_registry
from .specs import ArchitectureSpec, ModelSpec, WeightsSource

if TYPE_CHECKING:
    import torch

__all__ = ["ModelInfo", "build", "info", "list_models", "plugins", "resolve_config"]


def list_models() -> list[str]:
    """Names of the named models whose architecture is installed (builds nothing)."""
    return get_registry().models()


def plugins() -> list[PluginInfo]:
    """Every plugin found, with its status and the reason when it failed."""
    return get_registry().plugins


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


def resolve_config(
    name_or_config: str | ModelConfig, **overrides: Any
) -> tuple[ArchitectureSpec, ModelSpec | None, ModelConfig]:
    """Resolve a model name (or a config) plus overrides to its architecture, spec and config."""
    registry = get_registry()
    if isinstance(name_or_config, ModelConfig):
        arch = registry.architecture(type(name_or_config).architecture)
        return arch, None, name_or_config.replace(**overrides)
    if not isinstance(name_or_config, str):
        raise TypeError(
            f"expected a model name or a ModelConfig, got {type(name_or_config).__name__}"
        )
    spec = registry.model(name_or_config)
    try:
        arch = registry.architecture(spec.architecture)
    except UnknownArchitectureError as exc:
        raise UnknownArchitectureError(
            f"model {spec.name!r} needs architecture {spec.architecture!r}: {exc}"
        ) from None
    config_class = arch.config_class
    try:
        config = config_class.from_dict({**spec.config, **overrides})
    except ConfigError as exc:
        raise ConfigError(f"{spec.name}: {exc}") from None
    return arch, spec, config


def build(
    name_or_config: str | ModelConfig,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    **overrides: Any,
) -> torch.nn.Module:
    """Build a randomly initialised model.

    Args:
        name_or_config: a named model (``"gpt2-124m"``) or a config instance.
        device: where parameters are created (``"cpu"``, ``"cuda"``, ``"meta"``...); they are
            created there directly, never on another device first.
        dtype: floating dtype of the parameters (default float32).
        **overrides: config fields to change, e.g. ``n_layers=2``.

    Returns:
        The model in training mode, with ``model.config`` (frozen) and ``model.name`` set.
    """
    import torch

    arch, spec, config = resolve_config(name_or_config, **overrides)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ConfigError(
            f"dtype must be a floating torch.dtype such as torch.bfloat16, got {dtype!r}"
        )
    with torch.device(device if device is not None else "cpu"):
        model = arch.model_class(config)
    if dtype is not None:
        model = model.to(dtype)
    if spec is not None and hasattr(model, "name"):
        model.name = spec.name
    return model


def info(name: str) -> ModelInfo:
    """Describe a named model: architecture, plugin, components, config, parameter count."""
    registry = get_registry()
    arch, spec, config = resolve_config(name)
    assert spec is not None
    model = build(name, device="meta")
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return ModelInfo(
        name=spec.name,
        aliases=spec.aliases,
        description=spec.description,
        architecture=arch.name,
        architecture_description=arch.description,
        plugin=registry.source("architecture", arch.name),
        model_source=registry.source("model", spec.name),
        blocks=arch.blocks,
        positions=getattr(config, "positions", "n/a"),
        tokenizer=spec.tokenizer,
        config=config.to_dict(),
        parameters=params,
        weights=spec.weights,
    )
