"""A LoRA adapter's shape (:class:`LoRA`, ``zoo.LoRA``) and each adapted part's plan: the
validated configs of :mod:`zoo.adapters.lora`, plain Python (no torch)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

__all__ = ["DEFAULT_TARGETS", "MAX_ALPHA", "LoRA", "PartPlan", "Parts"]

#: The largest ``alpha`` (and the largest scaling, ``alpha / rank``) an adapter may have: far
#: beyond any trained one (peft's are 0.5 to a few hundred), and small enough that ``B`` times
#: it stays finite in float32 for any ``B`` whose update :mod:`zoo.adapters.lora_check` passes.
MAX_ALPHA = 2.0**32

#: The layers a LoRA adapts when it names none: every projection of attention and of the
#: feed-forward (as QLoRA does), not the head or the embeddings.
DEFAULT_TARGETS: tuple[str, ...] = ("attn.qkv", "attn.proj", "ffn.fc", "ffn.proj")

#: A layer's parts, ``(name, rows)`` in output order.
Parts = tuple[tuple[str, int], ...]

_TARGET = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")


@dataclasses.dataclass(frozen=True)
class LoRA:
    """A LoRA adapter's shape: ``rank``, ``alpha`` (the update is scaled by ``alpha / rank``),
    ``dropout`` on the adapter's input (training only) and the ``targets`` it adapts (layer or
    part names, see :mod:`zoo.adapters.lora`; ``None``: the model family's default, else
    :data:`DEFAULT_TARGETS`).

    Example::

        zoo.train(model, data, adapter=zoo.LoRA(rank=8, alpha=16, targets=("attn.qkv",)))
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        object.__setattr__(
            self, "alpha", _number("alpha", self.alpha, "positive and finite, at most 2**32")
        )
        object.__setattr__(self, "dropout", _number("dropout", self.dropout, "in [0, 1)"))
        if self.targets is not None:
            object.__setattr__(self, "targets", _targets(self.targets))

    @property
    def scaling(self) -> float:
        """The factor on the low-rank update: ``alpha / rank``."""
        return self.alpha / self.rank


def _number(name: str, value: Any, rule: str) -> float:
    """A LoRA field's number, as a float, checked against its ``rule``."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if ok and rule == "in [0, 1)":
        ok = 0.0 <= value < 1.0
    elif ok:
        ok = math.isfinite(value) and 0 < value <= MAX_ALPHA
    if not ok:
        raise ValueError(f"LoRA {name} must be {rule} (a number), got {value!r}")
    return float(value)


def _targets(targets: Any) -> tuple[str, ...]:
    """``LoRA.targets`` as a tuple of dotted names."""
    if isinstance(targets, str):
        raise ValueError(
            f"LoRA targets must be a sequence of names, got the string {targets!r}"
            f" (write targets=({targets!r},))"
        )
    names = tuple(targets)
    bad = [t for t in names if not isinstance(t, str) or not _TARGET.fullmatch(t)]
    if not names or bad:
        raise ValueError(
            f"LoRA targets must be non-empty dotted module names (e.g. 'attn.qkv'), "
            f"got {bad or list(names)!r}"
        )
    return names


@dataclasses.dataclass(frozen=True)
class PartPlan:
    """One part's adapter: its ``rank`` and the ``scaling`` on its update."""

    rank: int
    scaling: float
