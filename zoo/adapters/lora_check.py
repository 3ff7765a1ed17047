"""Whether a LoRA adapter's update is finite and in range, checked on every path an adapter
enters a model (a folder read, weights loaded into attached adapters, a serving bank) and
before a merge writes anything.

An adapted part adds ``scaling * B @ A`` to its layer. Its size is measured as the largest
change it makes to one output for inputs in ``[-1, 1]``: the infinity norm
``max_i sum_j |(scaling * B @ A)_ij|``, which must be at most :data:`MAX_UPDATE`. Above it
an update of a normalised input's size makes the next norm's mean of squares overflow
float32 (``(2**64)**2 = 2**128`` is past float32's ``3.4e38``), and the model decodes NaN:
what an adapter whose ``B`` holds ``3e38`` or whose ``lora_alpha`` is ``1e308`` did. The
product is never formed for a check that can pass without it: ``scaling * ||B|| * ||A||``
(in float64) bounds the norm from above, and only when that bound is over the limit is the
norm computed exactly, in float64, a few rows at a time (:data:`CHUNK_BYTES`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .lora_config import MAX_ALPHA

__all__ = ["CHUNK_BYTES", "MAX_ALPHA", "MAX_UPDATE", "check_scaling", "check_update", "update_norm"]

#: The largest update a part may make to one output for inputs in [-1, 1] (see above).
MAX_UPDATE = 2.0**64

#: Memory of the float64 rows of ``B @ A`` computed at once when the exact norm is needed.
CHUNK_BYTES = 1 << 26


def check_scaling(scaling: float, name: str) -> None:
    """Raise ``ValueError`` unless ``scaling`` (``alpha / rank``) is finite, positive and at
    most :data:`MAX_ALPHA`; ``name`` says whose."""
    if not (isinstance(scaling, (int, float)) and math.isfinite(scaling) and scaling > 0):
        raise ValueError(
            f"{name}: the scaling (alpha / rank) must be finite and positive, got {scaling!r}"
        )
    if scaling > MAX_ALPHA:
        raise ValueError(
            f"{name}: the scaling (alpha / rank) is {scaling:.3g}, over {MAX_ALPHA:.3g} "
            "(2**32); no trained adapter comes near it (peft's are 0.5 to a few hundred): "
            "check lora_alpha"
        )


def update_norm(a: Tensor, b: Tensor, scaling: float) -> float:
    """``max_i sum_j |(scaling * b @ a)_ij|`` in float64 (``inf`` if it overflows even
    there): the bound first, the exact norm only when the bound is over :data:`MAX_UPDATE`."""
    a64 = a.detach().to("cpu", torch.float64)
    b64 = b.detach().to("cpu", torch.float64)
    bound = scaling * float(b64.abs().sum(1).max()) * float(a64.abs().sum(1).max())
    if bound <= MAX_UPDATE:
        return bound
    rows = max(1, CHUNK_BYTES // (8 * max(1, a64.shape[1])))
    norm = 0.0
    for start in range(0, b64.shape[0], rows):
        part = (b64[start : start + rows] @ a64).abs().sum(1).max()  # (rows, in) -> ()
        norm = max(norm, scaling * float(part))
    return norm


def check_update(name: str, a: Tensor, b: Tensor, scaling: float) -> None:
    """Raise ``ValueError`` naming ``name`` (the part, or the file's key) unless ``a``
    ``(rank, in)`` and ``b`` ``(out, rank)`` hold only finite numbers, ``scaling`` is in range
    (:func:`check_scaling`) and the update ``scaling * b @ a`` is at most
    :data:`MAX_UPDATE` (:func:`update_norm`)."""
    for which, t in (("A", a), ("B", b)):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name}: {which} holds NaN or infinite values")
    check_scaling(scaling, name)
    norm = update_norm(a, b, scaling)
    if not norm <= MAX_UPDATE:
        raise ValueError(
            f"{name}: the update scaling * B @ A reaches {norm:.3g} on one output for inputs "
            f"in [-1, 1], over {MAX_UPDATE:.3g} (2**64), where the model's next norm "
            "overflows float32 and it decodes NaN; the adapter's weights or lora_alpha are "
            "wrong (a trained adapter's update is a fraction of the weights it changes)"
        )
