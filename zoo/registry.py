"""The registry: architectures, named models and tokenizers, and who supplied each.

A :class:`Registry` is an object filled from plugins (through :class:`~zoo.plugins.PluginHost`)
and registry files (``registry.toml`` shipped with zoo, plus any files named in
``ZOO_REGISTRY_PATH``). It refuses conflicts: when two sources claim one name, that name
becomes unusable and looking it up raises :class:`~zoo.errors.RegistryConflictError` naming
both sources (strict mode raises while loading). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from .errors import (
    RegistryConflictError,
    UnknownArchitectureError,
    UnknownModelError,
    ZooError,
)
from .plugins import PluginHost, PluginInfo, strict_from_env
from .specs import ArchitectureSpec, ModelSpec, TokenizerSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

__all__ = [
    "BUILTIN_REGISTRY",
    "Entry",
    "Registry",
    "get_registry",
    "load_registry",
    "read_registry_file",
    "reset_registry",
]

S = TypeVar("S", ArchitectureSpec, ModelSpec, TokenizerSpec)
Kind = Literal["architecture", "model", "tokenizer"]

#: Source label of the models shipped in zoo's own ``registry.toml``.
BUILTIN_REGISTRY = "registry.toml"


@dataclasses.dataclass(frozen=True)
class Entry(Generic[S]):
    """A registered spec and where it came from (``"plugin gpt2"``, ``"registry.toml"``...)."""

    spec: S
    source: str


class Registry:
    """Architectures, named models (with aliases) and tokenizers, each with its source."""

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self._tables: dict[Kind, dict[str, Entry[Any]]] = {
            "architecture": {},
            "model": {},
            "tokenizer": {},
        }
        self._aliases: dict[str, str] = {}
        self._conflicts: dict[tuple[Kind, str], list[str]] = {}
        self.plugins: list[PluginInfo] = []

    # -- filling ----------------------------------------------------------------------------
    def _claim(self, kind: Kind, name: str, source: str) -> bool:
        """Return whether ``name`` is free for ``source``; record a conflict otherwise."""
        key = (kind, name)
        if key in self._conflicts:
            self._conflicts[key].append(source)
            return False
        taken = self._tables[kind].get(name)
        if taken is None and kind == "model" and name in self._aliases:
            taken = self._tables["model"][self._aliases[name]]
        if taken is None:
            return True
        self._conflicts[key] = [taken.source, source]
        self._tables[kind].pop(name, None)
        if self.strict:
            raise RegistryConflictError(self._conflict_message(kind, name))
        return False

    def _conflict_message(self, kind: Kind, name: str) -> str:
        sources = self._conflicts[(kind, name)]
        return (
            f"{kind} name {name!r} is claimed by more than one source: {' and '.join(sources)}. "
            "Uninstall or rename one of them; zoo never picks a winner silently."
        )

    def add_architecture(self, spec: ArchitectureSpec, source: str) -> None:
        """Register an architecture; a name already taken becomes a conflict."""
        if self._claim("architecture", spec.name, source):
            self._tables["architecture"][spec.name] = Entry(spec, source)

    def add_tokenizer(self, spec: TokenizerSpec, source: str) -> None:
        """Register a tokenizer; a name already taken becomes a conflict."""
        if self._claim("tokenizer", spec.name, source):
            self._tables["tokenizer"][spec.name] = Entry(spec, source)

    def add_model(self, spec: ModelSpec, source: str) -> None:
        """Register a named model and its aliases; a name already taken becomes a conflict."""
        if not self._claim("model", spec.name, source):
            return
        self._tables["model"][spec.name] = Entry(spec, source)
        for alias in spec.aliases:
            if self._claim("model", alias, source):
                self._aliases[alias] = spec.name

    # -- lookup -----------------------------------------------------------------------------
    def _unknown(self, kind: Kind, name: str, candidates: Iterable[str]) -> str:
        candidates = sorted(candidates)
        close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        return f"unknown {kind} {name!r}.{hint} Known: {', '.join(candidates) or 'none'}."

    def _entry(self, kind: Kind, name: str) -> Entry[Any]:
        if (kind, name) in self._conflicts:
            raise RegistryConflictError(self._conflict_message(kind, name))
        if kind == "model":
            name = self._aliases.get(name, name)
        entry = self._tables[kind].get(name)
        if entry is not None:
            return entry
        if kind == "model":
            names = list(self._tables["model"]) + list(self._aliases)
            raise UnknownModelError(
                self._unknown(kind, name, names) + " Run `zoo list` to see every named model."
            )
        message = self._unknown(kind, name, self._tables[kind])
        if kind == "architecture":
            failed = [p.name for p in self.plugins if p.status == "failed"]
            if failed:
                message += f" Plugins that failed to load: {', '.join(failed)} (see `zoo plugins`)."
            else:
                message += " Install the plugin that provides it."
            raise UnknownArchitectureError(message)
        raise ZooError(message)

    def architecture(self, name: str) -> ArchitectureSpec:
        """The architecture called ``name``."""
        return self._entry("architecture", name).spec

    def model(self, name: str) -> ModelSpec:
        """The named model called ``name`` (or with that alias)."""
        return self._entry("model", name).spec

    def tokenizer(self, name: str) -> TokenizerSpec:
        """The tokenizer called ``name``."""
        return self._entry("tokenizer", name).spec

    def source(self, kind: Kind, name: str) -> str:
        """Where the ``kind`` called ``name`` was registered from."""
        return self._entry(kind, name).source

    def architectures(self) -> list[str]:
        """Names of the registered architectures, sorted."""
        return sorted(self._tables["architecture"])

    def tokenizers(self) -> list[str]:
        """Names of the registered tokenizers, sorted."""
        return sorted(self._tables["tokenizer"])

    def models(self, *, include_unavailable: bool = False) -> list[str]:
        """Names of the named models, sorted; by default only those whose architecture is
        installed."""
        names = self._tables["model"]
        if include_unavailable:
            return sorted(names)
        archs = self._tables["architecture"]
        return sorted(n for n, e in names.items() if e.spec.architecture in archs)

    def supplied_by(self, source: str) -> dict[str, list[str]]:
        """What ``source`` (e.g. ``"plugin gpt2"``) registered, by kind."""
        return {
            kind: sorted(name for name, entry in table.items() if entry.source == source)
            for kind, table in self._tables.items()
        }

    @property
    def conflicts(self) -> dict[str, list[str]]:
        """``"kind name"`` -> the sources that claim it."""
        return {f"{kind} {name}": list(srcs) for (kind, name), srcs in self._conflicts.items()}

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._tables["model"] or name in self._aliases)


# -- loading --------------------------------------------------------------------------------
def read_registry_file(path: str | Path, *, text: str | None = None) -> list[ModelSpec]:
    """Parse a registry TOML file (``[models.NAME]`` tables) into model specs."""
    try:
        data: Mapping[str, Any] = tomllib.loads(
            text if text is not None else Path(path).read_text()
        )
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ZooError(f"cannot read registry file {path}: {exc}") from exc
    unknown = sorted(set(data) - {"models"})
    if unknown:
        raise ZooError(
            f"registry file {path}: unknown top-level key(s) {unknown}; use [models.NAME]"
        )
    specs = []
    for name, table in data.get("models", {}).items():
        try:
            specs.append(ModelSpec.from_toml(name, table))
        except (TypeError, ValueError) as exc:
            raise ZooError(f"registry file {path}: {exc}") from exc
    return specs


def _user_registry_files() -> list[Path]:
    value = os.environ.get("ZOO_REGISTRY_PATH", "")
    return [Path(p) for p in value.split(os.pathsep) if p]


def load_registry(
    *,
    strict: bool | None = None,
    entry_points: bool = True,
    plugins: Mapping[str, Any] | None = None,
    registry_files: Iterable[str | Path] | None = None,
) -> Registry:
    """Build a registry from plugins and registry files.

    Args:
        strict: raise on the first plugin failure or conflict (default: ``ZOO_STRICT_PLUGINS``).
        entry_points: discover plugins through the ``zoo`` entry-point group.
        plugins: extra plugin objects by name (tests and embedding applications).
        registry_files: extra registry files; by default those in ``ZOO_REGISTRY_PATH``.
    """
    strict = strict_from_env() if strict is None else strict
    host = PluginHost(strict=strict)
    if entry_points:
        host.load_entry_points()
    for name, plugin in (plugins or {}).items():
        host.register(plugin, name=name)
    contributions = host.collect()

    registry = Registry(strict=strict)
    registry.plugins = host.plugins
    for c in contributions:
        source = f"plugin {c.plugin}"
        if isinstance(c.spec, ArchitectureSpec):
            registry.add_architecture(c.spec, source)
        elif isinstance(c.spec, TokenizerSpec):
            registry.add_tokenizer(c.spec, source)
    builtin = resources.files("zoo").joinpath("registry.toml")
    for spec in read_registry_file(BUILTIN_REGISTRY, text=builtin.read_text(encoding="utf-8")):
        registry.add_model(spec, BUILTIN_REGISTRY)
    for c in contributions:
        if isinstance(c.spec, ModelSpec):
            registry.add_model(c.spec, f"plugin {c.plugin}")
    files = _user_registry_files() if registry_files is None else registry_files
    for path in files:
        for spec in read_registry_file(path):
            registry.add_model(spec, str(path))
    return registry


_default: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _default
    if _default is None:
        _default = load_registry()
    return _default


def reset_registry() -> None:
    """Forget the process-wide registry so the next use reloads plugins (e.g. after an
    install)."""
    global _default
    _default = None
