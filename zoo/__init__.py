"""zoo: a plugin-based model zoo for PyTorch.

    >>> import zoo
    >>> zoo.list_models()
    ['gpt1', 'gpt2-124m', 'transformer-encdec', 'transformer-encdec-tiny', 'wiki-gpt-wordpiece']
    >>> model = zoo.build("gpt2-124m")

Importing zoo does not import torch; :func:`build` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._moved import install as _install_moved
from ._version import DISTRIBUTION, __version__
from .api import ModelInfo, build, info, list_models, plugins, resolve_config, tokenizer
from .checkpoint import LoadReport, export, save
from .config import DecoderConfig, ModelConfig, TransformerConfig
from .errors import (
    CheckpointError,
    ChecksumMismatchError,
    CompileUnavailableError,
    ConfigError,
    CorruptCheckpointError,
    HubAuthError,
    HubError,
    HubNotFoundError,
    HubOfflineError,
    HubUnavailableError,
    PluginContractError,
    PluginError,
    RegistryConflictError,
    StateDictMismatchError,
    UnknownArchitectureError,
    UnknownModelError,
    UnsafeCheckpointError,
    ZooError,
)
from .hub import pull, push
from .loading import convert_checkpoint, load
from .plugin.hookspecs import hookimpl
from .plugin.registry import add_plugin, get_registry, reset_registry, use_registry
from .plugin.specs import ArchitectureSpec, ComponentSpec, ModelSpec, TokenizerSpec, WeightsSource

_install_moved()

if TYPE_CHECKING:  # type checkers see the real names (and generate's overloads)
    from .generation import GenerationConfig, generate

#: Imported on first use: they import torch, which ``import zoo`` does not.
_LAZY = {
    "generate": "zoo.generation:generate",
    "GenerationConfig": "zoo.generation:GenerationConfig",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from ._lazy import resolve

        return resolve(_LAZY[name])
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


__all__ = [
    "DISTRIBUTION",
    "ArchitectureSpec",
    "CheckpointError",
    "ChecksumMismatchError",
    "CompileUnavailableError",
    "ComponentSpec",
    "ConfigError",
    "CorruptCheckpointError",
    "DecoderConfig",
    "GenerationConfig",
    "HubAuthError",
    "HubError",
    "HubNotFoundError",
    "HubOfflineError",
    "HubUnavailableError",
    "LoadReport",
    "ModelConfig",
    "ModelInfo",
    "ModelSpec",
    "PluginContractError",
    "PluginError",
    "RegistryConflictError",
    "StateDictMismatchError",
    "TokenizerSpec",
    "TransformerConfig",
    "UnknownArchitectureError",
    "UnknownModelError",
    "UnsafeCheckpointError",
    "WeightsSource",
    "ZooError",
    "__version__",
    "add_plugin",
    "build",
    "convert_checkpoint",
    "export",
    "generate",
    "get_registry",
    "hookimpl",
    "info",
    "list_models",
    "load",
    "plugins",
    "pull",
    "push",
    "reset_registry",
    "resolve_config",
    "save",
    "tokenizer",
    "use_registry",
]
