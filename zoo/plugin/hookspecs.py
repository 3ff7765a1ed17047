"""The plugin contract: every hook a zoo plugin may implement.

A plugin is a module (or object) with functions decorated by :data:`hookimpl` and named after
these specs, made known through the ``zoo`` entry-point group; a family declared with
:func:`~zoo.plugin.family.declare_family` is such an object::

    # pyproject.toml of a plugin distribution
    [project.entry-points.zoo]
    my_plugin = "my_package.zoo_plugin"
    my_family = "my_package.family_plugin:family"

Hooks are called with keyword arguments only and return frozen spec objects; they never
mutate zoo's state. Keep the hook module light (no torch import at module level): name model
and config classes by lazy ``"module:Class"`` strings so that ``zoo list`` stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence

import pluggy

from .specs import AdapterSpec, ArchitectureSpec, ComponentSpec, ModelSpec, TokenizerSpec

__all__ = ["hookimpl", "hookspec"]

PROJECT = "zoo"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorator for plugin hook implementations: ``@zoo.hookimpl``.
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def zoo_architectures() -> Sequence[ArchitectureSpec]:
    """Return the architectures this plugin supplies (name, config class, model class, blocks,
    checkpoint layouts)."""


@hookspec
def zoo_models() -> Sequence[ModelSpec]:
    """Return named models this plugin adds (in addition to those in ``registry.toml``, where
    all of zoo's own live; a registry file of the plugin's own says the same as data)."""


@hookspec
def zoo_adapters() -> Sequence[AdapterSpec]:
    """Return named LoRA adapters this plugin adds: each a pinned Hub repo and the named base
    model it applies to (a registry file's ``[adapters.NAME]`` tables say the same as data)."""


@hookspec
def zoo_tokenizers() -> Sequence[TokenizerSpec]:
    """Return the tokenizers this plugin supplies, by name."""


@hookspec
def zoo_components() -> Sequence[ComponentSpec]:
    """Return the components this plugin supplies (position schemes, norms, feed-forwards,
    attention variants), by kind and name."""
