"""Recognising a checkpoint on disk: one reader per format, each saying which architecture,
config and layout a directory's weights are, or that the directory is not its format.

The formats, tried in this order by :func:`recognise` (what :func:`zoo.checkpoint.load_local`
dispatches through):

1. a zoo checkpoint: ``config.json`` with ``"format": "zoo"`` (a :class:`Manifest`);
2. a Hugging Face checkpoint: ``config.json`` with a ``model_type`` that an installed
   architecture's layout reads (``KeyMap.model_type``);
3. zoo weights without their ``config.json``: the description zoo writes into the
   safetensors header;
4. bare weights of a named model: the config is the registry entry's (``model_name``), in the
   zoo layout or one the caller names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import jsonfile
from ..errors import (
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    RegistryConflictError,
    UnknownArchitectureError,
)
from ..plugin.current import get_registry
from ..plugin.specs import ArchitectureSpec
from .files import check_weights_file
from .manifest import CONFIG_FILE, Manifest, config_format, plugin_distribution

__all__ = [
    "METADATA_KEY",
    "ForeignClaim",
    "Recognised",
    "Request",
    "foreign_claims",
    "foreign_layout",
    "foreign_layouts",
    "model_type_conflicts",
    "recognise",
]

#: safetensors metadata key holding the zoo description (so a bare weights file loads too).
METADATA_KEY = "zoo"


@dataclasses.dataclass(frozen=True)
class Request:
    """What the caller knows: the directory, its weights file (``file_given`` when the caller
    named the file itself) and ``config.json`` (parsed, or ``None``), the layout asked for
    (``"auto"`` to detect), and the named model the weights belong to, if any. ``shown`` is
    the folder messages name when ``directory`` is a version folder inside it."""

    directory: Path
    weights: Path
    data: Mapping[str, Any] | None
    layout: str = "auto"
    model_name: str | None = None
    file_given: bool = False
    shown: Path | None = None  # the folder as the caller named it, for messages

    @property
    def where(self) -> str:
        return str((self.shown or self.directory) / CONFIG_FILE)


@dataclasses.dataclass(frozen=True)
class Recognised:
    """What a reader found: the format (``"zoo"`` or a layout name), the architecture and
    config, the layout's key map (``None`` for zoo's own), the weights file (or the index of a
    sharded checkpoint), the sha256 the checkpoint records (and each shard's), the named model
    and the tokenizer it names."""

    format: str
    architecture: ArchitectureSpec
    config: Any
    weights: Path
    keymap: Any = None
    sha256: str | None = None
    model_name: str | None = None
    tokenizer: Mapping[str, Any] | None = None
    shards: Mapping[str, str | None] | None = None


Reader = Callable[[Request], "Recognised | None"]


# -- what the readers share ------------------------------------------------------------------
def architecture(name: str, *, where: str, plugin: Mapping[str, Any] | None) -> ArchitectureSpec:
    """The installed architecture ``name``, or an error naming the plugin to install."""
    try:
        return get_registry().architecture(name)
    except UnknownArchitectureError as exc:
        hint = ""
        package = plugin_distribution(plugin)
        if plugin and package:
            hint = (
                f" It was saved with the plugin {plugin.get('name')!r} from the distribution "
                f"{package!r}: install it (pip install {package})."
            )
        elif plugin and plugin.get("name"):
            hint = f" It was saved with the plugin {plugin['name']!r}: install it."
        raise UnknownArchitectureError(
            f"{where} needs the architecture {name!r}, which no installed plugin supplies.{hint}"
            f" ({exc})"
        ) from None


def make_config(arch: ArchitectureSpec, values: Mapping[str, Any], *, where: str) -> Any:
    """``arch``'s config from ``values``; a :class:`CheckpointError` saying where it is bad."""
    try:
        return arch.config_class.from_dict(values)
    except ConfigError as exc:
        raise CheckpointError(
            f"{where}: the config is not valid for {arch.name!r}: {exc}"
        ) from None


@dataclasses.dataclass(frozen=True)
class ForeignClaim:
    """An installed layout that reads one Hugging Face ``model_type``: its architecture, the
    layout's name there, and the source that supplied the architecture (``"plugin gpt2"``)."""

    architecture: ArchitectureSpec
    layout: str
    source: str

    def __str__(self) -> str:
        return f"layout {self.layout!r} of architecture {self.architecture.name!r} ({self.source})"


def foreign_claims(
    *, import_all: bool = False
) -> tuple[dict[str, list[ForeignClaim]], dict[str, str]]:
    """Hugging Face ``model_type`` -> every installed layout that reads it, as its
    architecture declares (``ArchitectureSpec.hf_model_types``) or, undeclared (or with
    ``import_all``), as the imported layout says (``KeyMap.model_type``); and the layouts that
    could not be imported (``"layout 'hf-x' of architecture 'x'"`` -> why): a plugin whose
    layout module is broken costs only its own model types."""
    registry = get_registry()
    claims: dict[str, list[ForeignClaim]] = {}
    broken: dict[str, str] = {}
    for name in registry.architectures():
        arch = registry.architecture(name)
        for layout in sorted(arch.checkpoint_layouts):
            model_type = arch.declared_model_type(layout)
            if model_type is None or import_all:
                try:
                    keymap = arch.checkpoint_layout(layout)
                except Exception as exc:  # a plugin's module may raise anything when imported
                    broken[f"layout {layout!r} of architecture {name!r}"] = (
                        f"{type(exc).__name__}: {exc}"
                    )
                    continue
                model_type = getattr(keymap, "model_type", None)
            if model_type is not None:
                source = registry.source("architecture", name)
                claims.setdefault(model_type, []).append(ForeignClaim(arch, layout, source))
    return claims, broken


def _choose(
    model_type: str, claims: list[ForeignClaim], layout: str = "auto"
) -> ForeignClaim | None:
    """The claim that reads ``model_type``: the only one, the one named ``layout``, or the
    one whose source ``ZOO_PREFER`` names; ``None`` when that leaves several."""
    if layout != "auto":
        named = [c for c in claims if c.layout == layout]
        claims = named if named else claims
    if len(claims) == 1:
        return claims[0]
    chosen = get_registry().preferred_source([c.source for c in claims])
    picked = [c for c in claims if c.source == chosen]
    return picked[0] if len(picked) == 1 else None


def conflict_message(model_type: str, claims: list[ForeignClaim]) -> str:
    """Who claims ``model_type``, and the ways to choose."""
    plugins = [c.source.removeprefix("plugin ") for c in claims]
    how = []
    if len(set(plugins)) == len(plugins):
        how.append(f"pin the plugin with ZOO_PREFER (e.g. ZOO_PREFER={plugins[0]})")
    if len({c.layout for c in claims}) == len(claims):
        how.append(
            f"name the layout (zoo.checkpoint.load_local(path, layout={claims[0].layout!r}); "
            "a named model's weights name theirs)"
        )
    return (
        f"Hugging Face model_type {model_type!r} is read by more than one installed layout: "
        f"{' and '.join(map(str, claims))}. zoo never picks one silently: uninstall one of "
        f"them, or {', or '.join(how) or 'rename one of the layouts'}."
    )


def model_type_conflicts() -> tuple[list[str], dict[str, str]]:
    """What ``zoo plugins`` reports of the installed layouts: a message per Hugging Face
    ``model_type`` that several read with nothing to choose between them (``ZOO_PREFER``
    resolves one as it does a name), and the layouts that could not be imported (why)."""
    claims, broken = foreign_claims(import_all=True)
    messages = [
        conflict_message(model_type, claimed)
        for model_type, claimed in sorted(claims.items())
        if _choose(model_type, claimed) is None
    ]
    return messages, broken


def foreign_layouts() -> dict[str, tuple[ArchitectureSpec, str]]:
    """Hugging Face ``model_type`` -> (architecture, layout name), for every model type one
    installed layout reads (or ``ZOO_PREFER`` picks among several); a model type in
    unresolved conflict is left out (:func:`foreign_layout` says why)."""
    claims, _ = foreign_claims()
    found = {}
    for model_type, claimed in claims.items():
        chosen = _choose(model_type, claimed)
        if chosen is not None:
            found[model_type] = (chosen.architecture, chosen.layout)
    return found


def foreign_layout(model_type: str, layout: str = "auto", *, where: str) -> ForeignClaim:
    """The installed layout that reads ``model_type`` (``layout``: the one asked for, which
    also settles a conflict).

    Raises:
        UnknownArchitectureError: no installed layout reads it.
        RegistryConflictError: several do, from different plugins, and neither ``layout`` nor
            ``ZOO_PREFER`` picks one.
    """
    claims, broken = foreign_claims()
    if model_type not in claims:
        failed = "; ".join(f"{what} ({why})" for what, why in sorted(broken.items()))
        raise UnknownArchitectureError(
            f"{where} is a Hugging Face {model_type!r} checkpoint, but no installed plugin "
            f"declares a layout that reads it (model types zoo reads: "
            f"{', '.join(sorted(claims)) or 'none'}). Install a plugin that imports it."
            + (f" Layouts that failed to import: {failed}." if failed else "")
        )
    chosen = _choose(model_type, claims[model_type], layout)
    if chosen is None:
        raise RegistryConflictError(conflict_message(model_type, claims[model_type]))
    return chosen


def _check_layout(request: Request, found: str) -> None:
    if request.layout not in ("auto", found):
        raise CheckpointError(
            f"{request.directory} holds a {found!r} checkpoint, not {request.layout!r}"
        )


def model_folder(path: Path) -> Path:
    """The checkpoint a folder stands for: itself when it holds a ``config.json``; for a
    training run's ``--out`` folder its final ``model/``, else (a run stopped before the end)
    its resumable ``checkpoint/model``; for a run's ``checkpoint/`` folder, its ``model``."""
    if not path.is_dir() or (path / CONFIG_FILE).exists():
        return path
    for inner in (path / "model", path / "checkpoint" / "model"):
        if (inner / CONFIG_FILE).is_file():
            return inner
    return path


def existing_checkpoint(path: Path) -> Path:
    """The checkpoint ``path`` stands for (:func:`model_folder`), which must exist."""
    path = model_folder(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist", path=path)
    return path


# -- the readers -----------------------------------------------------------------------------
def read_zoo(request: Request) -> Recognised | None:
    """A zoo checkpoint: ``config.json`` is a :class:`Manifest`."""
    data = request.data
    if data is None or config_format(data, where=request.where) != "zoo":
        return None
    _check_layout(request, "zoo")
    manifest = Manifest.from_json(data, where=request.where)
    arch = architecture(manifest.architecture, where=request.where, plugin=manifest.plugin)
    weights = request.weights if request.file_given else request.directory / manifest.weights_file
    return Recognised(
        format="zoo",
        architecture=arch,
        config=make_config(arch, manifest.config, where=request.where),
        weights=weights,
        sha256=manifest.sha256,
        model_name=manifest.model_name,
        tokenizer=manifest.tokenizer,
        shards=manifest.shards,
    )


def read_hf(request: Request) -> Recognised | None:
    """A Hugging Face checkpoint whose ``model_type`` an installed layout reads."""
    data = request.data
    if data is None or config_format(data, where=request.where) != "hf":
        return None
    model_type = str(data["model_type"])
    claim = foreign_layout(model_type, request.layout, where=request.where)
    arch, layout = claim.architecture, claim.layout
    _check_layout(request, layout)
    keymap = arch.checkpoint_layout(layout)
    if keymap.config_from_foreign is None:
        raise CheckpointError(f"the {layout!r} layout cannot read a config.json")
    try:
        values = keymap.config_from_foreign(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{request.where}: {exc}") from None
    config = make_config(arch, values, where=request.where)
    return Recognised(layout, arch, config, request.weights, keymap, None, request.model_name)


def read_metadata(request: Request) -> Recognised | None:
    """Zoo weights without ``config.json``: the description in the safetensors header (of
    the first shard, for a sharded checkpoint: zoo writes it into each)."""
    from safetensors import SafetensorError, safe_open

    from .shards import index_file, is_index, read_index

    weights = request.weights
    if request.data is not None or request.layout not in ("auto", "zoo"):
        return None
    if not weights.is_file() and index_file(weights).is_file():
        weights = index_file(weights)
    if not weights.is_file():
        return None
    header = weights
    if is_index(weights):
        header = weights.parent / read_index(weights, shown=request.shown).shards[0]
        if not header.is_file():
            raise CheckpointError(
                f"{weights} names the shard {header.name}, which is missing", path=header
            )
    check_weights_file(header)
    try:
        with safe_open(str(header), framework="pt") as f:
            metadata = f.metadata() or {}
    except SafetensorError as exc:
        raise CorruptCheckpointError(
            f"{header} is not a valid safetensors file: {exc}", path=header
        ) from None
    if METADATA_KEY not in metadata:
        return None
    try:
        description = jsonfile.loads(metadata[METADATA_KEY])
        arch_name, values = description["architecture"], description["config"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(
            f"{weights}: the zoo metadata is damaged ({exc})", path=weights
        ) from None
    arch = architecture(arch_name, where=str(weights), plugin=None)
    config = make_config(arch, values, where=str(weights))
    name = request.model_name or description.get("model_name")
    return Recognised("zoo", arch, config, weights, model_name=name)


def read_named(request: Request) -> Recognised | None:
    """Bare weights of the named model ``model_name``, in the zoo layout or the one asked."""
    name = request.model_name
    if request.data is not None or name is None:
        return None
    spec = get_registry().model(name)
    where = f"model {name!r}"
    arch = architecture(spec.architecture, where=where, plugin=None)
    config = make_config(arch, spec.config, where=where)
    keymap = None if request.layout in ("auto", "zoo") else arch.checkpoint_layout(request.layout)
    fmt = "zoo" if keymap is None else request.layout
    return Recognised(fmt, arch, config, request.weights, keymap, model_name=name)


READERS: tuple[Reader, ...] = (read_zoo, read_hf, read_metadata, read_named)


def recognise(request: Request) -> Recognised:
    """The first reader's answer, or a :class:`CheckpointError` saying nothing tells which
    model the weights belong to."""
    for reader in READERS:
        found = reader(request)
        if found is not None:
            return found
    raise CheckpointError(
        f"{request.directory} has no {CONFIG_FILE} (and its weights no zoo metadata): zoo "
        "cannot tell which model the weights belong to. Save with zoo.save(), or load through "
        "a named model."
    )
