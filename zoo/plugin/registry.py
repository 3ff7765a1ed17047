"""The registry object: architectures, named models, tokenizers and components, and who
supplied each.

A :class:`Registry` is filled from plugins (through :class:`~zoo.plugin.host.PluginHost`)
and registry files by :func:`zoo.plugin.current.load_registry`. It refuses conflicts: when
two sources claim one name, that name becomes unusable and looking it up raises
:class:`~zoo.errors.RegistryConflictError` naming both sources and how to resolve it, unless
``ZOO_PREFER`` names the source to use. Everything else keeps working. Nothing here imports
torch.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from ..config import ModelConfig
from ..errors import (
    ConfigError,
    PluginError,
    RegistryConflictError,
    UnknownArchitectureError,
    UnknownModelError,
    ZooError,
)
from .host import PluginInfo
from .specs import (
    COMPONENT_KINDS,
    AdapterSpec,
    ArchitectureSpec,
    ComponentSpec,
    ModelSpec,
    TokenizerSpec,
)

if TYPE_CHECKING:
    from ..nn.parts import Parts

__all__ = ["Entry", "Kind", "Registry"]

S = TypeVar("S", ArchitectureSpec, ModelSpec, TokenizerSpec, ComponentSpec, AdapterSpec)
#: What the registry holds: architectures, models, tokenizers, and the components of
#: :data:`zoo.plugin.specs.COMPONENT_KINDS` (each kind its own namespace).
Kind = Literal[
    "architecture",
    "model",
    "adapter",
    "tokenizer",
    "positions",
    "norm",
    "ffn",
    "attention",
    "cross_attention",
    "block",
]


@dataclasses.dataclass(frozen=True)
class Entry(Generic[S]):
    """A registered spec and where it came from (``"plugin gpt2"``, ``"registry.toml"``...)."""

    spec: S
    source: str


def _matches(source: str, preferred: str) -> bool:
    """Whether a ``ZOO_PREFER`` item names ``source``: a plugin by its name (``"dup"`` or
    ``"plugin dup"``), ``"registry.toml"`` for zoo's own entries, or a registry file's path."""
    return preferred in (source, source.removeprefix("plugin "))


class Registry:
    """Architectures, named models (with aliases) and tokenizers, each with its source.

    Every claim on a name is kept. A name claimed by one source resolves to it; a name claimed
    by several is a conflict, unusable (with an error naming every claimant) unless ``prefer``
    names one of the claimants: zoo never picks a winner silently.

    Args:
        strict: plugin failures raise while loading (conflicts raise only when used, as
            they always do).
        prefer: sources that win a conflict, most preferred first (``ZOO_PREFER``).
    """

    def __init__(self, *, strict: bool = False, prefer: Iterable[str] = ()) -> None:
        self.strict = strict
        self.prefer = tuple(prefer)
        kinds: tuple[Kind, ...] = (
            "architecture",
            "model",
            "adapter",
            "tokenizer",
            *COMPONENT_KINDS,
        )  # type: ignore[assignment]
        self._claims: dict[Kind, dict[str, list[Entry[Any]]]] = {kind: {} for kind in kinds}
        #: alias -> the (model name, source) pairs that claim it
        self._alias_claims: dict[str, list[tuple[str, str]]] = {}
        self.plugins: list[PluginInfo] = []
        #: Registry files that could not be read: ``(path, reason)``.
        self.problems: list[tuple[str, str]] = []

    # -- filling ----------------------------------------------------------------------------
    def add_architecture(self, spec: ArchitectureSpec, source: str) -> None:
        """Register an architecture; a name claimed twice becomes a conflict."""
        self._claims["architecture"].setdefault(spec.name, []).append(Entry(spec, source))

    def add_tokenizer(self, spec: TokenizerSpec, source: str) -> None:
        """Register a tokenizer; a name claimed twice becomes a conflict."""
        self._claims["tokenizer"].setdefault(spec.name, []).append(Entry(spec, source))

    def add_component(self, spec: ComponentSpec, source: str) -> None:
        """Register a component; a name claimed twice within its kind becomes a conflict."""
        self._claims[spec.kind].setdefault(spec.name, []).append(Entry(spec, source))  # type: ignore[index]

    def add_model(self, spec: ModelSpec, source: str) -> None:
        """Register a named model and its aliases; a name claimed twice becomes a conflict."""
        self._claims["model"].setdefault(spec.name, []).append(Entry(spec, source))
        for alias in dict.fromkeys(spec.aliases):  # an alias listed twice is one claim
            self._alias_claims.setdefault(alias, []).append((spec.name, source))

    def add_adapter(self, spec: AdapterSpec, source: str) -> None:
        """Register a named adapter. Its name shares the models' namespace: a name a model (or
        an alias) and an adapter both claim is a conflict, as between two models."""
        self._claims["adapter"].setdefault(spec.name, []).append(Entry(spec, source))

    def add_named(self, spec: ModelSpec | AdapterSpec, source: str) -> None:
        """Register a named model or a named adapter."""
        if isinstance(spec, AdapterSpec):
            self.add_adapter(spec, source)
        else:
            self.add_model(spec, source)

    def verify_architectures(self) -> None:
        """Import every architecture's config and model class now (they are imported lazily,
        on first use). A plugin whose architecture cannot be imported (its module raises, the
        class is missing or breaks the contract) is marked failed with the reason and its
        specs are withdrawn, as when one of its hooks raises; in strict mode that raises a
        :class:`~zoo.errors.PluginError`. ``zoo plugins`` and ``zoo tour`` call this."""
        for entries in list(self._claims["architecture"].values()):
            for entry in list(entries):
                try:
                    entry.spec.config_class  # noqa: B018 - imported for the check
                    entry.spec.model_class  # noqa: B018
                except PluginError as exc:
                    self._withdraw(entry.source, str(exc))

    def _withdraw(self, source: str, reason: str) -> None:
        """Mark the plugin behind ``source`` failed and forget everything it supplied."""
        name = source.removeprefix("plugin ")
        self.plugins = [
            dataclasses.replace(p, status="failed", error=reason) if p.name == name else p
            for p in self.plugins
        ]
        if self.strict:
            raise PluginError(
                f"plugin {name!r} failed: {reason}. "
                "Unset ZOO_STRICT_PLUGINS to load the other plugins anyway."
            )
        for table in self._claims.values():
            for claimed, entries in list(table.items()):
                kept = [e for e in entries if e.source != source]
                if kept:
                    table[claimed] = kept
                else:
                    del table[claimed]
        for alias, claims in list(self._alias_claims.items()):
            kept_aliases = [c for c in claims if c[1] != source]
            if kept_aliases:
                self._alias_claims[alias] = kept_aliases
            else:
                del self._alias_claims[alias]

    # -- resolution -------------------------------------------------------------------------
    def _claimants(self, kind: Kind, name: str) -> list[str]:
        """Every source claiming ``name`` (an alias counts as a claim on its name)."""
        sources = [e.source for e in self._claims[kind].get(name, [])]
        if kind == "model":
            sources += [src for _, src in self._alias_claims.get(name, [])]
        if kind in ("model", "adapter"):  # one namespace: models, their aliases, adapters
            sources += self._other_namespace(kind, name)
        return sources

    def _other_namespace(self, kind: Kind, name: str) -> list[str]:
        """The sources claiming ``name`` in the other half of the shared namespace: adapters
        for a model's name, models and aliases for an adapter's."""
        if kind == "model":
            return [e.source for e in self._claims["adapter"].get(name, [])]
        models = [e.source for e in self._claims["model"].get(name, [])]
        return models + [src for _, src in self._alias_claims.get(name, [])]

    def _preferred(self, sources: list[str]) -> str | None:
        """The source ``prefer`` picks among ``sources``, if it names exactly one."""
        for wanted in self.prefer:
            picked = [s for s in sources if _matches(s, wanted)]
            if len(picked) == 1:
                return picked[0]
        return None

    def preferred_source(self, sources: Iterable[str]) -> str | None:
        """The one of ``sources`` that ``ZOO_PREFER`` picks (``None``: it names none of them,
        or several equally). For choices made outside the registry's names: two plugins'
        layouts reading one Hugging Face ``model_type``."""
        return self._preferred(list(sources))

    def conflict_message(self, kind: Kind, name: str) -> str:
        """What is in conflict, who claims it, and how to resolve it."""
        sources = self._claimants(kind, name)
        plugin = next((s.removeprefix("plugin ") for s in sources if s.startswith("plugin ")), "")
        example = plugin or sources[0]
        return (
            f"{kind} name {name!r} is claimed by more than one source: {' and '.join(sources)}. "
            "zoo never picks a winner silently: uninstall one of them, or pin the source with "
            f"ZOO_PREFER (e.g. ZOO_PREFER={example}); `zoo plugins` lists every conflict."
        )

    def _pick(self, kind: Kind, name: str) -> Entry[Any] | None:
        """The entry ``name`` resolves to, ``None`` when unclaimed; raises on a conflict."""
        entries = self._claims[kind].get(name, [])
        sources = self._claimants(kind, name)
        if len(sources) <= 1:
            return entries[0] if entries else None
        chosen = self._preferred(sources)
        winner = next((e for e in entries if e.source == chosen), None)
        if winner is None and kind == "adapter" and chosen is not None:
            return None  # the preferred claim is a model's
        if winner is None and kind == "model" and chosen in self._other_namespace(kind, name):
            return None  # the preferred claim is an adapter's
        if winner is None:
            raise RegistryConflictError(self.conflict_message(kind, name))
        return winner

    def _model_entry(self, name: str) -> Entry[Any] | None:
        """Resolve a model name or alias; an alias leads to its model's own resolution. A
        name an adapter claims too is a conflict, or ``None`` when the adapter is preferred."""
        if self.is_adapter(name):
            return None
        aliased = self._alias_claims.get(name, [])
        if aliased and name not in self._claims["model"]:
            targets = {target for target, _ in aliased}
            if len(targets) == 1:
                return self._pick("model", targets.pop())
            chosen = self._preferred([src for _, src in aliased])
            if chosen is None:
                raise RegistryConflictError(self.conflict_message("model", name))
            return self._pick("model", next(t for t, src in aliased if src == chosen))
        return self._pick("model", name)

    def _unknown(self, kind: Kind, name: str, candidates: Iterable[str]) -> str:
        candidates = sorted(candidates)
        close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        return f"unknown {kind} {name!r}.{hint} Known: {', '.join(candidates) or 'none'}."

    def _architecture_not_model(self, name: str) -> str:
        """What to do with an architecture's name where a model's was wanted."""
        models = sorted(n for n, e in self._usable("model").items() if e.spec.architecture == name)
        entries = self._claims["architecture"][name]
        config = entries[0].spec.config
        where = config if isinstance(config, str) else f"{config.__module__}:{config.__qualname__}"
        named = (
            f"a named model of it ({', '.join(map(repr, models[:5]))}; keywords override its "
            f"config: zoo.build({models[0]!r}, n_layers=2)), or "
            if models
            else ""
        )
        cls = where.rpartition(":")[2].rpartition(".")[2]
        return (
            f"{name!r} is an architecture, not a named model. Build {named}a config of it: "
            f"zoo.build({cls}(...)), {cls} from {where} (or zoo.get_registry().architecture("
            f"{name!r}).config_class). Run `zoo list` to see every named model."
        )

    def _entry(self, kind: Kind, name: str) -> Entry[Any]:
        entry = self._model_entry(name) if kind == "model" else self._pick(kind, name)
        if entry is not None:
            return entry
        if kind == "model":
            if self.is_adapter(name):
                spec = self.adapter(name)
                raise UnknownModelError(
                    f"{name!r} is a LoRA adapter of {spec.base!r}, not a model: "
                    f"zoo.load({name!r}) loads {spec.base!r} with it"
                )
            if name in self._claims["architecture"]:
                raise UnknownModelError(self._architecture_not_model(name))
            names = list(self._claims["model"]) + list(self._alias_claims)
            raise UnknownModelError(
                self._unknown(kind, name, names) + " Run `zoo list` to see every named model."
            )
        message = self._unknown(kind, name, self._claims[kind])
        if kind == "adapter":
            raise UnknownModelError(message + " Run `zoo list` to see every named adapter.")
        if kind in COMPONENT_KINDS:
            raise ConfigError(
                message.replace(f"unknown {kind}", f"unknown {kind} component", 1)
                + " A plugin supplies new ones through the zoo_components hook."
            )
        if kind == "architecture":
            failed = [p.name for p in self.plugins if p.status == "failed"]
            if failed:
                message += f" Plugins that failed to load: {', '.join(failed)} (see `zoo plugins`)."
            else:
                message += " Install the plugin that provides it."
            raise UnknownArchitectureError(message)
        raise ZooError(message)

    def _usable(self, kind: Kind) -> dict[str, Entry[Any]]:
        """Every name of ``kind`` that resolves (no unresolved conflict), with its entry."""
        usable = {}
        for name in self._claims[kind]:
            try:
                entry = self._model_entry(name) if kind == "model" else self._pick(kind, name)
            except RegistryConflictError:
                continue
            if entry is not None:
                usable[name] = entry
        return usable

    def architecture(self, name: str) -> ArchitectureSpec:
        """The architecture called ``name``."""
        return self._entry("architecture", name).spec

    def model(self, name: str) -> ModelSpec:
        """The named model called ``name`` (or with that alias)."""
        return self._entry("model", name).spec

    def adapter(self, name: str) -> AdapterSpec:
        """The named adapter called ``name``."""
        return self._entry("adapter", name).spec

    def is_adapter(self, name: str) -> bool:
        """Whether ``name`` resolves to a named adapter (a conflict on it raises)."""
        return name in self._claims["adapter"] and self._pick("adapter", name) is not None

    def adapters(self) -> list[str]:
        """Names of the usable named adapters, sorted."""
        return sorted(self._usable("adapter"))

    def tokenizer(self, name: str) -> TokenizerSpec:
        """The tokenizer called ``name``."""
        return self._entry("tokenizer", name).spec

    def model_tokenizer(self, name: str) -> TokenizerSpec:
        """The tokenizer that named model ``name`` declares (what ``zoo.tokenizer(name)``
        loads); a :class:`~zoo.errors.ZooError` when it declares none or no installed plugin
        supplies it, :class:`~zoo.errors.UnknownModelError` when there is no such model."""
        spec = self.model(name)
        if spec.tokenizer is None:
            raise ZooError(f"model {spec.name!r} declares no tokenizer")
        try:
            return self.tokenizer(spec.tokenizer)
        except ZooError as exc:
            raise ZooError(
                f"model {spec.name!r} uses tokenizer {spec.tokenizer!r}, which no installed "
                f"plugin supplies ({exc}); see `zoo plugins`"
            ) from None

    def component(self, kind: str, name: str) -> ComponentSpec:
        """The component of ``kind`` (``"positions"``, ``"norm"``, ``"ffn"``,
        ``"attention"``) called ``name``; a :class:`~zoo.errors.ConfigError` listing the
        known ones when there is none."""
        if kind not in COMPONENT_KINDS:
            raise ValueError(f"component kind {kind!r} is not one of {', '.join(COMPONENT_KINDS)}")
        return self._entry(kind, name).spec  # type: ignore[arg-type]

    def resolve(
        self, name_or_config: str | ModelConfig, **overrides: Any
    ) -> tuple[ArchitectureSpec, ModelSpec | None, ModelConfig]:
        """A model name (or a config) plus overrides -> its architecture, named model (``None``
        for a config) and config."""
        if isinstance(name_or_config, ModelConfig):
            arch = self.architecture(type(name_or_config).architecture)
            return arch, None, name_or_config.replace(**overrides)
        if not isinstance(name_or_config, str):
            raise TypeError(
                f"expected a model name or a ModelConfig, got {type(name_or_config).__name__}"
            )
        spec = self.model(name_or_config)
        try:
            arch = self.architecture(spec.architecture)
        except UnknownArchitectureError as exc:
            raise UnknownArchitectureError(
                f"model {spec.name!r} needs architecture {spec.architecture!r}: {exc}"
            ) from None
        try:
            config = arch.config_class.from_dict(
                arch.config_class.overridden(spec.config, overrides)
            )
        except ConfigError as exc:
            raise ConfigError(f"{spec.name}: {exc}") from None
        return arch, spec, config

    def parts(self, config: Any) -> Parts:
        """What the names in ``config`` stand for, resolved once: the component of each kind
        it names (a :class:`~zoo.errors.ConfigError` naming the field for an unknown one),
        and architectures by name (a classifier's body)."""
        from ..nn.parts import Parts

        factories = {}
        for kind in COMPONENT_KINDS:
            name = getattr(config, kind, None)
            if not isinstance(name, str):
                continue
            try:
                factories[kind] = self.component(kind, name).build
            except ConfigError as exc:
                raise ConfigError(f"{type(config).__name__}.{kind}: {exc}") from None
        return Parts(factories, architecture=self._architecture_part)

    def _architecture_part(self, name: str) -> tuple[Any, Callable[[Any], Any]]:
        arch = self.architecture(name)
        return arch.config_class, self.model_factory(arch)

    def model_factory(self, arch: ArchitectureSpec) -> Callable[[Any], Any]:
        """``make(config)``: a model of ``arch`` built from ``config`` and the parts it names."""
        return lambda config: arch.build(config, self.parts(config))

    def components(self, kind: str) -> list[str]:
        """Names of the usable components of ``kind``, sorted."""
        return sorted(self._usable(kind))  # type: ignore[arg-type]

    def source(self, kind: Kind, name: str) -> str:
        """Where the ``kind`` called ``name`` was registered from."""
        return self._entry(kind, name).source

    def architectures(self) -> list[str]:
        """Names of the usable architectures, sorted."""
        return sorted(self._usable("architecture"))

    def tokenizers(self) -> list[str]:
        """Names of the usable tokenizers, sorted."""
        return sorted(self._usable("tokenizer"))

    def models(self, *, include_unavailable: bool = False) -> list[str]:
        """Names of the usable named models, sorted; by default only those whose architecture
        is installed and not in conflict. Names in conflict are in :attr:`conflicts`."""
        models = self._usable("model")
        if include_unavailable:
            return sorted(models)
        archs = self._usable("architecture")
        return sorted(n for n, e in models.items() if e.spec.architecture in archs)

    def supplied_by(self, source: str) -> dict[str, list[str]]:
        """What ``source`` (e.g. ``"plugin gpt2"``) registered, by kind."""
        return {
            kind: sorted(
                name for name, entries in table.items() if any(e.source == source for e in entries)
            )
            for kind, table in self._claims.items()
        }

    def _contested(self) -> dict[tuple[Kind, str], list[str]]:
        names: list[tuple[Kind, str]] = [(k, n) for k, t in self._claims.items() for n in t]
        names += [("model", alias) for alias in self._alias_claims]
        shared = {n for k, n in names if k == "model"}  # a name both claim: one conflict
        names = [(k, n) for k, n in names if not (k == "adapter" and n in shared)]
        contested = {}
        for kind, name in dict.fromkeys(names):
            sources = self._claimants(kind, name)
            if len(sources) > 1:
                contested[(kind, name)] = sources
        return contested

    def unresolved(self) -> dict[tuple[Kind, str], list[str]]:
        """``(kind, name)`` -> the sources that claim it, for every unresolved conflict."""
        return {
            key: sources
            for key, sources in self._contested().items()
            if self._preferred(sources) is None
        }

    @property
    def conflicts(self) -> dict[str, list[str]]:
        """``"kind name"`` -> the sources that claim it, for every unresolved conflict."""
        return {f"{kind} {name}": sources for (kind, name), sources in self.unresolved().items()}

    @property
    def preferred(self) -> dict[str, tuple[str, list[str]]]:
        """``"kind name"`` -> (the source ``prefer`` picked, every claimant), for every
        conflict a preference resolved."""
        resolved = {}
        for (kind, name), sources in self._contested().items():
            chosen = self._preferred(sources)
            if chosen is not None:
                resolved[f"{kind} {name}"] = (chosen, sources)
        return resolved

    def conflicts_of(self, source: str) -> list[str]:
        """The unresolved conflicts ``source`` takes part in (``"model gpt2-124m"``...)."""
        return [what for what, sources in self.conflicts.items() if source in sources]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (
            name in self._claims["model"] or name in self._alias_claims
        )
