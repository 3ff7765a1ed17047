"""Low-rank adapters (LoRA, Hu et al. 2021) on zoo's linear layers.

An adapted linear layer computes ``base(x) + B(A(dropout(x))) * alpha / rank`` with ``A``
``(rank, in)`` and ``B`` ``(out, rank)``, initialised as peft does it (``A`` Kaiming-uniform,
``B`` zero, so a fresh adapter changes nothing). The base layer is left as it is (a
:class:`~zoo.nn.Linear`, a oneDNN or a quantized one): the adapter is a child module named
``lora`` that a forward hook adds on, so the model's own state dict keeps its keys, and
detaching puts the model back bit for bit.

A fused layer (self-attention's ``qkv``, a gated feed-forward's ``fc``) is several layers in
one; its owner says so with ``lora_parts()`` (``{"qkv": (("q", rows), ("k", rows), ("v",
rows))}``), and each part gets an adapter of its own: a fused adapter is the stack of the
separate ones, as peft's ``q_proj``/``k_proj``/``v_proj`` adapters are.

Every adapter of a model is named by its *part path*: the owner's path and the part's name
(``blocks.0.attn.q``, ``blocks.0.ffn.gate``), or the layer's own path when it is not fused
(``blocks.0.attn.proj``). A target (:attr:`LoRA.targets`) names a layer or a part by the end
of its path: ``attn.qkv`` adapts all three parts, ``attn.q`` only the queries,
``blocks.0.attn.proj`` one layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn

from .lora_check import check_update
from .lora_config import DEFAULT_TARGETS, LoRA, PartPlan, Parts

__all__ = [
    "DEFAULT_TARGETS",
    "LayerAdapter",
    "LoRA",
    "LowRank",
    "PartPlan",
    "adapted_layers",
    "adapter_parameters",
    "adapter_placement",
    "adapter_state",
    "attach_lora",
    "detach_lora",
    "install_adapter",
    "layer_parts",
    "load_adapter_state",
    "merge_lora",
    "part_path",
    "plan_lora",
    "refuse_adapted",
    "target_names",
]


class LowRank(nn.Module):
    """The adapter of one part: ``B(A(x)) * scaling``, ``(*, in) -> (*, out)``.

    ``A`` ``(rank, in)`` starts Kaiming-uniform and ``B`` ``(out, rank)`` at zero (peft's
    default), so a new adapter adds nothing."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        scaling: float,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.A = nn.Parameter(torch.empty(rank, in_features, device=device, dtype=dtype))
        self.B = nn.Parameter(torch.zeros(out_features, rank, device=device, dtype=dtype))
        self.scaling = scaling
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(nn.functional.linear(x, self.A), self.B) * self.scaling

    def weight_delta(self) -> Tensor:
        """The update as a weight, ``(out, in)``."""
        return (self.B @ self.A) * self.scaling

    def extra_repr(self) -> str:
        rank, in_features = self.A.shape
        return f"{in_features} -> {self.B.shape[0]}, rank={rank}, scaling={self.scaling:g}"


class LayerAdapter(nn.Module):
    """The adapters of one linear layer, one :class:`LowRank` per adapted part; its forward
    takes the layer's input and output and returns the output with the updates added.

    Args:
        in_features: the layer's input width.
        parts: every part of the layer in output order, ``(name, rows)``.
        plans: the adapted parts by name.
        dropout: dropout on the adapters' input.
    """

    def __init__(
        self,
        in_features: int,
        parts: Parts,
        plans: Mapping[str, PartPlan],
        dropout: float = 0.0,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        unknown = sorted(set(plans) - {name for name, _ in parts})
        if unknown:
            raise ValueError(f"no parts {unknown} in this layer; it has {[n for n, _ in parts]}")
        self.parts = parts
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.low = nn.ModuleDict(
            {
                name: LowRank(
                    in_features,
                    rows,
                    plans[name].rank,
                    plans[name].scaling,
                    device=device,
                    dtype=dtype,
                )
                for name, rows in parts
                if name in plans
            }
        )

    def forward(self, x: Tensor, out: Tensor) -> Tensor:
        """``out`` (the layer's output for ``x``) plus each adapted part's update."""
        x = self.dropout(x.to(self._dtype()))
        if len(self.parts) == 1:
            ((name, _),) = self.parts
            return out + self.low[name](x).to(out.dtype)
        # one product for every part's A, one for their B side by side:
        # (*, in) -> (*, sum of ranks) -> (*, out)
        lows = self._lows()
        h = nn.functional.linear(x, torch.cat([low.A for low in lows.values()]))
        return out + nn.functional.linear(h, self._block_b(lows)).to(out.dtype)

    def _block_b(self, lows: dict[str, LowRank]) -> Tensor:
        """Each adapted part's ``B * scaling`` in its rows and its rank's columns, zero
        elsewhere: ``(out, sum of ranks)``, columns in the order of ``lows``."""
        some = next(iter(lows.values())).B
        return torch.block_diag(
            *(
                lows[name].B * lows[name].scaling if name in lows else some.new_zeros(rows, 0)
                for name, rows in self.parts
            )
        )

    def _lows(self) -> dict[str, LowRank]:
        return {name: cast(LowRank, low) for name, low in self.low.items()}

    def _dtype(self) -> torch.dtype:
        return next(iter(self._lows().values())).A.dtype

    def weight_delta(self) -> Tensor:
        """The whole layer's update as a weight, ``(out, in)`` (zero rows for parts left
        alone)."""
        lows = self._lows()
        some = next(iter(lows.values())).A
        return torch.cat(
            [
                lows[name].weight_delta() if name in lows else some.new_zeros(rows, some.shape[1])
                for name, rows in self.parts
            ]
        )


def _add_update(module: nn.Module, args: tuple[Any, ...], out: Tensor) -> Tensor:
    """The forward hook of an adapted layer."""
    return module.lora(args[0], out)  # type: ignore[operator]


def _is_linear(module: nn.Module) -> bool:
    """A linear layer zoo can adapt: any module with ``in_features``/``out_features`` and a
    2-D weight of some kind (float, oneDNN, int8, int4, torch's dynamic int8)."""
    return (
        isinstance(getattr(module, "in_features", None), int)
        and isinstance(getattr(module, "out_features", None), int)
        and not isinstance(module, (LowRank, nn.Embedding))
    )


def part_path(owner: str, name: str) -> str:
    """The path of part (or child) ``name`` of the module at path ``owner``."""
    return f"{owner}.{name}" if owner else name


def refuse_adapted(model: nn.Module) -> None:
    """Refuse a model that already carries adapters (:func:`attach_lora` and
    :mod:`zoo.adapters.lora_bank` attach to a bare base only)."""
    if adapted_layers(model):
        raise ValueError("this model already has LoRA adapters; detach_lora(model) first")


def layer_parts(
    model: nn.Module,
) -> Iterator[tuple[str, str, nn.Module, Parts]]:
    """Every linear layer of ``model`` that may be adapted: ``(layer path, owner path, layer,
    parts)``, where ``parts`` are ``(name, rows)`` in output order, from the owner's
    ``lora_parts()`` for a fused layer, else one part named as the layer."""
    for owner_path, owner in model.named_modules():
        if isinstance(owner, (LayerAdapter, LowRank)):
            continue
        fused: Mapping[str, Parts] = (
            owner.lora_parts() if callable(getattr(owner, "lora_parts", None)) else {}
        )
        for name, child in owner.named_children():
            if not _is_linear(child):
                continue
            parts = fused.get(name) or ((name, int(child.out_features)),)
            if sum(rows for _, rows in parts) != child.out_features:
                raise ValueError(
                    f"{part_path(owner_path, name)}: lora_parts() gives {sum(r for _, r in parts)} "
                    f"rows for a layer of {child.out_features}"
                )
            yield part_path(owner_path, name), owner_path, child, parts


def _matches(path: str, target: str) -> bool:
    return path == target or path.endswith("." + target)


def target_names(model: nn.Module) -> list[str]:
    """The short names a target may use on ``model`` (``attn.qkv``, ``attn.q``, ``head``),
    sorted; any longer end of a path works too."""
    names: set[str] = set()
    for layer, owner, _, parts in layer_parts(model):
        names.add(".".join(layer.split(".")[-2:]))
        if len(parts) > 1:
            names.update(".".join(part_path(owner, p).split(".")[-2:]) for p, _ in parts)
    return sorted(n for n in names if not n.split(".")[0].isdigit())


def plan_lora(
    model: nn.Module,
    lora: LoRA,
    *,
    default_targets: Iterable[str] = DEFAULT_TARGETS,
    per_part: Callable[[str], bool] | None = None,
) -> dict[str, PartPlan]:
    """The part paths ``lora`` adapts on ``model``, each with its rank and scaling.

    ``per_part(layer path)`` says whether a fused layer gets an adapter per part (default:
    yes, as for a checkpoint layout that stores q/k/v apart) or one over the whole layer,
    keyed by the layer's path (a layout that stores it fused too: GPT-2's ``c_attn``).

    Raises:
        ValueError: a target that names no layer or part of the model (the message lists
            the names it has), or a part of a layer adapted whole.
    """
    targets = lora.targets if lora.targets is not None else tuple(default_targets)
    plan = PartPlan(lora.rank, lora.scaling)
    plans: dict[str, PartPlan] = {}
    hit: set[str] = set()
    for layer, owner, _, parts in layer_parts(model):
        split = len(parts) > 1 and (per_part is None or per_part(layer))
        for target in targets:
            paths = _targeted(layer, owner, parts, target, split=split)
            plans.update(dict.fromkeys(paths, plan))
            hit.update([target] if paths else [])
    missing = [t for t in targets if t not in hit]
    if missing:
        raise ValueError(
            f"LoRA targets {missing} name no linear layer of this model; it has "
            f"{', '.join(target_names(model))}"
        )
    return plans


def _targeted(layer: str, owner: str, parts: Parts, target: str, *, split: bool) -> list[str]:
    """The part paths of one layer that ``target`` names: its parts', or (a fused layer
    adapted whole, ``split`` false) the layer's own path."""
    whole = _matches(layer, target)
    if whole and not split:
        return [layer]
    paths = [part_path(owner, name) for name, _ in parts]
    named = [path for path in paths if whole or _matches(path, target)]
    if named and not split and named != [layer]:
        raise ValueError(
            f"LoRA target {target!r}: {layer} is adapted as one layer in this model's "
            f"checkpoint layout, not per part; target {'.'.join(layer.split('.')[-2:])!r}"
        )
    return named


def attach_lora(
    model: nn.Module,
    plans: Mapping[str, PartPlan],
    *,
    dropout: float = 0.0,
    dtype: torch.dtype | None = None,
    freeze: bool = True,
) -> list[str]:
    """Give ``model`` an adapter on each part path of ``plans`` (:func:`plan_lora`), in
    place, and (``freeze``) stop gradients to everything else. Adapters are float32 on a
    quantized or float16 base, else the base's float dtype, unless ``dtype`` is given.
    Returns the adapted layers' paths.

    Raises:
        ValueError: a part path the model does not have, or a model that already has
            adapters (:func:`detach_lora` first).
    """
    refuse_adapted(model)
    if freeze:
        model.requires_grad_(False)
    left = dict(plans)
    done: list[str] = []
    for layer_path, owner, layer, parts in list(layer_parts(model)):
        if len(parts) > 1 and layer_path in left:  # a fused layer adapted whole
            if any(part_path(owner, name) in left for name, _ in parts):
                raise ValueError(f"{layer_path} is planned both whole and per part")
            parts = ((layer_path.rsplit(".", 1)[-1], sum(rows for _, rows in parts)),)
        paths = {name: part_path(owner, name) for name, _ in parts}
        mine = {name: left.pop(path) for name, path in paths.items() if path in left}
        if not mine:
            continue
        device, chosen = adapter_placement(layer, dtype)
        adapter = LayerAdapter(
            cast(int, layer.in_features), parts, mine, dropout, device=device, dtype=chosen
        )
        install_adapter(layer, adapter)
        done.append(layer_path)
    if left:
        raise ValueError(f"no such linear layer parts in this model: {sorted(left)}")
    return done


def adapter_placement(
    layer: nn.Module, dtype: torch.dtype | None = None
) -> tuple[torch.device | None, torch.dtype]:
    """Where an adapter of ``layer`` lives: the layer's device, and ``dtype`` if given, else
    the layer's float32/bfloat16 weight dtype, else float32 (a quantized or float16 base)."""
    weight = getattr(layer, "weight", None)
    device = next((t.device for t in layer.state_dict().values()), None)
    chosen = dtype or (
        weight.dtype
        if isinstance(weight, Tensor) and weight.dtype in (torch.float32, torch.bfloat16)
        else torch.float32
    )
    return device, chosen


def install_adapter(layer: nn.Module, adapter: nn.Module) -> None:
    """Make ``adapter`` (forward ``(x, out) -> out``) ``layer``'s child ``lora`` and add it
    on through a forward hook, as :func:`attach_lora` does (:func:`detach_lora` removes it)."""
    layer.add_module("lora", adapter)
    layer._zoo_lora_hook = layer.register_forward_hook(_add_update)  # type: ignore[assignment]


def adapted_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The layers of ``model`` that carry an adapter, by path."""
    return {
        path: module
        for path, module in model.named_modules()
        if isinstance(getattr(module, "lora", None), nn.Module) and _is_linear(module)
    }


def detach_lora(model: nn.Module) -> None:
    """Remove every adapter of ``model``; its forward is the base's again, bit for bit."""
    for layer in adapted_layers(model).values():
        layer._zoo_lora_hook.remove()  # type: ignore[operator,union-attr]
        del layer._zoo_lora_hook
        del layer.lora


def _adapters(model: nn.Module) -> Iterator[tuple[str, LowRank]]:
    for layer_path, owner, layer, _ in layer_parts(model):
        adapter = getattr(layer, "lora", None)
        if isinstance(adapter, LayerAdapter):
            for name, low in adapter.low.items():
                yield part_path(owner, name), low  # type: ignore[misc]
        del layer_path


def adapter_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """The adapters' parameters, named ``<part path>.A`` and ``<part path>.B``."""
    for path, low in _adapters(model):
        yield f"{path}.A", low.A
        yield f"{path}.B", low.B


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' weights, ``{"<part path>.A": (rank, in), "<part path>.B": (out, rank)}``
    (detached; the tensors the model holds)."""
    return {name: p.detach() for name, p in adapter_parameters(model)}


def load_adapter_state(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Copy ``state`` (:func:`adapter_state`'s keys) into the model's adapters, all or
    nothing.

    Raises:
        ValueError: keys missing or unexpected, a shape that differs, or an update that is
            not finite or over :data:`~zoo.adapters.lora_check.MAX_UPDATE` (each named).
    """
    params = dict(adapter_parameters(model))
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    wrong = [
        f"{k}: {tuple(state[k].shape)} for {tuple(params[k].shape)}"
        for k in sorted(set(params) & set(state))
        if state[k].shape != params[k].shape
    ]
    if missing or unexpected or wrong:
        raise ValueError(
            "the adapter weights do not fit this model's adapters: "
            + "; ".join(
                f"{what}: {items}"
                for what, items in (
                    ("missing", missing),
                    ("unexpected", unexpected),
                    ("shapes", wrong),
                )
                if items
            )
        )
    for path, low in _adapters(model):  # every update finite and in range, or nothing loads
        check_update(path, state[f"{path}.A"], state[f"{path}.B"], low.scaling)
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state[name])


def merge_lora(model: nn.Module) -> None:
    """Fold every adapter into its layer's weight and remove the adapters: the model is a
    plain one that computes what the adapted one did.

    Raises:
        ValueError: an adapted layer without a float weight (a quantized base: merge into
            the float model it came from), or a merged weight that would not be finite in
            its dtype (checked for every layer before any changes).
    """
    layers = adapted_layers(model)
    for path, layer in layers.items():
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, Tensor) or not weight.is_floating_point():
            raise ValueError(
                f"{path} is {type(layer).__name__}, without a float weight to merge into; "
                "merge the adapter into the float model (zoo.load without quantize=)"
            )
    with torch.no_grad():
        for path, layer in layers.items():  # all checked before any weight changes
            weight = cast(Tensor, layer.weight)
            merged = weight + cast(LayerAdapter, layer.lora).weight_delta().to(weight.dtype)
            if not bool(torch.isfinite(merged).all()):
                raise ValueError(
                    f"{path}.weight would hold NaN or infinite values once merged "
                    f"({weight.dtype}); nothing was merged"
                )
        for layer in layers.values():
            delta = cast(LayerAdapter, layer.lora).weight_delta()
            weight = cast(Tensor, layer.weight)
            weight.add_(delta.to(weight.dtype))
    detach_lora(model)
