"""Named models as data (:class:`ModelSpec`, :class:`WeightsSource`: what a ``[models.NAME]``
table of a registry file holds, or a plugin's ``zoo_models`` hook returns), and the name rule
every spec follows. Re-exported by :mod:`zoo.plugin.specs`."""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Mapping
from typing import Any

__all__ = ["AdapterSpec", "ModelSpec", "WeightsSource", "check_name", "frozen_mapping"]

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(kind: str, name: str) -> None:
    """Refuse a ``kind`` name (``"model"``, ``"architecture"``...) that is not lower-case
    letters, digits, ``.``, ``_`` and ``-``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"{kind} name {name!r} is not valid: use lower-case letters, digits, '.', '_' or '-'"
        )


def frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A read-only copy of ``value`` (``{}`` for ``None``)."""
    return types.MappingProxyType(dict(value or {}))


def _check_sha256(field: str, value: object) -> None:
    """Refuse a pinned hash that is not 64 hexadecimal digits (``None`` is no pin)."""
    if value is not None and not (isinstance(value, str) and _SHA256.fullmatch(value)):
        raise ValueError(
            f"{field} = {value!r} is not a sha256: it must be 64 hexadecimal "
            "digits (`sha256sum FILE` prints it), or left out"
        )


@dataclasses.dataclass(frozen=True)
class WeightsSource:
    """Where the pretrained weights of a named model come from.

    Args:
        repo: Hugging Face Hub repo id, e.g. ``"openai-community/gpt2"`` (``None`` for weights
            that only exist locally).
        revision: branch, tag or commit.
        filename: weights file inside the repo (or inside ``path``).
        layout: checkpoint layout of that file (``"zoo"`` or a layout the architecture declares).
        sha256: pinned hash of the weights file, verified after download and on every
            :func:`zoo.load` when set.
        path: a local directory holding ``filename`` (or the file itself); ``~`` and
            ``$VARIABLES`` are expanded. :func:`zoo.load` reads it without any download.
    """

    repo: str | None = None
    revision: str = "main"
    filename: str = "model.safetensors"
    layout: str = "zoo"
    sha256: str | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        _check_sha256("weights.sha256", self.sha256)

    def __str__(self) -> str:
        where = f"hf:{self.repo}@{self.revision}" if self.repo else f"local {self.path}"
        return f"{where} ({self.filename}, {self.layout} layout)"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A named model: an architecture plus config values, tokenizer and weights source.

    Args:
        name: registry name, e.g. ``"gpt2-124m"``.
        architecture: name of the architecture it instantiates.
        config: config values passed to the architecture's config class.
        tokenizer: name of a registered tokenizer, or ``None``.
        weights: where pretrained weights come from, or ``None`` (random init only).
        aliases: other names that resolve to this model.
        description: one line for ``zoo list``.
    """

    name: str
    architecture: str
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tokenizer: str | None = None
    weights: WeightsSource | None = None
    aliases: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        check_name("model", self.name)
        if isinstance(self.aliases, str) or not isinstance(self.aliases, (list, tuple)):
            raise ValueError(
                f"model {self.name!r}: aliases must be a list of names, got {self.aliases!r}"
            )
        for alias in self.aliases:
            check_name("alias", alias)
            if alias == self.name:
                raise ValueError(f"model {self.name!r}: an alias cannot be the model's own name")
        object.__setattr__(self, "aliases", tuple(self.aliases))
        object.__setattr__(self, "config", frozen_mapping(self.config))

    @classmethod
    def from_toml(cls, name: str, table: Mapping[str, Any]) -> ModelSpec:
        """Create a spec from one ``[models.NAME]`` table of a registry file."""
        if not isinstance(table, Mapping):
            raise ValueError(f"model {name!r}: [models.{name}] must be a table")
        known = {"architecture", "config", "tokenizer", "weights", "aliases", "description"}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ValueError(
                f"model {name!r}: unknown key(s) {', '.join(unknown)}; "
                f"valid keys are {', '.join(sorted(known))}"
            )
        if "architecture" not in table:
            raise ValueError(f"model {name!r}: 'architecture' is required")
        weights = table.get("weights")
        return cls(
            name=name,
            architecture=table["architecture"],
            config=table.get("config", {}),
            tokenizer=table.get("tokenizer"),
            weights=WeightsSource(**weights) if weights else None,
            aliases=table.get("aliases", ()),
            description=table.get("description", ""),
        )


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
    """A named LoRA adapter: a peft adapter folder published on the Hub, for one named base
    model. ``zoo.load(NAME)`` loads ``base`` with it; ``zoo.load(base, adapter=NAME)`` too.
    Its name shares the models' namespace: a name claimed by a model and an adapter is a
    conflict, as between two models.

    Args:
        name: registry name, e.g. ``"gpt2-124m-poems"``.
        base: the named model (or alias) it was trained on.
        repo: the Hub repo holding ``adapter_config.json`` and ``adapter_model.safetensors``.
        revision: branch, tag or (best) commit the adapter is pinned to.
        sha256: pinned hash of ``adapter_model.safetensors``, checked on every load when set.
        description: one line for ``zoo list``.
    """

    name: str
    base: str
    repo: str
    revision: str = "main"
    sha256: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        check_name("adapter", self.name)
        check_name("model", self.base)
        if self.base == self.name:
            raise ValueError(f"adapter {self.name!r}: its base cannot be the adapter itself")
        if not isinstance(self.repo, str) or not _REPO.fullmatch(self.repo):
            raise ValueError(
                f"adapter {self.name!r}: repo = {self.repo!r} is not a Hub repo id (org/name)"
            )
        if not isinstance(self.revision, str) or not self.revision.strip():
            raise ValueError(f"adapter {self.name!r}: revision must be a branch, tag or commit")
        _check_sha256(f"adapter {self.name!r}: sha256", self.sha256)

    @property
    def source(self) -> str:
        """``hf:repo@revision``: where the adapter is pulled from."""
        return f"hf:{self.repo}@{self.revision}"

    @classmethod
    def from_toml(cls, name: str, table: Mapping[str, Any]) -> AdapterSpec:
        """Create a spec from one ``[adapters.NAME]`` table of a registry file."""
        if not isinstance(table, Mapping):
            raise ValueError(f"adapter {name!r}: [adapters.{name}] must be a table")
        known = {"base", "repo", "revision", "sha256", "description"}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ValueError(
                f"adapter {name!r}: unknown key(s) {', '.join(unknown)}; "
                f"valid keys are {', '.join(sorted(known))}"
            )
        missing = [key for key in ("base", "repo") if key not in table]
        if missing:
            raise ValueError(f"adapter {name!r}: {' and '.join(map(repr, missing))} required")
        return cls(name=name, **table)
