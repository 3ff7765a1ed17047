"""What ``zoo check`` checks: a named model, or a checkpoint (a folder, a training run's
``--out``, a LoRA adapter's base, ``hf:org/name``) as the architecture and config it holds.
The conformance kit builds small random models of a config, so a checkpoint's is registered
under a name of its own for this process (its weights are not read)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from .. import api
from ..errors import ZooError
from ..plugin.current import add_plugin
from ..plugin.hookspecs import hookimpl
from ..plugin.model_specs import ModelSpec

__all__ = ["check_sources", "checked_name"]

#: The plugin name the checkpoints' configs are registered under (``zoo plugins`` shows it).
PLUGIN = "zoo-check"


def _is_source(text: str) -> bool:
    """Whether ``text`` names a checkpoint rather than a model: ``hf:``, a path."""
    return text.startswith("hf:") or "/" in text or "\\" in text or Path(text).exists()


def check_sources(sources: list[str]) -> None:
    """Refuse, before torch, what is neither a named model nor a checkpoint that exists: an
    unknown name lists close matches, a missing folder says what ``zoo check`` takes."""
    for source in sources:
        if not _is_source(source):
            api.resolve_config(source)  # unknown names fail fast with suggestions
        elif not source.startswith("hf:") and not Path(source).exists():
            raise ValueError(
                f"{source} does not exist: zoo check takes a named model (zoo list), a "
                "checkpoint folder, a training run's --out folder, a LoRA adapter folder or "
                "hf:org/name"
            )


def checked_name(source: str) -> str:
    """The registry name the kit runs on for ``source``: itself for a named model, else the
    checkpoint's architecture and config registered as a model named after them."""
    if not _is_source(source):
        return source
    info = api.info(source)  # reads the config, not the weights
    if info.architecture == "-":
        raise ZooError(
            f"{source}: zoo cannot tell which architecture it is ({info.description}); zoo "
            "check needs a checkpoint or an adapter whose base zoo knows"
        )
    config = dict(info.config)
    digest = hashlib.sha256(repr((info.architecture, sorted(config.items()))).encode())
    name = f"checkpoint-{info.architecture}-{digest.hexdigest()[:12]}"
    _register(name, info.architecture, config)
    return name


#: The checkpoints' specs registered in this process, by name.
_SPECS: dict[str, ModelSpec] = {}


class _Checkpoints:
    """The plugin that supplies :data:`_SPECS` (one for the process)."""

    @hookimpl
    def zoo_models(self) -> list[ModelSpec]:
        return list(_SPECS.values())


def _register(name: str, architecture: str, config: dict[str, Any]) -> None:
    if name not in _SPECS:
        _SPECS[name] = ModelSpec(name=name, architecture=architecture, config=config)
        add_plugin(_Checkpoints(), name=PLUGIN)  # the registry reloads with it
