"""The built-in components, registered as plugin ``zoo`` through the same hook
(``zoo_components``) third-party plugins use, so conflicts, ``ZOO_PREFER``, strict mode and
``zoo plugins`` treat them alike. They are :data:`zoo.catalog.BUILTIN`, the list ``zoo.nn``
builds from too; implementations are named lazily: this module imports no torch.
"""

from __future__ import annotations

from ..catalog import BUILTIN
from .hookspecs import hookimpl
from .specs import ComponentSpec

__all__ = ["zoo_components"]


@hookimpl
def zoo_components() -> list[ComponentSpec]:
    """Positions, norms, feed-forwards, attention and blocks that come with zoo."""
    return [
        ComponentSpec(c.kind, c.name, c.reference, c.description, reads=c.reads) for c in BUILTIN
    ]
