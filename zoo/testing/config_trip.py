"""The kit's config round trip: a zoo config written by a layout's ``config.json`` writer,
read by ``transformers`` (``AutoConfig``), saved again by ``transformers`` and read back by the
layout's reader must mean the same model.

A layout that writes a value under a key transformers does not read passes every logits
comparison on a config whose value is transformers' default, and then exports a checkpoint
that transformers reads otherwise. So the reference check takes the trip, and compares
logits, for each of its draws, one of which is moved off the defaults
(:func:`moved_off_defaults`: each float the layout holds scaled by 1.5, each bool it holds
flipped). A key transformers drops shows in the trip; a key it keeps unread (it writes back
what its config class does not know) shows in that draw's logits, which transformers
computes with its default.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from .. import jsonfile
from ..checkpoint.hf_layout import ANY
from ..config import meaning_of
from ..errors import CheckpointError, ConfigError
from .hf_reference import CheckSkipped, _transformers

__all__ = ["check_config_trip", "config_differences", "moved_off_defaults"]

#: The factor a float the layout holds is moved by (exact in binary: 1.5 = 3/2).
MOVE = 1.5


def _through_transformers(keymap: Any, config: Any, arch: Any) -> Any:
    """``config`` written by ``keymap``, loaded and saved by transformers' ``AutoConfig``,
    read back by ``keymap`` into ``arch``'s config class."""
    transformers = _transformers()
    written = keymap.config_to_foreign(config)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(written))
        try:
            loaded = transformers.AutoConfig.from_pretrained(folder)
        except (ValueError, KeyError) as exc:
            raise CheckSkipped(
                f"transformers cannot read the layout's config.json ({exc})"
            ) from None
        with tempfile.TemporaryDirectory() as saved:
            loaded.save_pretrained(saved)
            data = jsonfile.read(Path(saved) / "config.json")
    try:
        return arch.config_class.from_dict(keymap.config_from_foreign(data))
    except (CheckpointError, ConfigError, ValueError, KeyError, TypeError) as exc:
        raise AssertionError(
            f"the layout cannot read back the config.json transformers saved: {exc}"
        ) from None


def config_differences(arch: Any, layout: str, config: Any, folder: Path) -> list[str]:
    """``field: zoo value -> value after the trip`` for each field of ``config`` whose meaning
    (:meth:`zoo.config.ModelConfig.meaning`) does not survive ``layout``'s writer ->
    transformers -> the layout's reader (empty when all do); what the layout settles by the
    weights (``config_from_weights``) is settled by those ``zoo.export`` wrote to
    ``folder``."""
    from ..checkpoint.files import read_safetensors

    keymap = arch.checkpoint_layout(layout)
    back = _through_transformers(keymap, config, arch)
    settle = getattr(keymap, "config_from_weights", None)
    if settle is not None:
        back = settle(back, read_safetensors(folder / "model.safetensors")[0])
    return [
        f"{f.name}: {meaning_of(config, f.name)!r} -> {meaning_of(back, f.name)!r}"
        for f in dataclasses.fields(config)
        if meaning_of(config, f.name) != meaning_of(back, f.name)
    ]


def moved_off_defaults(arch: Any, layout: str, config: Any) -> tuple[Any, list[str]]:
    """``config`` with each float field the layout holds any value of (``ANY`` in its
    ``represents``) times :data:`MOVE`, and each such bool flipped, where the config stays
    valid and the layout can still write it; and the names of the fields moved."""
    keymap = arch.checkpoint_layout(layout)
    moved: list[str] = []
    for name, held in keymap.represents.items():
        value = getattr(config, name, None)
        if held is not ANY or not isinstance(value, (bool, float)):
            continue
        candidate = (not value) if isinstance(value, bool) else value * MOVE
        try:
            trial = dataclasses.replace(config, **{name: candidate})
            if keymap.misrepresented(trial):
                continue
            keymap.config_to_foreign(trial)
        except (ConfigError, CheckpointError, ValueError, KeyError, TypeError):
            continue  # the layout cannot write it: not a value it holds
        config, moved = trial, [*moved, name]
    return config, moved


def check_config_trip(arch: Any, layout: str, config: Any, folder: Path) -> str:
    """Assert that ``config`` survives ``layout``'s writer -> transformers -> the layout's
    reader (the weights in ``folder``, ``zoo.export``'s, settling what they settle); returns
    the note.

    Raises:
        AssertionError: naming each field that came back otherwise.
        CheckSkipped: transformers cannot read the layout's ``config.json``.
    """
    differs = config_differences(arch, layout, config, folder)
    if differs:
        raise AssertionError(
            "config values do not survive export -> transformers -> zoo: " + "; ".join(differs)
        )
    return "config survives transformers"
