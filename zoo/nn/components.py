"""Building the components a config names, from the registry."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["build_component"]


def build_component(kind: str, config: Any) -> nn.Module:
    """The ``kind`` component (``"positions"``, ``"norm"``, ``"ffn"``, ``"attention"``) that
    ``config`` names in its field of that name, built for ``config``."""
    from ..registry import get_registry

    return get_registry().component(kind, getattr(config, kind)).build(config)
