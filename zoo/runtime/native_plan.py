"""What zoo's one-call decoding step (:mod:`zoo.runtime.native_block`,
``zoo/kernels/_native_block.c``) reads of a :class:`~zoo.nn.decoder.DecoderLM`: its token
embedding, blocks, final norm and head as C structures (``zoo_decoder``, ``zoo_block``,
``zoo_linear``, ``zoo_norm``, ``zoo_embedding``), and the checks that the modules they were
read from are unchanged.

The structures are defined in :mod:`zoo.kernels.native_abi`, which checks that the built library
lays them out alike.

A plan is read from the modules' own dicts (``_modules``, ``_parameters``, ``_buffers``,
``__dict__``) and records each read (:class:`Reader`); before each step :meth:`Checks.current`
asks every read again, and every tensor the plan points into its exact type, address, shape,
strides, storage offset, dtype and device (:mod:`zoo.kernels.native_facts`), in a few C-level
passes, so a module or weight replaced, or changed in place (another storage, ``t_()``,
``as_strided_``, ``p.data = p.data[:half]``, a dtype view), since the last step makes the
plan be read again, and forward hooks on any module it stands for make the step decline.
Only plain CPU tensors inside their storage are pointed into (:func:`zoo.kernels.native._plain`):
a tensor subclass (DTensor, torchao's, ``TwoTensor``) may keep its data elsewhere and report
address 0.
"""

from __future__ import annotations

import ctypes
import math
import operator
from itertools import repeat
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ..kernels.native import _address, _plain, _vector
from ..kernels.native_abi import Block as _Block
from ..kernels.native_abi import Decoder as _Decoder
from ..kernels.native_abi import Embedding as _Embedding
from ..kernels.native_abi import Linear as _Linear
from ..kernels.native_abi import Norm as _Norm
from ..kernels.native_facts import Facts
from ..kernels.native_int8 import _ROWS, rows_of
from ..nn.attention import MultiHeadAttention
from ..nn.blocks import TransformerBlock
from ..nn.decoder import DecoderLM
from ..nn.feedforward import FeedForward, GatedFeedForward
from ..nn.linear import Linear, OneDNNLinear
from ..nn.norms import LayerNorm, RMSNorm, UnitOffsetRMSNorm
from ..nn.positions import LearnedPositions, NoPositions, RotaryPositions

__all__ = ["Checks", "Plan", "read_plan"]

_HOOKS = ("_forward_hooks", "_forward_pre_hooks")  # a module's hook dicts
_FLOAT_LINEARS = (Linear, OneDNNLinear, nn.Linear)  # the same parameters and forward
_ACTIVATIONS = {(nn.GELU, "none"): 0, (nn.GELU, "tanh"): 1, (nn.ReLU, ""): 2, (nn.SiLU, ""): 3}
_PRE_NORM, _POST_NORM, _PARALLEL = 0, 1, 2
_POSITIONS_WITHOUT_VECTORS = (RotaryPositions, NoPositions)


_MISSING = object()


class Reader:
    """Reads a block's modules, parameters and settings straight from their dicts and records
    each read, so that a plan checks in microseconds that nothing it was built from changed
    (walking the modules through ``nn.Module.__getattr__`` at every step cost far more:
    docs/benchmarks.md, "Figures behind design choices")."""

    def __init__(self) -> None:
        self.reads: list[tuple[dict[str, Any], str, Any]] = []
        self.tensors: list[Tensor] = []  # what the plan points into: see Checks.facts

    def module(self, owner: nn.Module, name: str) -> Any:
        return self._read(owner._modules, name)

    def child(self, owner: nn.Module, name: str) -> Any:
        """A child module, or ``None`` (an attribute set to ``None`` before any module was
        registered under its name lives in ``__dict__``)."""
        value = self.module(owner, name)
        if value is _MISSING:
            value = self.attr(owner, name)
        return None if value is _MISSING else value

    def param(self, owner: nn.Module, name: str) -> Any:
        return self.tensor(self._read(owner._parameters, name))

    def buffer(self, owner: nn.Module, name: str) -> Any:
        return self.tensor(self._read(owner._buffers, name))

    def tensor(self, value: Any) -> Any:
        """``value``, recorded where it is a tensor: one the plan points into."""
        if isinstance(value, Tensor):
            self.tensors.append(value)
        return value

    def attr(self, owner: Any, name: str) -> Any:
        return self._read(owner.__dict__, name)

    def _read(self, where: dict[str, Any], name: str) -> Any:
        value = where.get(name, _MISSING)
        self.reads.append((where, name, value))
        return value


class Checks(NamedTuple):
    """What a plan was read from (each read, ``where[i].get(names[i])``, must give
    ``values[i]`` again), the tensors it points into with their facts
    (:class:`~zoo.kernels.native_facts.Facts`, which keeps them alive), and the forward hooks of
    the modules it stands for (the kernel would skip them). The checks run in C (``map``, and
    PyTorch's C++ check of tensors): a plan is checked in microseconds, in one burst per
    token."""

    where: tuple[dict[str, Any], ...]
    names: tuple[str, ...]
    values: tuple[Any, ...]
    facts: Facts
    hooks: tuple[dict[Any, Any], ...]

    @classmethod
    def of(cls, r: Reader, modules: list[nn.Module]) -> Checks:
        """The checks of everything ``r`` read, and of the hooks of ``modules``."""
        hooks = [r.attr(m, kind) for m in modules for kind in _HOOKS]
        where, names, values = zip(*r.reads, strict=True) if r.reads else ((), (), ())
        return cls(where, names, values, Facts.of(r.tensors), tuple(hooks))

    def current(self) -> bool:
        """Whether every read gives the same object and every tensor the same facts."""
        found = map(dict.get, self.where, self.names, repeat(_MISSING))
        return all(map(operator.is_, found, self.values)) and self.facts.current()

    def hooked(self) -> bool:
        """Whether forward hooks are set on one of the modules or on every module."""
        every = nn.modules.module
        return any(self.hooks) or bool(
            every._global_forward_hooks or every._global_forward_pre_hooks
        )


class Plan(NamedTuple):
    """A decoder as the kernel reads it (``decoder`` ``None``: a model it does not compute),
    the array of blocks it points into, each layer's ``(kv_heads, head_dim)``, and the checks
    of what it was read from."""

    decoder: _Decoder | None
    blocks: Any  # the ctypes array of _Block that `decoder` points into
    geometry: tuple[tuple[int, int], ...]
    checks: Checks


#: What the one-call step computes itself of a :class:`~zoo.nn.decoder.DecoderLM`: a model
#: that overrides one of these methods (in its class, or on the instance) computes otherwise.
_STOOD_FOR = ("embed", "states", "logits")


def _embeds_as_decoder_lm(model: nn.Module, r: Reader) -> bool:
    """Whether ``model`` computes :data:`_STOOD_FOR` as DecoderLM does and embeds as the
    kernel does: no ``embedding_multiplier``, no seam after its embedding (``emb_norm``,
    ``post_embedding``); the reads are recorded, so a method, module or config set on it later
    makes the plan be read again."""
    cls = type(model)
    return (
        all(
            getattr(cls, name, None) is getattr(DecoderLM, name) and r.attr(model, name) is _MISSING
            for name in _STOOD_FOR
        )
        and all(r.child(model, seam) is None for seam in ("emb_norm", "post_embedding"))
        and getattr(r.attr(model, "config"), "embedding_multiplier", 1.0) == 1.0
    )


def read_plan(model: nn.Module) -> Plan:
    """The plan of ``model`` (a :class:`~zoo.nn.decoder.DecoderLM`) as it is now: none (its
    ``decoder`` ``None``) for a model whose embedding, blocks, final norm or head are not of
    the kinds the kernel computes, or that embeds otherwise (:func:`_embeds_as_decoder_lm`)."""
    r = Reader()
    modules: list[nn.Module] = []
    if not _embeds_as_decoder_lm(model, r):
        return Plan(None, None, (), Checks.of(r, modules))
    blocks = _blocks_of(r.module(model, "blocks"), r, modules)
    if blocks is None:
        return Plan(None, None, (), Checks.of(r, modules))
    d = blocks[0].d_model
    tokens, positions, drop = (r.module(model, name) for name in ("tok_emb", "pos_emb", "drop"))
    final, head_module = r.child(model, "final_norm"), r.module(model, "head")
    parts = (tokens, positions, drop, final, head_module)
    modules += [m for m in parts if isinstance(m, nn.Module)]
    embedding = _embedding_of(tokens, positions, drop, r.attr(model, "config"), d, r)
    final_norm = None if final is None else _norm_of(final, d, r)
    head = _linear_of(head_module, r)
    if embedding is None or head is None or head.k != d or (final is not None and not final_norm):
        return Plan(None, None, (), Checks.of(r, modules))
    decoder = _Decoder(
        embedding, ctypes.addressof(blocks), len(blocks), final is not None,
        final_norm or _Norm(), head,
    )  # fmt: skip
    geometry = tuple((b.kv_heads, b.head_dim) for b in blocks)
    return Plan(decoder, blocks, geometry, Checks.of(r, modules))


def _blocks_of(blocks: Any, r: Reader, modules: list[nn.Module]) -> Any:
    """The ``zoo_block`` array of a stack of blocks, or ``None`` where one is not a
    :class:`~zoo.nn.blocks.TransformerBlock` the kernel computes (a subclass may compute
    otherwise, unless it declares ``same_forward``), or their widths differ."""
    if not isinstance(blocks, nn.ModuleList):
        return None
    descriptions: list[_Block] = []
    for name in list(blocks._modules):
        block = r.module(blocks, name)
        if not _computes_as_transformer_block(block):
            return None
        description, parts = _describe(block, r)
        modules += [block, *parts]
        if description is None or (descriptions and description.d_model != descriptions[0].d_model):
            return None
        descriptions.append(description)
    return (_Block * len(descriptions))(*descriptions) if descriptions else None


def _computes_as_transformer_block(block: Any) -> bool:
    """A :class:`~zoo.nn.blocks.TransformerBlock`, or a subclass that declares in its own
    class body that its forward is TransformerBlock's (``same_forward = True``)."""
    kind = type(block)
    return kind is TransformerBlock or (
        issubclass(kind, TransformerBlock) and kind.__dict__.get("same_forward") is True
    )


def _embedding_of(
    tokens: Any, positions: Any, drop: Any, config: Any, d: int, r: Reader
) -> _Embedding | None:
    """The token embedding (``nn.Embedding`` or quantization's int8 rows), times
    sqrt(d_model) with ``scale_embeddings``, plus learned positions (or none: rotary
    positions turn the queries and keys instead), as the kernel reads it; ``None`` for others
    or dropout while training."""
    if type(drop) is not nn.Dropout or (r.attr(drop, "training") and r.attr(drop, "p") > 0):
        return None
    table = _positions_of(positions, d, r)
    rows = _token_rows_of(tokens, d, r)
    if table is None or rows is None:
        return None
    scale = float(torch.tensor(math.sqrt(d))) if config.scale_embeddings else 1.0  # float32
    kind, vocab, pointers = rows
    count, address = (0, None) if table is _NO_TABLE else (table.shape[0], table.data_ptr())
    return _Embedding(kind, vocab, count, *pointers, address, scale)


_NO_TABLE = torch.empty(0)  # positions that add no vectors


def _positions_of(positions: Any, d: int, r: Reader) -> Tensor | None:
    """A learned position table ``(max_positions, d)``, :data:`_NO_TABLE` for schemes that
    add no vectors, ``None`` for others."""
    if type(positions) in _POSITIONS_WITHOUT_VECTORS:
        return _NO_TABLE
    if type(positions) is not LearnedPositions:
        return None
    table = r.param(positions, "weight")
    return table if _rows(table, d, torch.float32) else None


def _token_rows_of(
    tokens: Any, d: int, r: Reader
) -> tuple[int, int, tuple[int, int | None]] | None:
    """The embedding's kind, vocabulary and addresses (rows, and int8 rows' scales), or
    ``None`` for an embedding the kernel does not read."""
    if type(tokens) is nn.Embedding and r.attr(tokens, "max_norm") is None:
        rows = r.param(tokens, "weight")
        if _rows(rows, d, torch.float32):
            return 0, rows.shape[0], (rows.data_ptr(), None)
    elif type(tokens).__name__ == "Int8Embedding" and r.attr(tokens, "dtype") is torch.float32:
        q, row_scale = r.buffer(tokens, "qweight"), r.buffer(tokens, "scale")
        if _rows(q, d, torch.int8) and _vector(row_scale, q.shape[0]):
            return 1, q.shape[0], (q.data_ptr(), row_scale.data_ptr())
    return None


def _rows(t: Any, d: int, dtype: torch.dtype) -> bool:
    """Whether ``t`` is a contiguous ``(n, d)`` table of ``dtype`` on the CPU, a plain tensor
    inside its storage (:func:`zoo.kernels.native._plain`)."""
    return _plain(t, dtype) and t.dim() == 2 and t.shape[1] == d and t.is_contiguous()


def _describe(block: nn.Module, r: Reader) -> tuple[_Block | None, tuple[nn.Module, ...]]:
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
        _layout(block, r), qkv.k, heads, kv_heads, hd, code, gated,
        hd**-0.5 if scale is None else scale, norm1, norm2, qkv, out, fc, proj,
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
    block: nn.Module, r: Reader
) -> tuple[MultiHeadAttention, FeedForward | GatedFeedForward] | None:
    """The block's attention and feed-forward where they are of the kinds the kernel
    computes (no cross-attention, q/k norms or soft cap; no dropout while training)."""
    attn, ffn = r.module(block, "attn"), r.module(block, "ffn")
    if (
        r.child(block, "cross_attn") is not None
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


def _layout(block: nn.Module, r: Reader) -> int:
    """The kernel's code for the block's residual layout."""
    if r.attr(block, "parallel"):
        return _PARALLEL
    return _PRE_NORM if r.attr(block, "norm_first") else _POST_NORM


def _linear_of(m: nn.Module, r: Reader) -> _Linear | None:
    """A linear layer as the kernel reads it (float32 rows, or a ``quantize="int8"`` layer's
    :class:`~zoo.kernels.native_int8.Int8Rows`), or ``None`` for a layer it does not take."""
    if type(m) in _FLOAT_LINEARS:
        w, b = r.param(m, "weight"), r.param(m, "bias")
        if not (_plain(w) and w.dim() == 2 and w.is_contiguous()):
            return None
        n, k = w.shape
        if b is not None and not _vector(b, n):
            return None
        return _Linear(0, n, k, w.data_ptr(), None, None, _address(b))
    if type(m).__name__ != "DynamicInt8Linear":  # zoo.quant's (a layer above this one)
        return None
    rows = rows_of(m)  # the layer's own weights (rows.q is its qweight) and their sums
    if rows is None or r.attr(m, _ROWS) is not rows:
        return None
    for name in ("qweight", "scale"):  # read as the plan's checks (replaced: read again)
        r.buffer(m, name)
    r.param(m, "bias")
    r.tensor(rows.colsum)  # checked at every step as a parameter is
    if not rows.intact():
        return None
    n, k = rows.q.shape
    return _Linear(1, n, k, *rows.pointers())


def _norm_of(m: nn.Module, d: int, r: Reader) -> _Norm | None:
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
