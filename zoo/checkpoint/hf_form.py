"""A zoo model in its Hugging Face layout, in memory: ``config.json`` as a dict and the state
under the layout's keys, refused where the layout cannot hold the model exactly. What
:func:`zoo.export` writes, and what the GGUF writer converts (:mod:`zoo.checkpoint.gguf`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import ModelConfig
from ..errors import CheckpointError
from ..plugin.specs import ArchitectureSpec
from .readers import architecture

if TYPE_CHECKING:
    from torch import Tensor, nn

__all__ = ["config_of", "foreign_form", "hf_layouts"]


def config_of(model: Any) -> ModelConfig:
    """``model.config``, or a :class:`CheckpointError`: only zoo's models are written."""
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise CheckpointError(
            f"{type(model).__name__} has no zoo config (model.config); only models built by "
            "zoo (zoo.build / zoo.load) can be saved"
        )
    return config


def hf_layouts(arch: ArchitectureSpec) -> list[str]:
    """The layouts of ``arch`` that are Hugging Face checkpoints (declare a ``model_type``)."""
    return sorted(
        lay
        for lay in arch.checkpoint_layouts
        if getattr(arch.checkpoint_layout(lay), "model_type", None) is not None
    )


def foreign_form(
    model: nn.Module, layout: str | None
) -> tuple[str, dict[str, Any], dict[str, Tensor]]:
    """``model`` in its Hugging Face layout ``layout`` (the architecture's only one when
    ``None``): the layout's name, ``config.json`` as a dict and the state under the layout's
    keys; a :class:`CheckpointError` when the layout cannot hold the model exactly (what
    :func:`export` writes, and the GGUF writer converts)."""
    from .state import unique_state

    config = config_of(model)
    arch = architecture(type(config).architecture, where="export", plugin=None)
    layouts = hf_layouts(arch) if layout is None else [layout]
    if len(layouts) != 1:
        raise CheckpointError(
            f"architecture {arch.name!r} declares layouts {hf_layouts(arch) or 'none'}; "
            "pass layout=... to choose one"
        )
    try:
        keymap = arch.checkpoint_layout(layouts[0])
    except KeyError as exc:
        raise CheckpointError(str(exc.args[0])) from None
    if keymap.config_to_foreign is None:
        raise CheckpointError(f"layout {layouts[0]!r} cannot write a config.json")
    differs = keymap.misrepresented(config)
    if differs:
        raise CheckpointError(
            f"the {layouts[0]!r} layout cannot hold this model: it has {'; '.join(differs)}. "
            "Written anyway it would load as a different model; save it with zoo.save instead"
        )
    try:
        foreign_config = dict(keymap.config_to_foreign(config))
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{arch.name} cannot be exported as {layouts[0]!r}: {exc}") from None
    foreign, report = keymap.from_zoo(unique_state(model), config)
    if report.unexpected:
        raise CheckpointError(
            f"layout {layouts[0]!r} has no place for {list(report.unexpected)[:5]}; this model "
            "cannot be exported to it"
        )
    if report.missing:
        raise CheckpointError(
            f"exporting as {layouts[0]!r} would leave {list(report.missing)[:5]} unwritten; "
            "the model lacks weights that layout needs"
        )
    return layouts[0], foreign_config, foreign
