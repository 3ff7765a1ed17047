"""Exceptions raised by zoo. Every one says what was wrong and how to fix it."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "PluginError",
    "RegistryConflictError",
    "UnknownArchitectureError",
    "UnknownModelError",
    "ZooError",
]


class ZooError(Exception):
    """Base class of every error zoo raises on purpose."""


class ConfigError(ZooError, ValueError):
    """A config field is unknown, missing, of the wrong type or out of range."""


class UnknownModelError(ZooError, KeyError):
    """No named model (or alias) with that name is registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownArchitectureError(ZooError, KeyError):
    """No installed plugin supplies that architecture."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RegistryConflictError(ZooError):
    """Two sources claim the same architecture or model name."""


class PluginError(ZooError):
    """A plugin failed to load or its hook raised (raised in strict mode only)."""
