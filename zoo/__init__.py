"""zoo: a plugin-based model zoo for PyTorch.

    >>> import zoo
    >>> "gpt2-124m" in zoo.list_models()      # every named model: zoo.list_models(), `zoo list`
    True
    >>> model = zoo.build("gpt2-124m", n_layers=2)   # random weights; zoo.load for trained ones
    >>> model.config.n_layers
    2

Importing zoo does not import torch, nor any of its modules: each public name below is
imported on first use (:func:`build` imports torch). ``docs/layout.md`` maps where things live.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_attributes
from ._moved import install as _install_moved
from ._version import DISTRIBUTION, __version__

_install_moved()

if TYPE_CHECKING:  # type checkers see the real names (and generate's overloads)
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
    from .generation import GenerationConfig, generate
    from .hub import pull, push
    from .loading import convert_checkpoint, load, merge
    from .plugin.current import add_plugin, get_registry, reset_registry, use_registry
    from .plugin.hookspecs import hookimpl
    from .plugin.specs import (
        ArchitectureSpec,
        ComponentSpec,
        ModelSpec,
        TokenizerSpec,
        WeightsSource,
    )

__all__ = [
    "DISTRIBUTION",
    "AdapterSpec",
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
    "LoRA",
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
    "merge",
    "plugins",
    "pull",
    "push",
    "reset_registry",
    "resolve_config",
    "save",
    "tokenizer",
    "use_registry",
]


#: The public names but the errors (from zoo.errors), by the module each is imported from on
#: first use.
_EXPORTS = {
    "zoo.api": (
        "ModelInfo",
        "build",
        "info",
        "list_models",
        "plugins",
        "resolve_config",
        "tokenizer",
    ),
    "zoo.checkpoint": ("LoadReport", "export", "save"),
    "zoo.config": ("DecoderConfig", "ModelConfig", "TransformerConfig"),
    "zoo.generation": ("GenerationConfig", "generate"),
    "zoo.hub": ("pull", "push"),
    "zoo.loading": ("convert_checkpoint", "load", "merge"),
    "zoo.adapters.lora": ("LoRA",),
    "zoo.plugin.hookspecs": ("hookimpl",),
    "zoo.plugin.current": ("add_plugin", "get_registry", "reset_registry", "use_registry"),
    "zoo.plugin.specs": (
        "AdapterSpec",
        "ArchitectureSpec",
        "ComponentSpec",
        "ModelSpec",
        "TokenizerSpec",
        "WeightsSource",
    ),
}

#: Submodules that ``import zoo`` made attributes before it became lazy (``zoo.errors.X``).
_SUBMODULES = (
    "api",
    "checkpoint",
    "config",
    "devices",
    "errors",
    "fields",
    "hub",
    "loading",
    "options",
    "plugin",
    "settings",
)

#: Public name (or submodule) -> where it is imported from on first use.
_LAZY = {name: f"{module}:{name}" for module, names in _EXPORTS.items() for name in names}
_LAZY |= {name: f"zoo.errors:{name}" for name in __all__ if name.endswith("Error")}
_LAZY |= {name: f"zoo.{name}" for name in _SUBMODULES}

__getattr__ = lazy_attributes(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
