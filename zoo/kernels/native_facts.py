"""Whether the tensors a one-call decoding plan (:mod:`zoo.runtime.native_plan`) points into are
as they were when it was read: the facts each step asks again.

Why: the plan hands C the addresses, shapes and dtypes it read once. A weight changed in place
keeps its Python object and often its address: ``t_()`` or ``as_strided_`` on a square
weight keeps both and its shape, ``p.data = p.data[:half]`` keeps the address, a dtype view
keeps address and shape, and a tensor's class can be reassigned. So every step asks every
tensor again for its exact type, address, shape, strides, storage offset, dtype and device
(and whether autograd records it), and any change makes the plan be read again.

Cost: a pass a fact over gpt2-124m's 148 tensors in Python (``map`` of the tensor's method)
costs a step many times what PyTorch's check in C++ costs for the same tensors
(``torch._C._dynamo.guards.TensorGuards``, what ``torch.compile``'s guards check tensors
with: exact Python type, dispatch keys, dtype, device, ``requires_grad``, shape and strides;
docs/benchmarks.md, "Figures behind design choices", has the figures), so that check is used
where this PyTorch has it in the expected form, beside one pass for the address (which,
being the storage's plus the storage offset times the item size, covers the offset); the
passes in Python are the fallback.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from torch import Tensor

from .native import _PLAIN

__all__ = ["Facts"]

Pass = Callable[[Tensor], Any]

#: Every fact, a C-level pass (``map``) each, where PyTorch's C++ check is not found.
_PASSES: tuple[Pass, ...] = (
    type,
    Tensor.data_ptr,
    Tensor.storage_offset,
    Tensor.size,
    Tensor.stride,
    operator.attrgetter("dtype", "is_cpu"),
)
#: The fact PyTorch's C++ check does not cover: the address of the first element (the
#: storage's plus the offset times the item size; with the shape, strides and dtype it
#: checks, the very bytes the kernel reads, wherever the storage begins).
_ADDRESS: tuple[Pass, ...] = (Tensor.data_ptr,)


def _tensor_guards() -> Any:
    """``TensorGuards`` of this PyTorch, or ``None``."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except (ImportError, AttributeError):
        return None
    return TensorGuards


#: PyTorch's C++ check of many tensors (``None``: the passes in Python; tests set it so).
TensorGuards = _tensor_guards()


def _guard(tensors: tuple[Tensor, ...]) -> Any:
    """A ``TensorGuards`` of ``tensors`` as they are now (the state of ``inference_mode`` and
    ``no_grad`` included: checked under another, it fails and the plan is read again), or
    ``None`` where it is missing or takes other arguments in this PyTorch."""
    if TensorGuards is None or not tensors:
        return None
    try:
        guard = TensorGuards(
            *tensors,
            dynamic_dims_sizes=[list(t.size()) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        )
        return guard if guard.check(*tensors) is True else None
    except Exception:  # another PyTorch's form of a private class: the passes in Python
        return None


class Facts(NamedTuple):
    """The distinct tensors a plan points into (kept alive here) and the answers of each pass
    (:data:`_PASSES`, or :data:`_ADDRESS` beside ``guard``, PyTorch's C++ check of the
    rest; only their types where one is not a plain tensor)."""

    tensors: tuple[Tensor, ...]
    passes: tuple[Pass, ...]
    answers: tuple[tuple[Any, ...], ...]
    guard: Any

    @classmethod
    def of(cls, tensors: Iterable[Tensor]) -> Facts:
        """The facts of ``tensors`` now; only their types where one is not a plain tensor (a
        plan holding it declines, and a subclass may not answer the rest)."""
        distinct = tuple(dict.fromkeys(tensors))  # a tied weight once (the guard needs it)
        passes: tuple[Pass, ...]
        if not all(map(_PLAIN.__contains__, map(type, distinct))):
            guard, passes = None, (type,)
        else:
            guard = _guard(distinct)
            passes = _PASSES if guard is None else _ADDRESS
        answers = tuple(tuple(map(fact, distinct)) for fact in passes)
        return cls(distinct, passes, answers, guard)

    def current(self) -> bool:
        """Whether every tensor has the same facts as when they were read."""
        tensors = self.tensors
        recorded = zip(self.passes, self.answers, strict=True)
        if not all(tuple(map(fact, tensors)) == was for fact, was in recorded):
            return False
        return self.guard is None or self.guard.check(*tensors) is True
