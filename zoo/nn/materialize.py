"""Give a model built on ``meta`` real storage, initialised as its constructor would have.

:func:`zoo.build` sizes a model on ``meta`` first (to refuse what cannot fit) and then makes
*that* model real instead of running the constructor a second time. That is exact when
initialisation follows PyTorch's convention (a model class says so with
``replayable_init = True``): each module that owns tensors initialises them in
``reset_parameters()`` (buffers: ``reset_buffers()``), called at the end of its ``__init__``,
after its children were built. Replaying those calls children first, in registration order, on
fresh storage then draws the same random numbers in the same order as the constructor did, so
a seeded build gives the same weights. Weights shared between modules (a tied head) are
replayed apart and shared again afterwards, as constructors tie them last.

:func:`replays_init` says whether a model follows the convention (every module owning a
parameter has ``reset_parameters``, every module owning a buffer ``reset_buffers``, and no
module keeps a plain tensor attribute); :func:`zoo.build` runs the constructor on the target
device for one that does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["materialize", "replays_init"]


def replays_init(model: nn.Module) -> bool:
    """Whether :func:`materialize` can initialise ``model`` as its constructor does: its class
    says so (``replayable_init``, see :class:`~zoo.nn.base.ZooModel`) and its modules keep
    the convention as far as can be seen."""
    if not getattr(model, "replayable_init", False):
        return False
    for module in model.modules():
        if not getattr(module, "replayable_init", True):  # a model inside (a classifier's body)
            return False
        if module._parameters and not callable(getattr(module, "reset_parameters", None)):
            return False
        if module._buffers and not callable(getattr(module, "reset_buffers", None)):
            return False
        if any(isinstance(value, Tensor) for value in vars(module).values()):
            return False
    return True


def materialize(model: nn.Module, device: torch.device) -> None:
    """Replace ``model``'s ``meta`` tensors by storage on ``device`` and initialise them by
    replaying each module's ``reset_buffers()`` and ``reset_parameters()``, children first
    (see the module docstring); shared tensors are shared again afterwards."""
    holders: dict[int, list[tuple[dict[str, Any], str]]] = {}
    for module in model.modules():
        tables: tuple[tuple[dict[str, Any], bool], ...] = (
            (module._parameters, True),
            (module._buffers, False),
        )
        for table, is_param in tables:
            for name, tensor in table.items():
                if tensor is not None:
                    holders.setdefault(id(tensor), []).append((table, name))
                    table[name] = _empty_like(tensor, device, is_param)  # each holder its own
    with torch.device(device), torch.no_grad():
        for module in _children_first(model):
            for hook in ("reset_buffers", "reset_parameters"):
                reset = getattr(module, hook, None)
                if callable(reset):
                    reset()
    for (first, name), *others in holders.values():  # ties made last, as constructors do
        for table, other in others:
            table[other] = first[name]


def _empty_like(tensor: Tensor, device: torch.device, is_param: bool) -> Tensor:
    empty = torch.empty_like(tensor, device=device)
    return nn.Parameter(empty, requires_grad=tensor.requires_grad) if is_param else empty


def _children_first(module: nn.Module, seen: set[int] | None = None) -> Iterator[nn.Module]:
    """Each module once, after its children (the order constructors finish in)."""
    seen = set() if seen is None else seen
    seen.add(id(module))
    for child in module.children():
        if id(child) not in seen:
            yield from _children_first(child, seen)
    yield module
