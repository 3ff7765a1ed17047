"""One decoding step of a whole :class:`~zoo.nn.blocks.TransformerBlock` in one call to zoo's
CPU kernels (``zoo/nn/_native_block.c``).

Why: with :mod:`zoo.nn.native`'s kernels a batch-1 step's matrix products stream the weights
at the memory's rate, and what was left of a gpt2-124m float32 token (5-7 ms of 30-36 on a
2-core AVX2 machine; 5 of 16 in int8) was the rest of the step: about a hundred small PyTorch
operations and a few thousand Python calls, each slowed by the cache misses that streaming
the weights leaves behind. :func:`step` runs a block's norms, products, rotary positions,
attention (writing the key/value cache), activation and residual sums as one C call, with
the same kernels the per-operation path calls one by one.

Where it applies: a plain :class:`~zoo.nn.blocks.TransformerBlock` (pre-norm, post-norm or
parallel residual, no cross-attention) of :class:`~zoo.nn.attention.MultiHeadAttention`
(no q/k norms, no soft cap), :class:`~zoo.nn.feedforward.FeedForward` or
:class:`~zoo.nn.feedforward.GatedFeedForward` (GELU, GELU-tanh, ReLU or SiLU), zoo's norms,
and float32 or ``quantize="int8"`` linears; one float32 token of one sequence on the CPU, a
plain :class:`~zoo.nn.cache.LayerCache`, no mask, no gradients, no forward hooks on its
modules. Anything else (a LoRA-wrapped linear, a plugin's own block or attention, a mask)
takes the per-module path, unchanged.

Numerics: the per-operation path's, except the activation (computed in C, within a few ulp
of PyTorch's; ReLU is exact), so greedy tokens stay the same (``tests/test_native_block.py``).
"""

from __future__ import annotations

import ctypes
import operator
import weakref
from itertools import repeat
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .blocks import TransformerBlock
from .cache import KVCache, LayerCache
from .feedforward import FeedForward, GatedFeedForward
from .linear import Linear
from .native import _kernels, _vector
from .native_int8 import _ROWS, _rows_of
from .norms import LayerNorm, RMSNorm, UnitOffsetRMSNorm
from .onednn import OneDNNLinear
from .positions import Rotation

__all__ = ["stack"]

#: Each stack's plan, held beside it (a ctypes structure in a module's own attributes would
#: make the model impossible to copy or pickle) and dropped with it.
_STACKS: weakref.WeakKeyDictionary[nn.Module, _Stack] = weakref.WeakKeyDictionary()
_HOOKS = ("_forward_hooks", "_forward_pre_hooks")  # a module's hook dicts

_I, _P, _F = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_FLOAT_LINEARS = (Linear, OneDNNLinear)
_ACTIVATIONS = {(nn.GELU, "none"): 0, (nn.GELU, "tanh"): 1, (nn.ReLU, ""): 2, (nn.SiLU, ""): 3}
_PRE_NORM, _POST_NORM, _PARALLEL = 0, 1, 2


class _Linear(ctypes.Structure):
    """``zoo_linear``: float32 rows (kind 0) or int8 rows with scales and sums (kind 1)."""

    _fields_ = [("kind", _I), ("n", _I), ("k", _I)] + [
        (name, _P) for name in ("w", "scale", "colsum", "bias")
    ]


class _Norm(ctypes.Structure):
    """``zoo_norm``: a layer norm (kind 0) or an RMSNorm scaled by ``w + offset`` (kind 1)."""

    _fields_ = [("kind", _I), ("w", _P), ("b", _P), ("eps", _F), ("offset", _F)]


class _Block(ctypes.Structure):
    """``zoo_block``: the layout, the attention's geometry and the block's parts."""

    _fields_ = [
        ("layout", _I),
        ("d_model", _I),
        ("heads", _I),
        ("kv_heads", _I),
        ("head_dim", _I),
        ("act", _I),
        ("gated", _I),
        ("unused_", _I),
        ("scale", _F),
        ("unused", _F),
        ("norm1", _Norm),
        ("norm2", _Norm),
        ("qkv", _Linear),
        ("out", _Linear),
        ("fc", _Linear),
        ("proj", _Linear),
    ]


_MISSING = object()


class _Reader:
    """Reads a block's modules, parameters and settings straight from their dicts and records
    each read, so that a plan checks in microseconds that nothing it was built from changed
    (walking the modules through ``nn.Module.__getattr__`` took ~70 us a block)."""

    def __init__(self) -> None:
        self.reads: list[tuple[dict[str, Any], str, Any]] = []
        self.tensors: list[Tensor] = []  # the parameters read, whose addresses must not change

    def module(self, owner: nn.Module, name: str) -> Any:
        return self._read(owner._modules, name)

    def param(self, owner: nn.Module, name: str) -> Any:
        value = self._read(owner._parameters, name)
        if isinstance(value, Tensor):
            self.tensors.append(value)
        return value

    def attr(self, owner: Any, name: str) -> Any:
        return self._read(owner.__dict__, name)

    def _read(self, where: dict[str, Any], name: str) -> Any:
        value = where.get(name, _MISSING)
        self.reads.append((where, name, value))
        return value


class _Checks(NamedTuple):
    """What a plan was read from (each read, ``where[i].get(names[i])``, must give
    ``values[i]`` again), the tensors it points into (kept alive here) with their addresses,
    and the forward hooks of the modules it stands for (the kernel would skip them). The
    checks run in C (``map``): a plan is checked in microseconds, in one burst per token."""

    where: tuple[dict[str, Any], ...]
    names: tuple[str, ...]
    values: tuple[Any, ...]
    tensors: tuple[Tensor, ...]
    addresses: tuple[int, ...]
    hooks: tuple[dict[Any, Any], ...]

    @classmethod
    def of(cls, r: _Reader, modules: list[nn.Module]) -> _Checks:
        """The checks of everything ``r`` read, and of the hooks of ``modules``."""
        hooks = [r.attr(m, kind) for m in modules for kind in _HOOKS]
        where, names, values = zip(*r.reads, strict=True) if r.reads else ((), (), ())
        addresses = tuple(map(Tensor.data_ptr, r.tensors))
        return cls(where, names, values, tuple(r.tensors), addresses, tuple(hooks))

    def current(self) -> bool:
        """Whether every read gives the same object and every tensor the same address."""
        found = map(dict.get, self.where, self.names, repeat(_MISSING))
        return all(map(operator.is_, found, self.values)) and (
            tuple(map(Tensor.data_ptr, self.tensors)) == self.addresses
        )

    def hooked(self) -> bool:
        """Whether forward hooks are set on one of the modules or on every module."""
        every = nn.modules.module
        return any(self.hooks) or bool(
            every._global_forward_hooks or every._global_forward_pre_hooks
        )


class _Stack(NamedTuple):
    """A decoder's blocks as the kernel reads them: one ``zoo_block`` each, in an array
    (``None`` where a block is not one the kernel computes), each layer's ``(kv_heads,
    head_dim)``, and the checks of what it was read from."""

    blocks: Any  # ctypes array of _Block, or None
    geometry: tuple[tuple[int, int], ...]
    d_model: int
    checks: _Checks

    @classmethod
    def read(cls, blocks: nn.ModuleList) -> _Stack:
        """The plan of ``blocks`` as they are now."""
        r = _Reader()
        descriptions: list[_Block] = []
        modules: list[nn.Module] = []
        for name in list(blocks._modules):
            block = r.module(blocks, name)
            if type(block) is not TransformerBlock:  # a subclass may compute otherwise
                return cls(None, (), 0, _Checks.of(r, modules))
            description, parts = _describe(block, r)
            modules += [block, *parts]
            if description is None or (
                descriptions and description.d_model != descriptions[0].d_model
            ):
                return cls(None, (), 0, _Checks.of(r, modules))
            descriptions.append(description)
        if not descriptions:
            return cls(None, (), 0, _Checks.of(r, modules))
        array = (_Block * len(descriptions))(*descriptions)
        geometry = tuple((b.kv_heads, b.head_dim) for b in array)
        return cls(array, geometry, array[0].d_model, _Checks.of(r, modules))


def stack(
    blocks: nn.ModuleList,
    x: Tensor,
    cache: KVCache,
    start: int,
    mask: Tensor | None,
    causal: bool,
    rotation: Rotation | None,
) -> Tensor | None:
    """Every block of ``blocks`` in turn (``block(x, mask=mask, causal=causal,
    cache=cache.layers[i], start=start, rotation=rotation)``) for one new token of one
    sequence, in one call to zoo's kernels; ``None`` (the caller runs the blocks) where the
    module docstring's conditions do not hold, for any block.

    Shape:
        ``x (1, 1, d_model) -> (1, 1, d_model)``.
    """
    lib = _kernels()
    if lib is None or not _one_token(x, cache, start, mask, causal) or _records_grad(blocks, x):
        return None
    plan = _STACKS.get(blocks)
    if plan is None or len(blocks) != len(plan.geometry) or not plan.checks.current():
        plan = _STACKS[blocks] = _Stack.read(blocks)
    if plan.blocks is None or plan.checks.hooked() or plan.d_model != x.shape[-1]:
        return None
    caches = _caches(cache, plan.geometry, start)
    angles = _angles(rotation, min(hd for _, hd in plan.geometry))
    if caches is None or angles is None:
        return None
    keys, values = caches  # arrays of the layers' cache addresses, alive through the call
    y = torch.empty_like(x)
    status = lib.zoo_stack_step_f32(
        ctypes.addressof(plan.blocks), len(plan.geometry), x.data_ptr(), y.data_ptr(),
        ctypes.addressof(keys), ctypes.addressof(values), cache.layers[0].k.shape[2], start,
        *angles, torch.get_num_threads(),
    )  # fmt: skip
    return y if status == 0 else None


def _one_token(x: Tensor, cache: KVCache, start: int, mask: Tensor | None, causal: bool) -> bool:
    """Whether the step is one float32 token of one sequence on the CPU, with a plain cache
    and nothing masked."""
    return (
        mask is None
        and not (causal and start > 0)  # one query with SDPA's causal flag sees only key 0
        and type(cache) is KVCache
        and x.shape[:2] == (1, 1)
        and x.dtype is torch.float32
        and x.is_cpu
        and x.is_contiguous()
    )


def _records_grad(blocks: nn.Module, x: Tensor) -> bool:
    """Whether autograd would record this step (zoo's kernels record nothing)."""
    if not torch.is_grad_enabled():
        return False
    return x.requires_grad or any(p.requires_grad for p in blocks.parameters())


def _caches(cache: KVCache, geometry: tuple[tuple[int, int], ...], start: int) -> Any:
    """Two arrays of the addresses of every layer's keys and values, where each layer's cache
    is one contiguous float32 block of its key/value heads with room at ``start`` (the same
    length for all); ``None`` otherwise."""
    layers = cache.layers
    if len(layers) != len(geometry):
        return None
    length = layers[0].k.shape[2]
    for layer, (heads, hd) in zip(layers, geometry, strict=True):
        k, v = layer.k, layer.v
        if not (
            type(layer) is LayerCache
            and k.dtype is v.dtype is torch.float32
            and k.is_cpu
            and v.is_cpu
            and k.is_contiguous()
            and v.is_contiguous()
            and k.shape == v.shape == (1, heads, length, hd)
        ):
            return None
    if not 0 <= start < length:
        return None
    keys = (ctypes.c_void_p * len(layers))(*(layer.k.data_ptr() for layer in layers))
    values = (ctypes.c_void_p * len(layers))(*(layer.v.data_ptr() for layer in layers))
    return keys, values


def _angles(rotation: Rotation | None, head_dim: int) -> tuple[int, int | None, int | None] | None:
    """The rotary width and the addresses of the rotation's ``cos`` and ``sin`` for the
    kernel (``0, None, None`` without rotary positions); ``None`` where the rotation is not
    :class:`~zoo.nn.positions.Rotation` of one float32 position at most ``head_dim`` wide."""
    if rotation is None:
        return 0, None, None
    if type(rotation) is not Rotation:
        return None
    cos, sin = rotation.cos, rotation.sin
    rot = cos.shape[-1]
    if not (
        cos.shape == sin.shape == (1, 1, 1, rot)
        and 0 < rot <= head_dim
        and rot % 2 == 0
        and _vector(cos, rot)
        and _vector(sin, rot)
    ):
        return None
    return rot, cos.data_ptr(), sin.data_ptr()


def _describe(block: nn.Module, r: _Reader) -> tuple[_Block | None, tuple[nn.Module, ...]]:
    """``zoo_block`` for ``block`` and the modules it stands for, read through ``r``; no
    description where a part is not of a kind the kernel computes or the shapes do not
    chain."""
    branches = _branches(block, r)
    if branches is None:
        return None, ()
    attn, ffn = branches
    act = r.module(ffn, "act")
    owners = ((attn, "qkv"), (attn, "proj"), (ffn, "fc"), (ffn, "proj"))
    linear_modules = [r.module(owner, name) for owner, name in owners]
    norm_modules = [r.module(block, "attn_norm"), r.module(block, "ffn_norm")]
    modules = (attn, ffn, act, *linear_modules, *norm_modules)
    qkv, out, fc, proj = (_linear_of(m, r) for m in linear_modules)
    if qkv is None or out is None or fc is None or proj is None:
        return None, modules
    norm1, norm2 = (_norm_of(m, qkv.k, r) for m in norm_modules)
    code = _ACTIVATIONS.get((type(act), r.attr(act, "approximate") if type(act) is nn.GELU else ""))
    if code is None or norm1 is None or norm2 is None:
        return None, modules
    heads, kv_heads = r.attr(attn, "n_heads"), r.attr(attn, "n_kv_heads")
    hd, scale = r.attr(attn, "head_dim"), r.attr(attn, "scale")
    gated = type(ffn) is GatedFeedForward
    if not _chained((qkv, out, fc, proj), heads, kv_heads, hd, gated):
        return None, modules
    description = _Block(
        _layout(block, r), qkv.k, heads, kv_heads, hd, code, gated, 0,
        hd**-0.5 if scale is None else scale, 0.0, norm1, norm2, qkv, out, fc, proj,
    )  # fmt: skip
    return description, modules


def _chained(
    linears: tuple[_Linear, _Linear, _Linear, _Linear],
    heads: int,
    kv_heads: int,
    hd: int,
    gated: bool,
) -> bool:
    """Whether the products' shapes chain: qkv's width is the heads', out maps them back to
    the model width, fc's (half of it, gated) is proj's input."""
    qkv, out, fc, proj = linears
    d_ff = fc.n // 2 if gated else fc.n
    return (
        qkv.n == (heads + 2 * kv_heads) * hd
        and out.k == heads * hd
        and out.n == fc.k == proj.n == qkv.k
        and proj.k == d_ff
        and (fc.n % 2 == 0 or not gated)
    )


def _branches(
    block: nn.Module, r: _Reader
) -> tuple[MultiHeadAttention, FeedForward | GatedFeedForward] | None:
    """The block's attention and feed-forward where they are of the kinds the kernel
    computes (no cross-attention, q/k norms or soft cap; no dropout while training)."""
    attn, ffn = r.module(block, "attn"), r.module(block, "ffn")
    if (
        r.module(block, "cross_attn") not in (None, _MISSING)  # a module, or None
        or r.attr(block, "cross_attn") not in (None, _MISSING)  # a plain attribute
        or type(attn) is not MultiHeadAttention
        or type(ffn) not in (FeedForward, GatedFeedForward)
        or r.attr(attn, "cross")
        or r.module(attn, "q_norm") is not None
        or r.module(attn, "k_norm") is not None
        or r.attr(attn, "softcap") is not None
        or (r.attr(block, "training") and r.attr(r.module(block, "drop"), "p") > 0)
        or (r.attr(attn, "training") and r.attr(attn, "dropout") > 0)
    ):
        return None
    return attn, ffn


def _layout(block: nn.Module, r: _Reader) -> int:
    """The kernel's code for the block's residual layout."""
    if r.attr(block, "parallel"):
        return _PARALLEL
    return _PRE_NORM if r.attr(block, "norm_first") else _POST_NORM


def _linear_of(m: nn.Module, r: _Reader) -> _Linear | None:
    """A linear layer as the kernel reads it (float32 rows, or a ``quantize="int8"`` layer's
    :class:`~zoo.nn.native_int8.Int8Rows`), or ``None`` for a layer it does not take."""
    if type(m) in _FLOAT_LINEARS:
        w, b = r.param(m, "weight"), r.param(m, "bias")
        if not (w.dtype is torch.float32 and w.is_cpu and w.is_contiguous() and w.dim() == 2):
            return None
        n, k = w.shape
        if b is not None and not _vector(b, n):
            return None
        return _Linear(0, n, k, w.data_ptr(), None, None, _address(b))
    if type(m).__name__ != "DynamicInt8Linear":  # zoo.nn.quant's (torch.ao is not imported here)
        return None
    r.attr(r.module(m, "_packed_params"), "_packed_params")  # set_weight_bias replaces it
    rows = _rows_of(m)
    if rows is None or r.attr(m, _ROWS) is not rows:
        return None
    n, k = rows.q.shape
    return _Linear(1, n, k, *rows.pointers())


def _norm_of(m: nn.Module, d: int, r: _Reader) -> _Norm | None:
    """A norm as the kernel reads it, or ``None``."""
    kind = type(m)
    if kind is LayerNorm:
        if r.attr(m, "normalized_shape") != (d,):
            return None
        w, b, code, offset = r.param(m, "weight"), r.param(m, "bias"), 0, 0.0
    elif kind in (RMSNorm, UnitOffsetRMSNorm):
        w, b, code = r.param(m, "weight"), None, 1
        offset = 1.0 if kind is UnitOffsetRMSNorm else 0.0
        if w is None:
            return None
    else:
        return None
    if not all(t is None or _vector(t, d) for t in (w, b)):
        return None
    return _Norm(code, _address(w), _address(b), r.attr(m, "eps"), offset)


def _address(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
