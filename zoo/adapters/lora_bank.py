"""Many LoRA adapters on one model at once, each row of a batch with its own (batched as
Punica and S-LoRA batch them: one pass for the whole batch, not one per adapter).

Each adapted linear layer holds a :class:`LayerBank`: every adapter's ``A`` and ``B``
stacked, ``A`` ``(n + 1, R, in)`` and ``B`` ``(n + 1, out, R)``, where index 0 is no adapter
(zeros) and ``R`` has a slot of ranks for each *unit* of the layer (a part of a fused layer,
or the whole layer). An adapter's part sits in its unit's slot (a smaller rank padded with
zeros) and in that part's rows of ``B``, with its scaling folded into ``B``, so the fused
layer's update is one block-diagonal product, exactly the stack of the per-part updates.

Which adapter each row applies is an :class:`AdapterRows` that every bank of the model
shares, set once before each forward (:meth:`AdapterRows.set`): a row ``b`` gets
``out[b] += B[i] @ (A[i] @ x[b])`` for its index ``i``. Rows of different adapters run in
one pass, each row's ``A`` and ``B`` gathered into batched products (kept from one step to
the next while the rows' adapters stay the same). When every row has the same index (a
prompt prefilled alone, a batch of one adapter) the bank runs that adapter's ``A`` and
``B`` as plain linear layers, and rows of index 0 alone skip it. The bank plugs in as the layer's
``lora`` child, through the hook :func:`zoo.adapters.lora.attach_lora` uses
(:func:`~zoo.adapters.lora.detach_lora` removes it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Protocol, cast

import torch
from torch import Tensor, nn

from .lora import (
    PartPlan,
    adapter_placement,
    install_adapter,
    layer_parts,
    part_path,
    refuse_adapted,
)
from .lora_check import check_update

__all__ = ["AdapterRows", "LayerBank", "LoRAWeights", "attach_bank"]


class LoRAWeights(Protocol):
    """One adapter's parts and weights (``zoo.adapters.Adapter`` is one): ``plans`` by part
    path (:func:`zoo.adapters.lora.plan_lora`) and ``state`` with ``"<part path>.A"`` ``(rank,
    in)`` and ``"<part path>.B"`` ``(out, rank)``."""

    @property
    def plans(self) -> Mapping[str, PartPlan]: ...

    @property
    def state(self) -> Mapping[str, Tensor]: ...


class AdapterRows:
    """Which adapter each row of the next forward applies, shared by a model's banks: 0 is
    none (the base), ``i`` the ``i``-th adapter of :attr:`names`.

    Args:
        names: the adapters, in their indices' order (from 1).
        device: where the index lives (the model's device).
    """

    def __init__(self, names: Sequence[str], device: torch.device | str | None = None) -> None:
        self.names = list(names)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        #: ``(N,)``, each row's adapter (``None`` until :meth:`set`).
        self.index: Tensor | None = None
        #: The same as a tuple: what the banks' gathered weights are kept for.
        self.key: tuple[int, ...] = ()
        #: The one adapter every row applies, or ``None`` when they differ.
        self.uniform: int | None = 0

    def set(self, index: Sequence[int]) -> None:
        """Each row's adapter for the forwards to come (one entry per row)."""
        key = tuple(index)
        if key == self.key:
            return
        bad = [i for i in key if not 0 <= i <= len(self.names)]
        if bad or not key:
            raise ValueError(
                f"adapter indices must be in [0, {len(self.names)}], one per row; got {list(key)}"
            )
        self.uniform = key[0] if all(i == key[0] for i in key) else None
        self.index = torch.tensor(key, device=self.device)  # (N,)
        self.key = key


class LayerBank(nn.Module):
    """Every adapter of one linear layer, stacked; its forward takes the layer's input and
    output and adds each row's own adapter's update.

    Rows of different adapters gather their ``A`` and ``B`` into batched products; the
    gathered weights are kept while the rows' adapters stay the same (from one decoding
    step to the next, until a request joins or leaves), so a step runs two products per
    layer, as one adapter's would.

    Args:
        rows: the shared per-row adapter index.
        A: ``(n + 1, R, in)``, index 0 zeros.
        B: ``(n + 1, out, R)``, scalings folded in, index 0 zeros.

    Shape:
        - x: ``(N, *, in)``, out: ``(N, *, out)`` -> ``(N, *, out)``.
    """

    #: Each row's adapter is picked on the host before every step, which a recorded or
    #: compiled step would freeze (:func:`zoo.nn.base.chosen_on_host`).
    host_chosen: ClassVar[bool] = True

    def __init__(self, rows: AdapterRows, A: Tensor, B: Tensor) -> None:
        super().__init__()
        self.rows = rows
        self.register_buffer("A", A, persistent=False)  # not in the model's state dict
        self.register_buffer("B", B, persistent=False)
        self._gathered: tuple[tuple[int, ...], Tensor, Tensor] | None = None

    def _rows_weights(self) -> tuple[Tensor, Tensor]:
        """Each row's ``A`` transposed ``(N, in, R)`` and ``B`` transposed ``(N, R, out)``,
        gathered once for the rows' adapters."""
        key = self.rows.key
        if self._gathered is None or self._gathered[0] != key:
            index = cast(Tensor, self.rows.index)
            # contiguous: the batched products run faster on them (CPU; the figure is in
            # docs/benchmarks.md, "Figures behind design choices")
            a = cast(Tensor, self.A).index_select(0, index).transpose(1, 2).contiguous()
            b = cast(Tensor, self.B).index_select(0, index).transpose(1, 2).contiguous()
            self._gathered = (key, a, b)
        return self._gathered[1], self._gathered[2]

    def forward(self, x: Tensor, out: Tensor) -> Tensor:
        """``out`` plus each row's adapter's update."""
        A, B = cast(Tensor, self.A), cast(Tensor, self.B)
        which = self.rows.uniform
        if which == 0:
            return out
        x = x.to(A.dtype)
        if which is not None:
            delta = nn.functional.linear(nn.functional.linear(x, A[which]), B[which])
            return out + delta.to(out.dtype)
        n = x.shape[0]
        if len(self.rows.key) != n:
            raise ValueError(
                f"the adapter index has {len(self.rows.key)} rows, the batch {n}; set it "
                "for this batch (AdapterRows.set) before the forward"
            )
        a, b = self._rows_weights()
        low = torch.bmm(x.reshape(n, -1, x.shape[-1]), a)  # (N, T, R)
        if out.dtype == low.dtype and out.is_contiguous():  # the sum in the product
            return torch.baddbmm(out.view(n, -1, out.shape[-1]), low, b).view(out.shape)
        return out + torch.bmm(low, b).view(out.shape).to(out.dtype)  # (N, *, out)

    def extra_repr(self) -> str:
        n, rank, in_features = cast(Tensor, self.A).shape
        out_features = cast(Tensor, self.B).shape[1]
        return f"{n - 1} adapters, {in_features} -> {out_features}, ranks {rank}"


def _units(
    layer_path: str, owner: str, parts: tuple[tuple[str, int], ...]
) -> list[tuple[str, int, int]]:
    """The keys an adapter of the layer may use, ``(part path, first row, rows)``: each part,
    and (a fused layer) the whole layer."""
    units, start = [], 0
    for name, rows in parts:
        units.append((part_path(owner, name), start, rows))
        start += rows
    if len(parts) > 1:
        units.append((layer_path, 0, start))
    return units


def _checked(
    name: str, adapter: LoRAWeights, key: str, shape: tuple[int, int]
) -> tuple[Tensor, Tensor]:
    """The ``A`` and ``B * scaling`` of ``key``, checked against its plan and the layer's
    ``shape`` (that unit's ``(rows, in)``)."""
    plan = adapter.plans[key]
    a, b = adapter.state.get(f"{key}.A"), adapter.state.get(f"{key}.B")
    want_a, want_b = (plan.rank, shape[1]), (shape[0], plan.rank)
    if a is None or b is None or tuple(a.shape) != want_a or tuple(b.shape) != want_b:
        got = [None if t is None else tuple(t.shape) for t in (a, b)]
        raise ValueError(
            f"adapter {name!r}: {key}.A and .B must be {want_a} and {want_b} for this "
            f"model, got {got}"
        )
    check_update(f"adapter {name!r}: {key}", a, b, plan.scaling)
    return a, b * plan.scaling


def _bank(
    rows: AdapterRows,
    adapters: Mapping[str, LoRAWeights],
    layer: nn.Module,
    units: list[tuple[str, int, int]],
    dtype: torch.dtype | None,
) -> LayerBank:
    """One layer's bank of ``adapters`` over its ``units`` (those some adapter uses)."""
    ranks = [
        max(a.plans[key].rank for a in adapters.values() if key in a.plans) for key, _, _ in units
    ]
    device, chosen = adapter_placement(layer, dtype)
    rows.device = device or rows.device
    in_features, out_features = cast(int, layer.in_features), cast(int, layer.out_features)
    A = torch.zeros(len(adapters) + 1, sum(ranks), in_features, dtype=chosen, device=device)
    B = torch.zeros(len(adapters) + 1, out_features, sum(ranks), dtype=chosen, device=device)
    with torch.no_grad():
        for i, (name, adapter) in enumerate(adapters.items(), start=1):
            at = 0  # where this unit's slot of ranks starts
            for (key, first, size), slot in zip(units, ranks, strict=True):
                if key in adapter.plans:
                    a, b = _checked(name, adapter, key, (size, in_features))
                    A[i, at : at + a.shape[0]] = a
                    B[i, first : first + size, at : at + a.shape[0]] = b
                at += slot
    return LayerBank(rows, A, B)


def attach_bank(
    model: nn.Module,
    adapters: Mapping[str, LoRAWeights],
    *,
    dtype: torch.dtype | None = None,
) -> AdapterRows:
    """Give ``model`` a :class:`LayerBank` of ``adapters`` (by name, indices from 1 in this
    order) on every layer any of them adapts, in place, all or nothing; returns the
    :class:`AdapterRows` to set before each forward (every row starts at 0: the base).
    Adapters are float32 on a quantized or float16 base, else the base's float dtype,
    unless ``dtype`` is given.

    Raises:
        ValueError: a part path the model does not have, weights that do not fit their
            plan or the layer, keys without a plan (each named with its adapter), or a
            model with adapters already.
    """
    refuse_adapted(model)
    _check_keys(adapters)
    rows = AdapterRows(list(adapters))
    planned = {key for a in adapters.values() for key in a.plans}
    banks: list[tuple[nn.Module, LayerBank]] = []
    for layer_path, owner, layer, parts in list(layer_parts(model)):
        units = [unit for unit in _units(layer_path, owner, parts) if unit[0] in planned]
        if units:
            banks.append((layer, _bank(rows, adapters, layer, units, dtype)))
            planned.difference_update(key for key, _, _ in units)
    if planned:
        unknown = {name: sorted(planned & set(a.plans)) for name, a in adapters.items()}
        raise ValueError(
            "no such linear layer parts in this model: "
            f"{ {name: keys for name, keys in unknown.items() if keys} }"
        )
    for layer, bank in banks:
        install_adapter(layer, bank)
    return rows


def _check_keys(adapters: Mapping[str, LoRAWeights]) -> None:
    """Every weight of each adapter belongs to one of its plans."""
    for name, adapter in adapters.items():
        extra = sorted(set(adapter.state) - {f"{k}.{w}" for k in adapter.plans for w in "AB"})
        if extra:
            raise ValueError(f"adapter {name!r}: weights without a plan: {extra}")
