"""Lazy references ("package.module:attribute") so that specs stay cheap to create."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["resolve"]


def resolve(ref: Any) -> Any:
    """Return ``ref`` itself, or import it when it is a ``"module:attribute"`` string."""
    if not isinstance(ref, str):
        return ref
    module_name, sep, attribute = ref.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"lazy reference {ref!r} must look like 'package.module:attribute'")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"module {module_name!r} has no attribute {attribute!r}") from None
    return obj
