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

A layout that also rewrites whole state dicts (``merge_foreign`` on import, ``split_foreign``
on export: T5's gated feed-forward stored as ``wi_0`` and ``wi_1``, the encoder-decoders'
tied embeddings and logits bias) carries adapters when its ``split_foreign`` only moves rows
of each linear layer's weight: each layer's foreign weights are passed through it with every
row holding its own index, and the rows that come out are the pieces. A layout whose
``split_foreign`` changes a layer's values is refused: zoo could not carry an adapter
through it exactly. A ``merge_foreign`` without a ``split_foreign`` only reads other
spellings of what export writes (its rules' output is the foreign checkpoint), so the
adapters' modules are those export writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import cast

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
    return names[0], arch.checkpoint_layout(names[0])


def _whole_states(layout: str, family: str, why: str) -> CheckpointError:
    """The refusal of a layout whose whole-state transform adapters cannot go through."""
    return CheckpointError(
        f"the {layout!r} layout transforms whole state dicts ({why}), which zoo cannot carry "
        f"adapters through exactly; adapters of {family!r} cannot be read or written in "
        "peft's format"
    )


def _prefix(keymap: object, layer: str) -> str:
    """What the foreign model's module names add to the layout's keys: the prefix it strips
    (GPT-2's ``transformer.``), for every layer but the LM head, which sits beside it."""
    prefixes = keymap.strip_prefixes  # type: ignore[attr-defined]
    return prefixes[0] if prefixes and layer != "head" else ""


def _rule_pieces(keymap: object, config: ModelConfig, key: str, index: Tensor) -> list[Piece]:
    """The foreign weights the layout's rules make of zoo weight ``key`` (``index``: each
    row holds its own number), named as in the checkpoint, each with its rows (before any
    ``split_foreign``)."""
    layer = key.removesuffix(".weight")
    for rule in keymap.fused:  # type: ignore[attr-defined]
        try:
            split = rule.split({key: index}, config)
        except (RuntimeError, ValueError, AttributeError):
            continue  # the sizes do not fit this layer
        if split:
            return [Piece(name, layer, rows[:, 0]) for name, rows in split.items()]
    for rule in keymap.rules:  # type: ignore[attr-defined]
        foreign = rule.match(key, side="zoo")
        if foreign is not None:
            plain = dataclasses.replace(rule, transpose=False)  # A and B are never transposed
            rows = plain.convert(index, config, side="zoo")[:, 0]
            return [Piece(foreign, layer, rows, rule.transpose)]
    return []


def _moved(rows: Tensor, shifted: Tensor | None, known: set[int]) -> bool:
    """Whether ``rows`` (what a transform made of row numbers) and ``shifted`` (what it made
    of them plus one half) hold rows of the numbers ``known``, unchanged."""
    return (
        shifted is not None
        and rows.ndim == 2
        and rows.shape[1] == 1
        and torch.equal(shifted, rows + 0.5)
        and torch.equal(rows, rows.round())
        and {int(r) for r in rows[:, 0]} <= known
    )


def _split_rows(
    layout: str, keymap: object, config: ModelConfig, found: list[Piece]
) -> list[Piece]:
    """``found`` (foreign weights and their rows) through the layout's ``split_foreign``:
    the weights it writes instead and the rows each holds. It runs twice, on the rows'
    numbers and on them plus one half, so that any change of values (not a move of rows)
    shows."""
    split = keymap.split_foreign  # type: ignore[attr-defined]
    if split is None or not found:
        return found
    transposed = {piece.module: piece.fan_in_fan_out for piece in found}
    try:
        outs = [
            split({p.module: p.rows[:, None].double() + shift for p in found}, config)
            for shift in (0.0, 0.5)
        ]
    except Exception as exc:  # a transform that needs the whole state
        raise _whole_states(layout, type(config).architecture, f"split_foreign: {exc}") from None
    rows_of: list[Piece] = []
    known = {int(r) for p in found for r in p.rows}
    for name, rows in outs[0].items():
        if not _moved(rows, outs[1].get(name), known):
            raise _whole_states(
                layout,
                type(config).architecture,
                f"split_foreign changes the values of {name}, not only where its rows go",
            )
        rows_of.append(Piece(name, found[0].layer, rows[:, 0].long(), transposed.get(name, False)))
    return rows_of


def _layer_pieces(
    layout: str, keymap: object, config: ModelConfig, layer: str, out: int
) -> list[Piece]:
    """The foreign modules of zoo layer ``layer`` (``out`` rows) in ``keymap``, named as
    in the foreign model with its LM head (peft's names)."""
    key = f"{layer}.weight"
    index = torch.arange(out).reshape(out, 1)  # (out, 1): each row holds its own index
    found = _split_rows(layout, keymap, config, _rule_pieces(keymap, config, key, index))
    prefix = _prefix(keymap, layer)
    return [
        dataclasses.replace(piece, module=prefix + piece.module.removesuffix(".weight"))
        for piece in found
        if piece.module.endswith(".weight")
    ]


def pieces(model: nn.Module) -> list[Piece]:
    """Every foreign module the model's linear layers map to (in layer order); zoo's own
    part paths for a family without a Hugging Face layout."""
    layout_name, keymap = layout_of(model)
    config = cast(ModelConfig, model.config)
    found: list[Piece] = []
    for layer, owner, module, parts in layer_parts(model):
        if keymap is None:
            start = 0
            for name, rows in parts:
                path = layer if len(parts) == 1 else _join(owner, name)
                found.append(Piece(path, layer, torch.arange(start, start + rows)))
                start += rows
        else:
            out = int(module.out_features)  # type: ignore[arg-type]
            found += _layer_pieces(str(layout_name), keymap, config, layer, out)
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
