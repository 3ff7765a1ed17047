"""Lazy references ("package.module:attribute") so that specs stay cheap to create."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["LAZY_NAMES", "lazy_attributes", "resolve"]

#: Module -> the names its :func:`lazy_attributes` imports on first use, and from where: the
#: imports a reader of the source cannot see (``tests/test_layering.py`` counts them).
LAZY_NAMES: dict[str, Mapping[str, str]] = {}


def resolve(ref: Any, *, modules: bool = False) -> Any:
    """Return ``ref`` itself, or import it when it is a ``"module:attribute"`` string (with
    ``modules``, a bare ``"package.module"`` names the module itself)."""
    if not isinstance(ref, str):
        return ref
    module_name, sep, attribute = ref.partition(":")
    if modules and not sep and module_name:
        return importlib.import_module(module_name)
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


def lazy_attributes(module: str, refs: Mapping[str, str]) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``module`` (PEP 562) that imports each name of ``refs`` (name ->
    ``"package.module:attribute"``, or ``"package.module"`` for a module) on first use and
    keeps it in the module's namespace, so that importing the package imports none of them
    (nor torch, when they need it)."""
    LAZY_NAMES[module] = refs

    def __getattr__(name: str) -> Any:
        if name not in refs:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = resolve(refs[name], modules=True)
        setattr(sys.modules[module], name, value)  # once: later lookups skip this hook
        return value

    return __getattr__
