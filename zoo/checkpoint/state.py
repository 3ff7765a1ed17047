"""From tensors to a model and back: meta build, assignment, ties, buffers, key reports.

Loading never initialises weights only to overwrite them: the model is built on the ``meta``
device (shapes only), the checkpoint's tensors (memory-mapped) are *assigned* as its
parameters, converted one tensor at a time when a ``dtype`` or ``device`` asks for it.

Buffers: a note for plugin authors
----------------------------------
Persistent buffers are saved and loaded like parameters. Non-persistent buffers
(``register_buffer(..., persistent=False)``: position tables, masks) are not in checkpoints,
so after a ``meta`` build they are still on ``meta``; zoo recreates them on the target device:

1. If the module that owns the buffer defines ``reset_buffers(self) -> None``, zoo calls it
   inside ``with torch.device(target):``. It must (re)register its buffers computing them
   afresh, creating tensors on the default device (do not pass ``device=``)::

       class RotaryPositions(nn.Module):
           def __init__(self, context_length, d_head):
               super().__init__()
               self.context_length, self.d_head = context_length, d_head
               self.reset_buffers()

           def reset_buffers(self) -> None:
               inv_freq = 1.0 / 10000 ** (torch.arange(0, self.d_head, 2) / self.d_head)
               self.register_buffer("inv_freq", inv_freq, persistent=False)

2. Otherwise zoo builds the model a second time with parameters kept on ``meta`` and
   buffers on the target device, and takes the buffers from it. That is always correct but
   runs the whole constructor again, so prefer (1), or compute small tables on the fly from
   the input's device as :class:`zoo.nn.SinusoidalPositions` does (no buffer at all).

Floating buffers then get the requested ``dtype``, as ``model.to(dtype)`` would give them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..errors import CheckpointError, StateDictMismatchError
from .report import LoadReport, ShapeMismatch

__all__ = [
    "all_finite",
    "assemble",
    "build_on_meta",
    "materialize_buffers",
    "tied_groups",
    "unique_state",
]

log = logging.getLogger("zoo.checkpoint")

_SHOW = 5  # keys shown in messages

#: Elements checked at a time by :func:`all_finite`: its temporaries stay a few MB.
_SCAN_ELEMENTS = 1 << 20


def all_finite(tensor: Tensor) -> bool:
    """Whether ``tensor`` holds no NaN or infinity, checked a slice at a time.

    ``torch.isfinite`` on a whole tensor allocates temporaries as large as the tensor (a
    float copy for the absolute value, then masks): more than the tensor's own size on top of
    the weights (docs/benchmarks.md, "Figures behind design choices"). Slices along the first
    dimension are views, so memory stays bounded for contiguous and strided (e.g. transposed)
    tensors alike. Non-floating tensors are finite.
    """
    if not tensor.is_floating_point():
        return True
    if tensor.dim() == 0:
        return bool(torch.isfinite(tensor))
    rows = max(1, _SCAN_ELEMENTS // max(1, tensor[0].numel()))
    return all(bool(torch.isfinite(part).all()) for part in tensor.split(rows))


#: In-place ops that only fill values: on a ``meta`` tensor they compute nothing.
_FILL_OPS = frozenset(
    {
        "normal_", "uniform_", "zero_", "zeros_", "ones_", "fill_", "constant_", "random_",
        "bernoulli_", "exponential_", "log_normal_", "cauchy_", "geometric_", "erfinv_",
        "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
        "kaiming_normal_", "orthogonal_", "sparse_", "eye_", "dirac_", "copy_", "mul_",
        "add_", "sub_", "div_", "clamp_",
    }
)  # fmt: skip


class _SkipFillOnMeta(TorchFunctionMode):
    """Skips value-filling ops (weight initialisation) on ``meta`` tensors.

    They have no effect there, but their meta kernels are slow to reach: the first
    ``normal_`` on a meta tensor imports ``torch._dynamo``, which is slow in a fresh process
    (docs/benchmarks.md, "Figures behind design choices").
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in _FILL_OPS:
            target = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
            if isinstance(target, Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


def build_on_meta(make: Callable[[Any], Any], config: Any) -> Any:
    """``make(config)`` (a model class, or a registry's model factory) with every tensor on
    ``meta`` and initialisation skipped."""
    with torch.device("meta"), _SkipFillOnMeta():
        return make(config)


def tied_groups(model: nn.Module) -> list[list[str]]:
    """Names that refer to one shared parameter or buffer, in registration order; the first
    name of each group is the one checkpoints store."""
    by_id: dict[int, list[str]] = {}
    named = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    for name, tensor in named:
        by_id.setdefault(id(tensor), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def unique_state(model: nn.Module) -> dict[str, Tensor]:
    """The model's state dict with each shared tensor once (under its first name), detached."""
    seen: set[int] = set()
    out: dict[str, Tensor] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        out[key] = tensor.detach()
    return out


def _kind(tensor: Tensor) -> str:
    if tensor.is_floating_point():
        return "float"
    return "complex" if tensor.is_complex() else "integer"


def _fits(loaded: Tensor, expected: Tensor) -> bool:
    return tuple(loaded.shape) == tuple(expected.shape) and _kind(loaded) == _kind(expected)


def _describe(tensor: Tensor) -> str:
    return f"{tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"


def _owner(model: nn.Module, key: str) -> tuple[nn.Module, str]:
    path, _, leaf = key.rpartition(".")
    return (model.get_submodule(path) if path else model), leaf


def _convert(
    tensor: Tensor, device: torch.device, dtype: torch.dtype | None, contiguous: bool = True
) -> Tensor:
    """``tensor`` on ``device`` in ``dtype``, contiguous: a foreign layout's view (GPT-2's
    Conv1D weights, transposed) is copied once into zoo's row order, which zoo's kernels read,
    on the CPU into the process's own memory with the file's pages given back
    (:func:`zoo.kernels.pages.resident`); a contiguous memory-mapped tensor stays mapped."""
    if dtype is not None and tensor.is_floating_point():
        tensor = tensor.to(device=device, dtype=dtype)
    else:
        tensor = tensor.to(device=device)
    if tensor.is_contiguous() or not contiguous:
        return tensor
    if tensor.is_cpu:
        from ..kernels.pages import resident

        return resident(tensor)
    return tensor.contiguous()


def assemble(
    make: Callable[[Any], Any],
    config: Any,
    state: Mapping[str, Tensor],
    *,
    device: torch.device,
    dtype: torch.dtype | None,
    strict: bool,
    unexpected: tuple[str, ...] = (),
    what: str = "checkpoint",
    contiguous: bool = True,
) -> tuple[Any, LoadReport]:
    """Build ``make(config)`` on ``meta`` and assign ``state`` (zoo keys) to it.

    Each tensor is converted to ``device``/``dtype`` on its own (a no-op for memory-mapped
    CPU tensors of the right dtype), so at most one converted copy of the model exists. Tied
    parameters are one tensor again afterwards (identity), and non-persistent buffers are
    recreated on ``device`` (see the module docstring).

    Args:
        unexpected: foreign keys a layout conversion could not place, reported as unexpected.
        what: the checkpoint, as error messages should name it.
        contiguous: store each tensor in row order (a strided view copied once; see
            ``_convert``); ``False`` keeps views, for weights quantized right after (their
            quantized copies are made one weight at a time, with no float copy of them all).

    Returns:
        the model (eval mode) and the :class:`LoadReport`.

    Raises:
        StateDictMismatchError: when ``strict`` and any key is missing, unexpected or
            mismatched.
    """
    model = build_on_meta(make, config)
    expected = model.state_dict(keep_vars=True)
    aliases = {alias: names[0] for names in tied_groups(model) for alias in names[1:]}
    state = dict(state)
    mismatched = _fold_aliases(state, aliases)
    missing, extra = _sort_keys(state, expected, aliases, unexpected, mismatched)
    _check_one_dtype(state, dtype, what)
    report = LoadReport(tuple(missing), tuple(extra), tuple(mismatched))
    if not report.ok and strict:
        raise StateDictMismatchError(
            f"{what} does not fit the {type(config).architecture or type(model).__name__} "
            f"model: {report.summary()}. Check that the config matches the weights, or "
            "pass strict=False to load what matches (the rest is freshly initialised).",
            report,
        )
    converted = {key: _convert(tensor, device, dtype, contiguous) for key, tensor in state.items()}
    model.load_state_dict(converted, strict=False, assign=True)
    del converted

    _retie(model, aliases)
    initialised = _materialize_parameters(model, device, dtype)
    _retie(model, aliases)  # again: materialising may have replaced a shared parameter
    materialize_buffers(model, device, dtype, make=make, config=config)
    if initialised or not report.ok:
        report = dataclasses.replace(report, initialised=tuple(initialised))
        log.warning("%s loaded with strict=False: %s", what, report.summary())
    return model.eval(), report


def _fold_aliases(state: dict[str, Tensor], aliases: Mapping[str, str]) -> list[ShapeMismatch]:
    """Store each tied tensor under its canonical name only (in place); an alias whose tensor
    differs from its canonical one is a mismatch."""
    mismatched = []
    for alias, canonical in aliases.items():
        if alias not in state:
            continue
        tensor = state.pop(alias)
        if canonical not in state:
            state[canonical] = tensor
        elif not _same_tensor(state[canonical], tensor):
            mismatched.append(
                ShapeMismatch(alias, "differs from " + canonical, f"tied to {canonical}")
            )
    return mismatched


def _sort_keys(
    state: dict[str, Tensor],
    expected: Mapping[str, Tensor],
    aliases: Mapping[str, str],
    unexpected: tuple[str, ...],
    mismatched: list[ShapeMismatch],
) -> tuple[list[str], list[str]]:
    """The model's keys the state lacks and the state's keys the model lacks (``unexpected``
    first); keys of the wrong shape join ``mismatched``. Only assignable tensors stay in
    ``state``."""
    owned = {k for k in expected if k not in aliases}
    missing = [k for k in expected if k in owned and k not in state]
    extra = [*unexpected, *(k for k in state if k not in expected)]
    for key in [k for k in state if k in owned]:
        if not _fits(state[key], expected[key]):
            mismatched.append(ShapeMismatch(key, _describe(state[key]), _describe(expected[key])))
            del state[key]
    for key in extra:
        state.pop(key, None)
    return missing, extra


def _check_one_dtype(state: Mapping[str, Tensor], dtype: torch.dtype | None, what: str) -> None:
    """Mixed floating dtypes would load, then fail at the first forward: refuse them unless
    ``dtype`` converts every tensor."""
    floats = sorted({str(t.dtype) for t in state.values() if t.is_floating_point()})
    if dtype is None and len(floats) > 1:
        raise CheckpointError(
            f"{what} mixes floating dtypes ({', '.join(floats)}); load it with one dtype, e.g. "
            "zoo.load(path, dtype=torch.float32), which converts every tensor"
        )


def _retie(model: nn.Module, aliases: Mapping[str, str]) -> None:
    """Point every alias at its canonical parameter/buffer: one tensor, not two equal ones."""
    for alias, canonical in aliases.items():
        module, leaf = _owner(model, alias)
        owner, name = _owner(model, canonical)
        if leaf in module._parameters:
            module._parameters[leaf] = owner._parameters[name]
        else:
            module._buffers[leaf] = owner._buffers[name]


def _same_tensor(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device == b.device and a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return True
    return bool(torch.equal(a, b))


def _materialize_parameters(
    model: nn.Module, device: torch.device, dtype: torch.dtype | None
) -> list[str]:
    """Give the parameters the checkpoint did not provide real storage on ``device`` and
    return their names. They are initialised by their (leaf) module's ``reset_parameters()``,
    run on stand-ins for the parameters that were loaded so those are never written to;
    a parameter whose module has no ``reset_parameters()`` is zero-filled."""
    left = [name for name, p in model.named_parameters() if p.is_meta]
    if not left or device.type == "meta":
        return []
    for path in sorted({name.rpartition(".")[0] for name in left}):
        _initialise_missing(model.get_submodule(path) if path else model, device, dtype)
    return left


def _initialise_missing(module: nn.Module, device: torch.device, dtype: torch.dtype | None) -> None:
    """Initialise ``module``'s own parameters that are still on ``meta`` (see
    :func:`_materialize_parameters`); its loaded parameters are left as they are."""
    params = {n: p for n, p in module._parameters.items() if p is not None}
    missing = {n for n, p in params.items() if p.is_meta}
    for n, p in params.items():  # fresh storage for the missing, stand-ins for the rest
        like = torch.empty_like(p, device=device, dtype=dtype if n in missing and dtype else None)
        module._parameters[n] = nn.Parameter(like, requires_grad=p.requires_grad)
    reset = getattr(module, "reset_parameters", None)
    with torch.no_grad():
        if callable(reset) and next(module.children(), None) is None:
            reset()
        else:
            for n in missing:
                module._parameters[n].zero_()  # type: ignore[union-attr]
    module._parameters.update({n: p for n, p in params.items() if n not in missing})


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """While active, every parameter a module registers is moved to ``meta`` at once, while
    buffers stay on the current default device (the fallback of :func:`materialize_buffers`)."""
    original = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(self, name, param)
        if param is not None and not param.is_meta:
            meta = param.to("meta")
            self._parameters[name] = type(param)(meta, requires_grad=param.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def materialize_buffers(
    model: nn.Module,
    device: torch.device,
    dtype: torch.dtype | None = None,
    *,
    make: Callable[[Any], Any] | None = None,
    config: Any = None,
) -> list[str]:
    """Recreate the buffers still on ``meta`` on ``device`` and return their names.

    Calls each owning module's ``reset_buffers()`` under ``torch.device(device)``; buffers
    left after that are taken from a twin ``make(config)`` built with its parameters
    on ``meta`` (see the module docstring). Floating buffers are cast to ``dtype``.
    """
    if device.type == "meta":
        return []
    pending = _meta_buffers(model)
    if not pending:
        return []
    with torch.device(device):
        for path in sorted({n.rpartition(".")[0] for n in pending}):
            reset = getattr(model.get_submodule(path) if path else model, "reset_buffers", None)
            if callable(reset):
                reset()
    left = _meta_buffers(model)
    if left:
        _buffers_from_twin(model, left, device, make, config)
    if dtype is not None:
        _cast_floating_buffers(model, pending, dtype)
    return pending


def _meta_buffers(model: nn.Module) -> list[str]:
    return [name for name, b in model.named_buffers() if b is not None and b.is_meta]


def _buffers_from_twin(
    model: nn.Module,
    names: list[str],
    device: torch.device,
    make: Callable[[Any], Any] | None,
    config: Any,
) -> None:
    """Take the buffers ``names`` from a twin ``make(config)`` built on ``device`` with its
    parameters on ``meta`` (the fallback for modules without ``reset_buffers()``)."""
    if make is None:
        raise RuntimeError(
            f"buffers {names[:_SHOW]} are still on meta and their modules define no "
            "reset_buffers(); see zoo.checkpoint.state for the convention"
        )
    log.info("rebuilding %d buffer(s) %s by running the constructor again", len(names), names)
    with torch.device(device), _parameters_on_meta(), _SkipFillOnMeta():
        twin = make(config)
    for name in names:
        module, leaf = _owner(model, name)
        module._buffers[leaf] = twin.get_buffer(name)


def _cast_floating_buffers(model: nn.Module, names: list[str], dtype: torch.dtype) -> None:
    """Cast the floating buffers among ``names`` to ``dtype``."""
    for name in names:
        module, leaf = _owner(model, name)
        buffer = module._buffers[leaf]
        if buffer is not None and buffer.is_floating_point():
            module._buffers[leaf] = buffer.to(dtype)
