"""The parts a model is built from, resolved before it is built.

A config names its components (``positions = "rotary"``, ``ffn = "swiglu"``...); a classifier
config names its body's architecture. ``zoo.nn`` never looks a name up itself: a model is
built from its config *and* a :class:`Parts` that says what each name stands for::

    model = DecoderLM(config, parts)

``zoo.build`` and ``zoo.load`` pass the parts the registry resolved once from the config
(plugins' components included, :meth:`zoo.plugin.current.Registry.parts`). Built directly without
parts, a model gets :meth:`Parts.builtin`: the components that come with ``zoo.nn``.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from .._lazy import resolve
from ..catalog import BUILTIN
from ..errors import ConfigError, PluginContractError
from . import positions

__all__ = [
    "BUILTIN_COMPONENTS",
    "ComponentFactory",
    "Parts",
    "builtin_factories",
    "make_positions",
    "parts_for",
]

#: Builds a component for a model's whole config (it reads the fields it needs); a block's
#: factory also takes the :class:`Parts` and the layer index, ``factory(config, parts, layer)``.
ComponentFactory = Callable[..., nn.Module]


def builtin_factories(kind: str) -> Mapping[str, ComponentFactory]:
    """The factories of the built-in ``kind`` components (:data:`zoo.catalog.BUILTIN`), by
    name."""
    return types.MappingProxyType({c.name: resolve(c.reference) for c in BUILTIN if c.kind == kind})


#: The components that come with ``zoo.nn``, by kind and name (registered as plugin ``zoo``);
#: the blocks they are assembled into are :data:`zoo.nn.blocks.BUILTIN_BLOCKS`.
BUILTIN_COMPONENTS: Mapping[str, Mapping[str, ComponentFactory]] = types.MappingProxyType(
    {
        kind: builtin_factories(kind)
        for kind in dict.fromkeys(c.kind for c in BUILTIN if c.kind != "block")
    }
)


def _no_architectures(name: str) -> tuple[Any, Callable[[Any], nn.Module]]:
    raise ConfigError(
        f"architecture {name!r} is looked up in the registry: build this model with "
        "zoo.build(...) or zoo.load(...), which resolve it, or pass parts=..."
    )


@dataclasses.dataclass(frozen=True)
class Parts:
    """What the names in one config stand for.

    Args:
        components: component kind -> the factory of the component the config names.
        architecture: architecture name -> ``(config class, build)``, where ``build(config)``
            makes a model of it with its own parts (a classifier's body).
    """

    components: Mapping[str, ComponentFactory]
    architecture: Callable[[str], tuple[Any, Callable[[Any], nn.Module]]] = _no_architectures

    @classmethod
    def builtin(
        cls,
        config: Any,
        tables: Mapping[str, Mapping[str, ComponentFactory]] = BUILTIN_COMPONENTS,
    ) -> Parts:
        """The built-in components ``config`` names (from ``tables``); a component only a
        plugin supplies is a :class:`~zoo.errors.ConfigError` saying to build through
        ``zoo.build``."""
        found: dict[str, ComponentFactory] = {}
        for kind, table in tables.items():
            name = getattr(config, kind, None)
            if name is None:
                continue
            if name not in table:
                raise ConfigError(
                    f"{type(config).__name__}.{kind}: {kind} component {name!r} is not built "
                    f"into zoo.nn ({', '.join(sorted(table))}); a plugin's component is "
                    "resolved by zoo.build(...) / zoo.load(...), or pass parts=..."
                )
            found[kind] = table[name]
        return cls(found)

    def with_builtin(self, kind: str, table: Mapping[str, ComponentFactory], config: Any) -> Parts:
        """These parts, plus the built-in ``kind`` component ``config`` names where none was
        resolved (a model built directly, without the registry)."""
        if kind in self.components:
            return self
        extra = Parts.builtin(config, {kind: table}).components
        return dataclasses.replace(self, components={**self.components, **extra})

    def build(self, kind: str, config: Any) -> nn.Module:
        """The ``kind`` component for ``config``."""
        return self._make(kind, config)

    def block(self, config: Any, layer: int) -> nn.Module:
        """Layer ``layer``'s block: the ``block`` component ``config`` names, built as
        ``factory(config, parts, layer)``."""
        return self._make("block", config, self, layer)

    def stack(self, config: Any, n_layers: int) -> nn.ModuleList:
        """``n_layers`` blocks, each told its index."""
        return nn.ModuleList(self.block(config, layer) for layer in range(n_layers))

    def _make(self, kind: str, config: Any, *args: Any) -> nn.Module:
        try:
            factory = self.components[kind]
        except KeyError:
            raise ConfigError(f"no {kind} component was resolved for this model") from None
        module = factory(config, *args)
        if not isinstance(module, nn.Module):
            raise PluginContractError(
                f"{kind} component {getattr(config, kind, '?')!r}: its factory returned "
                f"{type(module).__name__}, not a torch.nn.Module"
            )
        return module


def parts_for(config: Any, parts: Parts | None) -> Parts:
    """``parts``, or the built-in ones ``config`` names."""
    return parts if parts is not None else Parts.builtin(config)


def make_positions(config: Any, parts: Parts | None = None) -> positions.PositionScheme:
    """The position scheme ``config.positions`` names."""
    scheme = parts_for(config, parts).build("positions", config)
    if not isinstance(scheme, positions.PositionScheme):
        raise PluginContractError(
            f"positions component {config.positions!r} built a {type(scheme).__name__}, "
            "not a zoo.nn.PositionScheme"
        )
    return scheme
