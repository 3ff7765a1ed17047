"""The registry in use: built from plugins and registry files (:func:`load_registry`), one
per process (:func:`get_registry`) or per context (:func:`use_registry`).

Plugins are found through the ``zoo`` entry-point group (:class:`~zoo.plugin.host.
PluginHost`); named models come from ``registry.toml`` shipped with zoo, plus any files named
in ``ZOO_REGISTRY_PATH``. What the :class:`~zoo.plugin.registry.Registry` does with them
(conflicts, ``ZOO_PREFER``, lookups) is :mod:`zoo.plugin.registry`. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ZooError
from ..settings import Settings
from .host import Contribution, PluginHost
from .registry import Entry, Registry
from .specs import AdapterSpec, ArchitectureSpec, ComponentSpec, ModelSpec, TokenizerSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

__all__ = [
    "BUILTIN_REGISTRY",
    "Entry",
    "Registry",
    "add_plugin",
    "get_registry",
    "load_registry",
    "read_registry_file",
    "reset_registry",
    "use_registry",
]

#: Source label of the models shipped in zoo's own ``registry.toml``.
BUILTIN_REGISTRY = "registry.toml"


# -- loading --------------------------------------------------------------------------------
def read_registry_file(
    path: str | Path, *, text: str | None = None
) -> list[ModelSpec | AdapterSpec]:
    """Parse a registry TOML file (``[models.NAME]`` and ``[adapters.NAME]`` tables) into
    model and adapter specs.

    Every way a file can be bad (unreadable, not UTF-8, not TOML, nested too deeply to parse,
    an invalid entry) is a :class:`~zoo.errors.ZooError` naming the file.
    """
    try:
        if text is None:
            raw = Path(path).read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = raw.count(b"\n", 0, exc.start) + 1
                raise ZooError(
                    f"cannot read registry file {path}: it is not UTF-8 text (byte "
                    f"0x{raw[exc.start]:02x} on line {line}); save it as UTF-8"
                ) from None
        data: Mapping[str, Any] = tomllib.loads(text)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ZooError(f"cannot read registry file {path}: {exc}") from exc
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ZooError(
            f"cannot read registry file {path}: its arrays or tables are nested too deeply "
            "to parse; a registry entry needs a few levels at most"
        ) from None
    unknown = sorted(set(data) - {"models", "adapters"})
    if unknown:
        raise ZooError(
            f"registry file {path}: unknown top-level key(s) {unknown}; use [models.NAME] "
            "or [adapters.NAME]"
        )
    specs: list[ModelSpec | AdapterSpec] = []
    kinds: tuple[tuple[str, type[ModelSpec] | type[AdapterSpec]], ...] = (
        ("models", ModelSpec),
        ("adapters", AdapterSpec),
    )
    for key, kind in kinds:
        tables = data.get(key, {})
        if not isinstance(tables, Mapping):
            raise ZooError(f"registry file {path}: {key} must be tables [{key}.NAME]")
        for name, table in tables.items():
            try:
                specs.append(kind.from_toml(name, table))
            except (TypeError, ValueError, RecursionError) as exc:
                raise ZooError(f"registry file {path}: {exc}") from exc
    return specs


def load_registry(
    *,
    strict: bool | None = None,
    entry_points: bool = True,
    plugins: Mapping[str, Any] | None = None,
    registry_files: Iterable[str | Path] | None = None,
    prefer: Iterable[str] | None = None,
) -> Registry:
    """Build a registry from plugins and registry files.

    A name two sources claim never fails the load: it is a conflict, refused when it is used
    (:class:`~zoo.plugin.registry.Registry`), unless ``prefer`` names one of the sources.

    Args:
        strict: raise on the first plugin that fails (to import, in a hook, or in its
            architecture's classes) and on a registry file that cannot be read (default:
            ``ZOO_STRICT_PLUGINS``); otherwise each is recorded and the rest load.
        entry_points: discover plugins through the ``zoo`` entry-point group.
        plugins: extra plugin objects by name (tests and embedding applications).
        registry_files: extra registry files; by default those in ``ZOO_REGISTRY_PATH``.
            One that cannot be read is recorded in ``registry.problems`` (``zoo plugins``
            shows it) and the rest still load; in strict mode it raises.
        prefer: sources that win a name conflict (default: ``ZOO_PREFER``).
    """
    settings = Settings.from_env()
    strict = settings.strict_plugins if strict is None else strict
    prefer = settings.prefer if prefer is None else tuple(prefer)
    host = PluginHost(strict=strict)
    from . import components  # the built-in components: always there, as plugin "zoo"

    host.register(components, name="zoo")
    if entry_points:
        host.load_entry_points()
    for name, plugin in (plugins or {}).items():
        host.register(plugin, name=name)
    contributions = host.collect()

    registry = Registry(strict=strict, prefer=prefer)
    registry.plugins = host.plugins
    _add_specs(registry, contributions)
    builtin = resources.files("zoo").joinpath("registry.toml")
    for spec in read_registry_file(BUILTIN_REGISTRY, text=builtin.read_text(encoding="utf-8")):
        registry.add_named(spec, BUILTIN_REGISTRY)
    for c in contributions:
        if isinstance(c.spec, (ModelSpec, AdapterSpec)):
            registry.add_named(c.spec, f"plugin {c.plugin}")
    files = settings.registry_path if registry_files is None else registry_files
    _add_files(registry, files, strict=strict)
    return registry


def _add_specs(registry: Registry, contributions: Iterable[Contribution]) -> None:
    """The plugins' architectures, tokenizers and components (their models come after
    ``registry.toml``'s)."""
    for c in contributions:
        source = f"plugin {c.plugin}"
        if isinstance(c.spec, ArchitectureSpec):
            registry.add_architecture(c.spec, source)
        elif isinstance(c.spec, TokenizerSpec):
            registry.add_tokenizer(c.spec, source)
        elif isinstance(c.spec, ComponentSpec):
            registry.add_component(c.spec, source)


def _add_files(registry: Registry, files: Iterable[str | Path], *, strict: bool) -> None:
    """The named models of each registry file; one that cannot be read is a problem of its
    own (raised in strict mode)."""
    for path in files:
        try:
            specs = read_registry_file(path)
        except ZooError as exc:
            if strict:
                raise
            registry.problems.append((str(path), str(exc)))
            continue
        for spec in specs:
            registry.add_named(spec, str(path))


_default: Registry | None = None
#: Plugin objects added to this process by :func:`add_plugin`, by name.
_added: dict[str, Any] = {}


#: The registry :func:`use_registry` put in place for the current context, if any.
_in_use: contextvars.ContextVar[Registry | None] = contextvars.ContextVar(
    "zoo_registry", default=None
)


def get_registry() -> Registry:
    """The registry in use: the one :func:`use_registry` gave, else the process-wide one,
    loaded on first use."""
    global _default
    chosen = _in_use.get()
    if chosen is not None:
        return chosen
    if _default is None:
        _default = load_registry(plugins=_added)
    return _default


@contextlib.contextmanager
def use_registry(registry: Registry) -> Iterator[Registry]:
    """Make ``registry`` the one every zoo call in this context (thread, task) uses, until
    the block ends: a registry of one's own plugins for an application or a test, without
    touching the process-wide one::

        with zoo.use_registry(zoo.plugin.current.load_registry(plugins={"mine": my_plugin})):
            model = zoo.build("my-model")
    """
    token = _in_use.set(registry)
    try:
        yield registry
    finally:
        _in_use.reset(token)


def add_plugin(plugin: Any, *, name: str) -> None:
    """Register a plugin object (a module or an object with ``@zoo.hookimpl`` methods) in
    this process, next to the installed ones: for a notebook or an application that defines
    its models in code rather than in a package. The registry reloads on next use; a name or
    spec already taken is reported like any plugin failure or conflict."""
    _added[name] = plugin
    reset_registry()


def reset_registry() -> None:
    """Forget the process-wide registry so the next use reloads plugins (e.g. after an
    install)."""
    global _default
    _default = None
