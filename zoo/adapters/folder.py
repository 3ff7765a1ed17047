"""The adapter folder: ``adapter_config.json`` + ``adapter_model.safetensors`` as peft writes
them, with zoo's record of the base in the safetensors metadata.

:func:`save_adapter` writes a model's adapters under their foreign module names (peft's
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` for a family with a Hugging
Face layout; zoo's part paths for one without), :func:`read_adapter` reads such a folder for a
model (peft's or zoo's) and refuses what zoo cannot honour exactly, naming the key, and
:func:`apply_adapter` attaches it, refusing a base other than the one it was trained on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

from .. import jsonfile
from ..checkpoint.commit import atomic_directory, pinned_version
from ..checkpoint.files import read_safetensors, write_safetensors
from ..errors import CheckpointError
from .layout import Piece, Unit, module_lookup, pieces, units
from .lora import (
    LayerAdapter,
    LoRA,
    LowRank,
    PartPlan,
    adapted_layers,
    attach_lora,
    detach_lora,
    load_adapter_state,
)
from .lora_check import check_update
from .peft_config import CONFIG_FILE, WEIGHTS_FILE, LoraSettings, check_config, peft_config
from .record import BaseRecord, base_fingerprint

__all__ = ["Adapter", "apply_adapter", "check_adapter_base", "read_adapter", "save_adapter"]

_PREFIX = "base_model.model."
_KEY = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<which>[AB])\.weight")
_MAX_CONFIG = 1 << 20  # bytes: an adapter_config.json is a few kB


@dataclasses.dataclass(frozen=True)
class Adapter:
    """An adapter read from a folder, ready for :func:`apply_adapter`: its ``lora``
    settings, the ``plans`` (part path -> rank and scaling), the weights by zoo's names
    (``"<part path>.A"``, ``"<part path>.B"``) and the ``base`` it was trained on (``None``
    for an adapter without zoo's record, e.g. one peft wrote)."""

    lora: LoRA
    plans: Mapping[str, PartPlan]
    state: Mapping[str, Tensor]
    base: BaseRecord | None

    @property
    def parameters(self) -> int:
        """The number of adapter weights."""
        return sum(t.numel() for t in self.state.values())


def _tail(name: str, depth: int) -> str:
    return ".".join(name.split(".")[-depth:])


def compact_names(chosen: Iterable[str], every: Iterable[str], depth: int) -> tuple[str, ...]:
    """Names that select exactly ``chosen`` among ``every`` by their ends: the last ``depth``
    components where every name ending so is chosen, else the whole name."""
    chosen = set(chosen)
    groups: dict[str, set[str]] = {}
    for name in every:
        groups.setdefault(_tail(name, depth), set()).add(name)
    names = (
        _tail(name, depth) if groups.get(_tail(name, depth), {name}) <= chosen else name
        for name in sorted(chosen)
    )
    return tuple(dict.fromkeys(names))


def _model_adapters(model: nn.Module) -> dict[str, LowRank]:
    """The model's adapters by part path (the layer path for a layer adapted whole)."""
    found: dict[str, LowRank] = {}
    for path, layer in adapted_layers(model).items():
        adapter = layer.lora
        if not isinstance(adapter, LayerAdapter):
            raise ValueError(f"{path} carries a {type(adapter).__name__}, not a LoRA adapter")
        owner = path.rpartition(".")[0]
        for name, low in adapter.low.items():
            found[f"{owner}.{name}" if owner else name] = cast(LowRank, low)
    return found


def _place(unit: Unit, layer_pieces: list[Piece]) -> list[Piece]:
    """The foreign modules that together hold exactly the rows of ``unit``."""
    inside = [
        p for p in layer_pieces if bool(((p.rows >= unit.start) & (p.rows < unit.stop)).all())
    ]
    rows = torch.cat([p.rows for p in inside]).sort().values if inside else torch.empty(0)
    if not torch.equal(rows, torch.arange(unit.start, unit.stop)):
        raise CheckpointError(
            f"{unit.path}: this model's checkpoint layout stores {unit.layer} whole, so an "
            "adapter on one of its parts has no place in peft's format; adapt the whole layer "
            "(plan_lora(..., per_part=zoo.adapters.per_part(model)))"
        )
    return inside


def save_adapter(
    model: nn.Module, directory: str | os.PathLike[str], *, base: BaseRecord, lora: LoRA
) -> Path:
    """Write ``model``'s adapters to ``directory`` as peft does (atomically): the weights of
    each adapter under its foreign module's name (``float`` as trained), and an
    ``adapter_config.json`` with ``lora``'s rank, alpha and dropout (``rank_pattern`` /
    ``alpha_pattern`` for adapters that differ). ``base`` is recorded in the weights file's
    metadata; :func:`apply_adapter` checks it.

    Raises:
        ValueError: the model has no adapters.
        CheckpointError: an adapter has no place in the model's checkpoint layout.
    """
    adapters = _model_adapters(model)
    if not adapters:
        raise ValueError("the model has no LoRA adapters to save (attach_lora first)")
    every = pieces(model)
    layers: dict[str, list[Piece]] = {}
    for piece in every:
        layers.setdefault(piece.layer, []).append(piece)
    places = units(model)
    tensors: dict[str, Tensor] = {}
    plans: dict[str, PartPlan] = {}
    transposed = False
    for path, low in adapters.items():
        unit = places[path]
        for piece in _place(unit, layers.get(unit.layer, [])):
            a, b = low.A.detach(), low.B.detach()
            tensors[f"{_PREFIX}{piece.module}.lora_A.weight"] = a.cpu().clone()
            rows = piece.rows - unit.start  # (rows,): the piece's rows of the unit, its order
            tensors[f"{_PREFIX}{piece.module}.lora_B.weight"] = b.cpu()[rows].contiguous()
            plans[piece.module] = PartPlan(a.shape[0], low.scaling)
            transposed |= piece.fan_in_fan_out
    odd = {m: p for m, p in plans.items() if (p.rank, p.scaling) != (lora.rank, lora.scaling)}
    config = peft_config(
        rank=lora.rank,
        alpha=lora.alpha,
        dropout=lora.dropout,
        target_modules=compact_names(plans, (p.module for p in every), 1),
        fan_in_fan_out=transposed,
        rank_pattern={m: p.rank for m, p in odd.items()},
        alpha_pattern={m: p.scaling * p.rank for m, p in odd.items()},
        base=base.repo or base.name,
        revision=base.revision,
        task_type="SEQ_2_SEQ_LM" if getattr(model, "is_encoder_decoder", False) else "CAUSAL_LM",
    )
    with atomic_directory(directory) as staging:
        write_safetensors(tensors, staging / WEIGHTS_FILE, {"format": "pt", **base.to_metadata()})
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        (staging / CONFIG_FILE).write_text(text, encoding="utf-8")
    return Path(directory)


def _read_config(folder: Path, where: Path) -> LoraSettings:
    path = folder / CONFIG_FILE
    if not path.is_file():
        pickled = (
            " (it holds adapter_model.bin: a pickle, which zoo never loads)"
            if (folder / "adapter_model.bin").exists()
            else ""
        )
        raise CheckpointError(
            f"{where} is not an adapter folder: it has no {CONFIG_FILE}{pickled}", path=where
        )
    if path.stat().st_size > _MAX_CONFIG:
        raise CheckpointError(f"{where / CONFIG_FILE} is over {_MAX_CONFIG} bytes", path=path)
    try:
        config = jsonfile.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON, nested too deep
        raise CheckpointError(
            f"{where / CONFIG_FILE} is not valid JSON: {exc}", path=path
        ) from None
    return check_config(config, str(where / CONFIG_FILE))


def _pairs(tensors: Mapping[str, Tensor], where: str) -> dict[str, dict[str, Tensor]]:
    """``{module: {"A": tensor, "B": tensor}}`` from peft's keys."""
    found: dict[str, dict[str, Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.fullmatch(key)
        if m is None:
            raise CheckpointError(
                f"{where}: key {key!r} is not a LoRA weight (base_model.model.<module>."
                "lora_A.weight / lora_B.weight); zoo reads plain LoRA adapters",
                path=where,
            )
        if not tensor.is_floating_point() or tensor.ndim != 2 or 0 in tensor.shape:
            raise CheckpointError(
                f"{where}: {key} is {tensor.dtype} {tuple(tensor.shape)}; a LoRA weight is a "
                "non-empty 2-D float matrix",
                path=where,
            )
        if not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{where}: {key} holds NaN or infinite values", path=where)
        found.setdefault(m["module"], {})[m["which"]] = tensor
    for module, pair in found.items():
        if len(pair) != 2:
            lacking = "B" if "A" in pair else "A"
            raise CheckpointError(
                f"{where}: {_PREFIX}{module}.lora_{lacking}.weight is missing", path=where
            )
    return found


def _unit_of(piece: Piece, places: Mapping[str, Unit]) -> Unit | None:
    """The zoo adapter that holds exactly ``piece``'s rows (a part, else the layer whole)."""
    low, high = int(piece.rows.min()), int(piece.rows.max()) + 1
    layer = places[piece.layer]
    candidates = [
        u for u in places.values() if u.layer == piece.layer and (u.start, u.stop) == (low, high)
    ]
    fits = [u for u in candidates if u.path != layer.path] or candidates
    return fits[0] if fits and high - low == len(piece.rows) else None


def _convert(
    pairs: Mapping[str, Mapping[str, Tensor]],
    settings: LoraSettings,
    model: nn.Module,
    where: str,
) -> tuple[dict[str, PartPlan], dict[str, Tensor]]:
    """The plans and zoo-named weights of peft's ``pairs`` on ``model``."""
    find, names = module_lookup(model)
    places = units(model)
    plans: dict[str, PartPlan] = {}
    state: dict[str, Tensor] = {}
    for module, pair in sorted(pairs.items()):
        key = f"{_PREFIX}{module}.lora_A.weight"
        piece = find(module)
        unit = None if piece is None else _unit_of(piece, places)
        if piece is None or unit is None:
            raise CheckpointError(
                f"{where}: {key} adapts {module!r}, which is not a linear layer of this model "
                f"(it has e.g. {', '.join(names[:4])})",
                path=where,
            )
        a, b = pair["A"], pair["B"]
        rank = a.shape[0]
        if a.shape[1] != unit.in_features or b.shape != (len(piece.rows), rank):
            raise CheckpointError(
                f"{where}: {module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not "
                f"fit the layer ({unit.in_features} in, {len(piece.rows)} out)",
                path=where,
            )
        if rank != settings.rank_of(module):
            raise CheckpointError(
                f"{where}: {key} has rank {rank}, but adapter_config.json ('r' / "
                f"'rank_pattern') gives {module} rank {settings.rank_of(module)}",
                path=where,
            )
        if unit.path in plans:
            raise CheckpointError(f"{where}: {key}: {unit.path} is adapted twice", path=where)
        scaling = settings.scaling(module, rank)
        try:
            check_update(f"{_PREFIX}{module}.lora_B.weight @ lora_A.weight", a, b, scaling)
        except ValueError as exc:
            raise CheckpointError(f"{where}: {exc}", path=where) from None
        zoo_b = torch.empty_like(b)
        zoo_b[piece.rows - unit.start] = b  # the piece's row order -> zoo's
        plans[unit.path] = PartPlan(rank, scaling)
        state[f"{unit.path}.A"], state[f"{unit.path}.B"] = a, zoo_b
    return plans, state


def _check_targets(settings: LoraSettings, modules: Iterable[str], where: str) -> None:
    """Every name of ``target_modules`` ends some linear layer's module name."""
    names = list(modules)
    for target in settings.target_modules or ():
        if not any(n == target or n.endswith("." + target) for n in names):
            raise CheckpointError(
                f"{where}: 'target_modules' names {target!r}, which is no linear layer of this "
                f"model (its modules end e.g. {sorted({_tail(n, 1) for n in names})[:8]})",
                path=where,
            )


def read_adapter(directory: str | os.PathLike[str], *, model: nn.Module) -> Adapter:
    """Read the adapter folder ``directory`` (zoo's or peft's) for ``model``: peft's module
    names are mapped to zoo's part paths through the model's checkpoint layout.

    Only ``adapter_config.json`` and ``adapter_model.safetensors`` are read (never a
    pickle).

    Raises:
        CheckpointError: a missing or damaged file, a config key zoo cannot honour (DoRA,
            ``modules_to_save``, a bias, ...), a target or weight that names no layer of
            the model, or a shape that does not fit; each names the key.
    """
    where = Path(directory)
    with pinned_version(where) as folder:
        settings = _read_config(folder, where)
        weights = str(where / WEIGHTS_FILE)
        tensors, metadata = read_safetensors(folder / WEIGHTS_FILE)
        if not tensors:
            raise CheckpointError(f"{weights} holds no weights", path=weights)
        base = BaseRecord.from_metadata(metadata, where=weights)
        pairs = _pairs(tensors, weights)
    _check_targets(settings, (p.module for p in pieces(model)), str(where / CONFIG_FILE))
    plans, state = _convert(pairs, settings, model, weights)
    every = units(model)
    targets = compact_names(plans, every, 2)
    lora = LoRA(settings.rank, settings.alpha, settings.dropout, targets)
    return Adapter(lora=lora, plans=plans, state=state, base=base)


def check_adapter_base(adapter: Adapter, fingerprint: str, model: nn.Module) -> None:
    """Refuse ``model`` (whose weights' :func:`~zoo.adapters.base_fingerprint` is
    ``fingerprint``) when ``adapter`` records another base.

    Raises:
        CheckpointError: the model is not the adapter's base (both named).
    """
    if adapter.base is None or fingerprint == adapter.base.sha256:
        return
    name = getattr(model, "name", None) or type(model).__name__
    raise CheckpointError(
        f"this adapter was trained on {adapter.base.describe()}, not on this model "
        f"({name}, sha256 {fingerprint[:12]}); load it on its own base (or pass "
        "check_base=False to apply it anyway)",
        expected=adapter.base.sha256,
        actual=fingerprint,
    )


def apply_adapter(
    model: nn.Module,
    adapter: Adapter,
    *,
    check_base: bool = True,
    fingerprint: str | None = None,
) -> list[str]:
    """Attach ``adapter`` to ``model`` (in place, base frozen) and load its weights, all or
    nothing. Returns the adapted layers' paths.

    Args:
        check_base: refuse a model other than the adapter's base (by the fingerprint of its
            weights, :func:`~zoo.adapters.base_fingerprint`) when the adapter records one.
        fingerprint: the model's fingerprint, when it was taken before (a quantized base's,
            taken from its float weights before quantizing).

    Raises:
        CheckpointError: the model is not the adapter's base (both named).
        ValueError: the model already has adapters.
    """
    if check_base:
        check_adapter_base(adapter, fingerprint or base_fingerprint(model), model)
    done = attach_lora(model, adapter.plans, dropout=adapter.lora.dropout)
    try:
        load_adapter_state(model, adapter.state)
    except BaseException:
        detach_lora(model)
        raise
    return done
