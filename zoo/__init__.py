"""zoo: a plugin-based model zoo for PyTorch.

    >>> import zoo
    >>> zoo.list_models()
    ['gpt1', 'gpt2-124m', 'transformer-encdec', 'transformer-encdec-tiny', 'wiki-gpt-wordpiece']
    >>> model = zoo.build("gpt2-124m")

Importing zoo does not import torch; :func:`build` does.
"""

from __future__ import annotations

from .api import ModelInfo, build, info, list_models, plugins, resolve_config, tokenizer
from .config import DecoderConfig, ModelConfig, TransformerConfig
from .errors import (
    ConfigError,
    PluginError,
    RegistryConflictError,
    UnknownArchitectureError,
    UnknownModelError,
    ZooError,
)
from .hookspecs import hookimpl
from .registry import get_registry, reset_registry
from .specs import ArchitectureSpec, ModelSpec, TokenizerSpec, WeightsSource

__version__ = "0.1.0"

__all__ = [
    "ArchitectureSpec",
    "ConfigError",
    "DecoderConfig",
    "ModelConfig",
    "ModelInfo",
    "ModelSpec",
    "PluginError",
    "RegistryConflictError",
    "TokenizerSpec",
    "TransformerConfig",
    "UnknownArchitectureError",
    "UnknownModelError",
    "WeightsSource",
    "ZooError",
    "__version__",
    "build",
    "get_registry",
    "hookimpl",
    "info",
    "list_models",
    "plugins",
    "reset_registry",
    "resolve_config",
    "tokenizer",
]
