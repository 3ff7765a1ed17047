"""The small models the conformance checks build: :func:`small_overrides` shrinks a named
model's shared size fields to a :class:`Geometry` and keeps what makes it that model
(grouped heads, a separate head size, a sliding window its prompts exceed, every kind of
per-layer value, a partial rotary share); :func:`reference_draws` gives the reference
check's several small models."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from ..api import build, resolve_config
from ..nn.base import ZooModel

__all__ = [
    "SECOND",
    "SMALL",
    "SMALL_SIZES",
    "SMALL_WINDOW",
    "Geometry",
    "reference_draws",
    "reference_overrides",
    "small_model",
    "small_overrides",
]

#: Sizes used to shrink a model for the checks (only fields its config has are applied),
#: beside those of its :class:`Geometry` (heads, width, layers).
SMALL_SIZES: dict[str, int] = {
    "d_ff": 128,
    "context_length": 64,
    "vocab_size": 1000,
}


#: A sliding window the checks' prompts exceed (a larger one is shrunk to it).
SMALL_WINDOW = 5


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The attention geometry and depth a small model is drawn with: ``heads`` query heads
    of 16 features (``d_model = 16 * heads``; 32 each where the model sets ``head_dim``),
    ``kv_heads`` key/value heads where the model groups them (a multi-query model keeps its
    one), ``layers`` layers (an encoder-decoder: ``layers - 1`` encoder layers)."""

    heads: int = 4
    kv_heads: int = 2
    layers: int = 2


#: What every check builds: four heads, two key/value heads, two layers.
SMALL = Geometry()

#: The reference check's second draw: six heads (not a power of two: ALiBi's slopes differ
#: there), one key/value head (multi-query) where the model groups them, three layers.
SECOND = Geometry(heads=6, kv_heads=1, layers=3)


def small_overrides(name: str, geometry: Geometry = SMALL) -> dict[str, Any]:
    """Overrides that shrink ``name`` to a model that checks quickly on a CPU, of
    ``geometry``."""
    _, _, config = resolve_config(name)
    fields = type(config).field_names()
    sizes = SMALL_SIZES | {
        "n_heads": geometry.heads,
        "d_model": 16 * geometry.heads,
        "n_layers": geometry.layers,
        "n_decoder_layers": geometry.layers,
        "n_encoder_layers": geometry.layers - 1,
    }
    small: dict[str, Any] = {k: v for k, v in sizes.items() if k in fields}
    kv_heads = getattr(config, "n_kv_heads", None)
    if kv_heads is not None:  # grouped stays grouped, multi-query stays multi-query
        small["n_kv_heads"] = 1 if kv_heads == 1 else geometry.kv_heads
    if getattr(config, "head_dim", None) is not None:
        small["head_dim"] = 32  # heads stay apart from d_model / n_heads = 16
    window = getattr(config, "sliding_window", None)
    if isinstance(window, int) and window > SMALL_WINDOW:
        small["sliding_window"] = SMALL_WINDOW  # shorter than the prompts the checks run
    small |= _per_layer_fields(config, fields, small)
    small |= token_ids_within(config, small)
    rotary = getattr(config, "rotary_dim", None)
    if isinstance(rotary, int) and "d_model" in small:  # partial rotary stays partial, and fits
        c: Any = config  # a TransformerConfig: it has rotary_dim
        head = small.get("head_dim") or small["d_model"] // small.get("n_heads", c.n_heads)
        small["rotary_dim"] = max(2, rotary * head // c.head_size // 2 * 2)
    return small


def token_ids_within(config: Any, sizes: dict[str, Any]) -> dict[str, Any]:
    """The token ids ``config`` names (an encoder-decoder's ``decoder_start_id``) moved inside
    the vocabulary ``sizes`` shrinks it to: the last id, as Marian's pad is; none where they
    fit already."""
    start = getattr(config, "decoder_start_id", None)
    if isinstance(start, int) and start >= sizes.get("vocab_size", start + 1):
        return {"decoder_start_id": sizes["vocab_size"] - 1}
    return {}


def _per_layer_fields(config: Any, fields: Iterable[str], small: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``config`` holding one value per layer (``layer_types``, or the kinds a
    ``layer_pattern`` repeats), shortened to the small model's ``n_layers`` with every kind
    kept; none when the layers are not shrunk."""
    layers = getattr(config, "n_layers", None)
    if "n_layers" not in small or not layers:
        return {}
    shrunk: dict[str, Any] = {}
    if getattr(config, "layer_pattern", None) is not None:  # listed, to keep every kind
        kinds = tuple(config.layer_type(i) for i in range(layers))
        shrunk |= {"layer_types": _per_layer(kinds, small["n_layers"]), "layer_pattern": None}
    for field in fields:
        value = getattr(config, field, None)
        if isinstance(value, tuple) and len(value) == layers and field != "n_layers":
            shrunk[field] = _per_layer(value, small["n_layers"])
    return shrunk


def _per_layer(values: tuple[Any, ...], n: int) -> tuple[Any, ...]:
    """The first ``n`` of per-layer ``values``, the last ones replaced by any kind the first
    ``n`` lack (Gemma 3's five sliding layers then one full become sliding, full)."""
    kinds = list(dict.fromkeys(values))
    head = list(values[:n])
    missing = [kind for kind in kinds if kind not in head][: max(n - 1, 0)]
    return tuple(head[: n - len(missing)] + missing)


def small_model(name: str, device: str, dtype: torch.dtype | None = None) -> ZooModel:
    """``name`` built small (:func:`small_overrides`) on ``device``, seeded: the same
    weights every time."""
    torch.manual_seed(0)
    return build(name, device=device, dtype=dtype, **small_overrides(name))


def reference_draws(name: str, arch: Any) -> list[tuple[str, dict[str, Any]]]:
    """The small models the reference check compares, each with its label:
    :data:`SMALL`, the same moved off the defaults
    (:func:`~zoo.testing.config_trip.moved_off_defaults`: transformers computes with its
    default where a layout writes a value under a key it does not read), and :data:`SECOND`
    (six heads, one key/value head where grouped, three layers), each field a Hugging Face
    layout holds only one value of kept at the first draw's (:func:`reference_overrides`
    each)."""
    from ..checkpoint.write import hf_layouts
    from .config_trip import moved_off_defaults

    _, _, config = resolve_config(name)
    layouts = hf_layouts(arch)
    pinned = _pinned(arch, layouts)
    draws: list[tuple[str, dict[str, Any]]] = []
    for geometry in (SMALL, SECOND):
        small = reference_overrides(name, geometry)
        if draws:
            first = draws[0][1]
            small |= {f: first[f] for f in pinned if f in first and small.get(f) != first[f]}
        if all(small != drawn for _, drawn in draws):
            draws.append((_drawn(geometry, small), small))
        if geometry is SMALL and layouts:
            moved, names = moved_off_defaults(arch, layouts[0], config.replace(**small))
            if names:
                values = {field: getattr(moved, field) for field in names}
                draws.append((f"{draws[0][0]}, {', '.join(names)} moved", small | values))
    return draws


def _pinned(arch: Any, layouts: list[str]) -> set[str]:
    """The fields some Hugging Face layout of ``arch`` holds only one value of."""
    from ..checkpoint.hf_layout import ANY

    return {
        field
        for layout in layouts
        for field, held in arch.checkpoint_layout(layout).represents.items()
        if held is not ANY
    }


def reference_overrides(name: str, geometry: Geometry = SMALL) -> dict[str, Any]:
    """:func:`small_overrides` for a reference comparison: the feed-forward four times the
    width where the named model's is (GPT-1's layout requires it)."""
    small = small_overrides(name, geometry)
    _, _, config = resolve_config(name)
    d_model, d_ff = getattr(config, "d_model", None), getattr(config, "d_ff", None)
    if "d_ff" in small and d_model and d_ff == 4 * d_model:
        return small | {"d_ff": 4 * small["d_model"]}
    return small


def _drawn(geometry: Geometry, small: dict[str, Any]) -> str:
    """The geometry a note speaks of: ``6 heads (1 key/value), 3 layers``."""
    heads = small.get("n_heads", geometry.heads)
    kv = small.get("n_kv_heads")
    layers = small.get("n_layers", small.get("n_decoder_layers", geometry.layers))
    grouped = f" ({kv} key/value)" if kv is not None else ""
    return f"{heads} heads{grouped}, {layers} layers"
