"""Where each of a model's adapters sits in its checkpoint layout.

A Hugging Face layout (:class:`~zoo.checkpoint.hf_layout.KeyMap`) names the foreign module of
each zoo linear layer: a :class:`~zoo.checkpoint.hf_layout.FusedRule` splits a fused layer
into foreign modules (Llama's ``q_proj``/``k_proj``/``v_proj`` for zoo's ``attn.qkv``), a
:class:`~zoo.checkpoint.hf_layout.KeyRule` maps a layer to one module, possibly with its rows
regrouped (GPT-NeoX's ``query_key_value``) or its weight transposed (GPT-2's ``Conv1D``).
Each foreign module is a :class:`Piece`: the rows of the zoo layer it holds, in its own
order. peft's adapter on that module has the same ``A`` as zoo's and ``B``'s rows picked by
the piece, so the mapping is exact both ways. A family without a Hugging Face layout names
its pieces by zoo's own part paths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..checkpoint.readers import architecture
from ..checkpoint.write import hf_layouts
from ..config import ModelConfig
from ..errors import CheckpointError
from .lora import layer_parts

__all__ = ["Piece", "Unit", "layout_of", "module_lookup", "per_part", "pieces", "units"]


@dataclasses.dataclass(frozen=True)
class Piece:
    """One foreign module: ``module`` (its name in the foreign model, zoo's part path for a
    family without a Hugging Face layout) holds ``rows`` of the zoo ``layer``'s output, in
    its own order; ``fan_in_fan_out`` when the layout stores its weight transposed."""

    module: str
    layer: str
    rows: Tensor
    fan_in_fan_out: bool = False


@dataclasses.dataclass(frozen=True)
class Unit:
    """One place zoo may hang an adapter: ``path`` (a part path, or a layer path when the
    layer is adapted whole) covers rows ``start:stop`` of ``layer``'s output."""

    path: str
    layer: str
    start: int
    stop: int
    in_features: int


def _join(owner: str, name: str) -> str:
    return f"{owner}.{name}" if owner else name


def layout_of(model: nn.Module) -> tuple[str | None, object | None]:
    """``(layout name, KeyMap)`` of the model's Hugging Face checkpoint layout, or
    ``(None, None)`` for a family without one."""
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise ValueError(
            f"{type(model).__name__} has no zoo config (model.config); adapters are saved and "
            "read for models built by zoo (zoo.build / zoo.load)"
        )
    arch = architecture(type(config).architecture, where="adapters", plugin=None)
    names = hf_layouts(arch)
    if not names:
        return None, None
    keymap = arch.checkpoint_layout(names[0])
    if keymap.merge_foreign is not None or keymap.split_foreign is not None:
        raise CheckpointError(
            f"the {names[0]!r} layout transforms whole state dicts (merge_foreign/"
            "split_foreign), which zoo cannot carry adapters through exactly; adapters of "
            f"{arch.name!r} cannot be read or written in peft's format"
        )
    return names[0], keymap


def _prefix(keymap: object, layer: str) -> str:
    """What the foreign model's module names add to the layout's keys: the prefix it strips
    (GPT-2's ``transformer.``), for every layer but the LM head, which sits beside it."""
    prefixes = keymap.strip_prefixes  # type: ignore[attr-defined]
    return prefixes[0] if prefixes and layer != "head" else ""


def _layer_pieces(keymap: object, config: ModelConfig, layer: str, out: int) -> list[Piece]:
    """The foreign modules of zoo layer ``layer`` (``out`` rows) in ``keymap``, named as
    in the foreign model with its LM head (peft's names)."""
    key = f"{layer}.weight"
    prefix = _prefix(keymap, layer)
    index = torch.arange(out).reshape(out, 1)  # (out, 1): each row holds its own index
    for rule in keymap.fused:  # type: ignore[attr-defined]
        try:
            split = rule.split({key: index}, config)
        except (RuntimeError, ValueError, AttributeError):
            continue  # the sizes do not fit this layer
        if split:
            return [
                Piece(prefix + name.removesuffix(".weight"), layer, rows[:, 0])
                for name, rows in split.items()
            ]
    for rule in keymap.rules:  # type: ignore[attr-defined]
        foreign = rule.match(key, side="zoo")
        if foreign is not None:
            plain = dataclasses.replace(rule, transpose=False)  # A and B are never transposed
            rows = plain.convert(index, config, side="zoo")[:, 0]
            module = prefix + foreign.removesuffix(".weight")
            return [Piece(module, layer, rows, rule.transpose)]
    return []


def pieces(model: nn.Module) -> list[Piece]:
    """Every foreign module the model's linear layers map to (in layer order); zoo's own
    part paths for a family without a Hugging Face layout."""
    _, keymap = layout_of(model)
    config = model.config
    found: list[Piece] = []
    for layer, owner, module, parts in layer_parts(model):
        if keymap is None:
            start = 0
            for name, rows in parts:
                path = layer if len(parts) == 1 else _join(owner, name)
                found.append(Piece(path, layer, torch.arange(start, start + rows)))
                start += rows
        else:
            found += _layer_pieces(keymap, config, layer, int(module.out_features))  # type: ignore[arg-type]
    return found


def units(model: nn.Module) -> dict[str, Unit]:
    """Every place an adapter may hang on ``model``: each layer whole and each part of a
    fused layer, by path."""
    found: dict[str, Unit] = {}
    for layer, owner, module, parts in layer_parts(model):
        width = int(module.in_features)  # type: ignore[arg-type]
        found[layer] = Unit(layer, layer, 0, int(module.out_features), width)  # type: ignore[arg-type]
        start = 0
        for name, rows in parts:
            if len(parts) > 1:
                path = _join(owner, name)
                found[path] = Unit(path, layer, start, start + rows, width)
            start += rows
    return found


def per_part(model: nn.Module) -> Callable[[str], bool]:
    """For :func:`zoo.adapters.lora.plan_lora`: whether a fused layer of ``model`` gets an adapter
    per part (its checkpoint layout stores the parts apart, or the family has no Hugging Face
    layout) or one over the whole layer (the layout stores it fused: GPT-2's ``c_attn``,
    Phi-3's ``qkv_proj``, GPT-NeoX's ``query_key_value``)."""
    by_layer: dict[str, list[Piece]] = {}
    for piece in pieces(model):
        by_layer.setdefault(piece.layer, []).append(piece)
    whole = {
        layer
        for layer, found in by_layer.items()
        if len(found) == 1 and _out_rows(model, layer) == len(found[0].rows)
    }
    return lambda layer: layer not in whole


def _out_rows(model: nn.Module, layer: str) -> int:
    return int(model.get_submodule(layer).out_features)  # type: ignore[arg-type]


def module_lookup(model: nn.Module) -> tuple[Callable[[str], Piece | None], list[str]]:
    """``(find, names)``: ``find(module)`` is the piece a foreign module name (peft's, from
    the model with its LM head or from the bare base model without the layout's prefix)
    stands for, or ``None``; ``names`` are every module name in order."""
    _, keymap = layout_of(model)
    found = pieces(model)
    known = {piece.module: piece for piece in found}
    prefixes = () if keymap is None else tuple(keymap.strip_prefixes)  # type: ignore[attr-defined]

    def find(module: str) -> Piece | None:
        return known.get(module) or next(
            (known[p + module] for p in prefixes if p + module in known), None
        )

    return find, list(known)
