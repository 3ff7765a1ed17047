"""Plugin discovery and isolation.

Plugins (built-in and third-party alike) are found through the ``zoo`` entry-point group,
loaded once, and asked for their specs hook by hook. An entry point names a module whose
functions are marked ``@zoo.hookimpl`` (``toy = "zoo_toy"``) or an object with such methods,
such as the family :func:`~zoo.plugin.family.declare_family` returns (``qwen2 =
"zoo_plugins.qwen2:family"``). A plugin that fails to import, implements no hook, misspells a
hook, or whose hook raises (anything but ``KeyboardInterrupt``, ``SystemExit`` included) or
returns the wrong thing is recorded as failed with the reason;
everything else keeps working. Strict mode (``strict=True`` or ``ZOO_STRICT_PLUGINS=1``) turns
the first failure into a :class:`~zoo.errors.PluginError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import Any, Literal

import pluggy

from ..errors import PluginError
from . import hookspecs
from .family import Family
from .specs import (
    AdapterSpec,
    ArchitectureSpec,
    ComponentSpec,
    ModelSpec,
    TokenizerSpec,
    describe_exception,
)

__all__ = ["ENTRY_POINT_GROUP", "Contribution", "PluginHost", "PluginInfo"]

ENTRY_POINT_GROUP = "zoo"

#: hook name -> the spec type each returned item must be.
HOOKS: dict[str, type] = {
    "zoo_architectures": ArchitectureSpec,
    "zoo_models": ModelSpec,
    "zoo_tokenizers": TokenizerSpec,
    "zoo_components": ComponentSpec,
    "zoo_adapters": AdapterSpec,
}


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    """One plugin as ``zoo plugins`` shows it."""

    name: str
    module: str
    distribution: str | None
    status: Literal["ok", "failed"]
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Contribution:
    """One spec and the plugin that supplied it."""

    plugin: str
    spec: ArchitectureSpec | ModelSpec | TokenizerSpec | ComponentSpec | AdapterSpec


_reason = describe_exception


class PluginHost:
    """Loads plugins into a pluggy manager and collects their specs, isolating failures."""

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._infos: dict[str, PluginInfo] = {}

    @property
    def plugins(self) -> list[PluginInfo]:
        """Every plugin seen, loaded or failed."""
        return list(self._infos.values())

    def _fail(self, name: str, module: str, dist: str | None, reason: str) -> None:
        self._infos[name] = PluginInfo(name, module, dist, "failed", reason)
        if self.strict:
            raise PluginError(
                f"plugin {name!r} ({module}) failed: {reason}. "
                "Unset ZOO_STRICT_PLUGINS to load the other plugins anyway."
            )

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Import every plugin advertised in the entry-point ``group`` and register it."""
        seen: set[str] = set()
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            if ep.name in seen:  # the same distribution visible twice on sys.path
                continue
            seen.add(ep.name)
            self._load_entry_point(ep)

    def _load_entry_point(self, ep: EntryPoint) -> None:
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else None
        try:
            plugin = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit too: a plugin cannot end zoo
            self._fail(ep.name, ep.value, dist, f"import failed: {_reason(exc)}")
            return
        self.register(plugin, name=ep.name, distribution=dist, source=ep.value)

    def register(
        self, plugin: Any, *, name: str, distribution: str | None = None, source: str | None = None
    ) -> None:
        """Register a plugin object: a module or any object with hook implementations (a
        :class:`~zoo.plugin.family.Family` among them). ``source`` is how it was named (an
        entry point's ``"module:attr"``; default: the module's name). One that implements
        no hook is recorded as failed: it would supply nothing, silently."""
        module = source or str(getattr(plugin, "__name__", type(plugin).__name__))
        if name in self._infos or self._pm.has_plugin(name):
            self._fail(name, module, distribution, f"a plugin named {name!r} is already loaded")
            return
        try:
            self._pm.register(plugin, name=name)
            self._pm.check_pending()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            if self._pm.has_plugin(name):
                self._pm.unregister(name=name)
            self._fail(name, module, distribution, f"invalid hooks: {exc}")
            return
        if not self._pm.get_hookcallers(plugin):
            self._pm.unregister(name=name)
            self._fail(name, module, distribution, _no_hooks(plugin, module))
            return
        self._infos[name] = PluginInfo(name, module, distribution, "ok")

    def collect(self) -> list[Contribution]:
        """Call every hook of every loaded plugin, one plugin at a time, and return the specs."""
        contributions: list[Contribution] = []
        for hook_name, spec_type in HOOKS.items():
            caller = getattr(self._pm.hook, hook_name)
            for impl in caller.get_hookimpls():  # registration order
                name = impl.plugin_name
                if self._infos[name].status != "ok":
                    continue
                try:
                    result = impl.function()
                    specs = _check_result(hook_name, spec_type, result)
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:
                    info = self._infos[name]
                    self._pm.unregister(name=name)
                    contributions = [c for c in contributions if c.plugin != name]
                    self._fail(name, info.module, info.distribution, f"{hook_name}: {_reason(exc)}")
                    continue
                contributions.extend(Contribution(name, spec) for spec in specs)
        return contributions


def _no_hooks(plugin: Any, module: str) -> str:
    """Why a plugin that implements no hook fails, and what its entry point should name."""
    said = f"{module} implements none of zoo's hooks ({', '.join(HOOKS)})"
    if isinstance(plugin, ModuleType):
        declared = [n for n, value in vars(plugin).items() if isinstance(value, Family)]
        if declared:
            return (
                f"{said}; it declares the family {declared[0]!r}: name that object in the entry "
                f"point, {f'{module}:{declared[0]}'!r} (an install whose entry point names the "
                "module predates that form: reinstall the distribution)"
            )
    return (
        f"{said}; an entry point names a module whose functions are marked @zoo.hookimpl, "
        "or the family that zoo.plugin.family.declare_family returns ('package.module:family')"
    )


def _check_result(hook_name: str, spec_type: type, result: Any) -> Sequence[Any]:
    if result is None:
        return ()
    if not isinstance(result, Iterable) or isinstance(result, (str, bytes)):
        raise TypeError(f"must return a list of {spec_type.__name__}, got {type(result).__name__}")
    items = list(result)
    for item in items:
        if not isinstance(item, spec_type):
            raise TypeError(
                f"must return {spec_type.__name__} objects, got {type(item).__name__} {item!r}"
            )
    return items
