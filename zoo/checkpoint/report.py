"""The report of how a checkpoint's keys matched a model (plain data, no torch)."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["LoadReport", "ShapeMismatch"]

_SHOW = 5  # keys shown per category in messages


@dataclasses.dataclass(frozen=True)
class ShapeMismatch:
    """A key whose tensor does not fit the model's (shape or kind of dtype)."""

    key: str
    checkpoint: str
    model: str

    def __str__(self) -> str:
        return f"{self.key}: checkpoint {self.checkpoint} vs model {self.model}"


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """How a checkpoint's keys matched the model (all keys in zoo naming).

    Attributes:
        missing: model keys the checkpoint lacks.
        unexpected: checkpoint keys the model has no place for.
        mismatched: keys present on both sides whose shapes (or dtype kinds) differ.
        initialised: keys left freshly initialised because of the above (``strict=False``).
    """

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[ShapeMismatch, ...] = ()
    initialised: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every key matched."""
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self, limit: int = _SHOW) -> str:
        """One line per problem category: count and the first ``limit`` keys."""

        def part(label: str, items: tuple[Any, ...]) -> str:
            shown = "; ".join(str(i) for i in items[:limit])
            more = f"; ... and {len(items) - limit} more" if len(items) > limit else ""
            return f"{len(items)} {label} ({shown}{more})"

        parts = [
            part(label, items)
            for label, items in (
                ("missing", self.missing),
                ("unexpected", self.unexpected),
                ("shape-mismatched", self.mismatched),
            )
            if items
        ]
        return ", ".join(parts) if parts else "all keys matched"
