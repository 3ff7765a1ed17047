"""One decoding step of a whole :class:`~zoo.nn.decoder.DecoderLM` in one call to zoo's CPU
kernels (``zoo/kernels/_native_block.c``): the token embedding, every block, the final norm
and the head, for one sequence (:func:`decode`, batch 1) or for rows of many
(:func:`decode_rows`, :func:`decode_parts`: a slot batch's step, its prompt chunks, or both
at once; each row at its own position in its own slot, the weights read once for all rows).

Why: with :mod:`zoo.kernels.native`'s kernels a batch-1 step's matrix products stream the weights
at the memory's rate, and what was left of a gpt2-124m token (a sizeable share of a float32
one, more of an int8 one) was the rest of the step: about a hundred small PyTorch operations
and a few thousand Python calls, each run cold, right after the weights streamed through the
caches, where each costs many times what it costs warm (docs/benchmarks.md, "Figures behind
design choices", has the figures). :func:`decode` does all of it in one C call, with the same
kernels the per-module path calls one by one; the Python before it runs once a token.

Where it applies: every block a plain :class:`~zoo.nn.blocks.TransformerBlock` (pre-norm,
post-norm or parallel residual, no cross-attention) of
:class:`~zoo.nn.attention.MultiHeadAttention` (no q/k norms, no soft cap),
:class:`~zoo.nn.feedforward.FeedForward` or :class:`~zoo.nn.feedforward.GatedFeedForward`
(GELU, GELU-tanh, ReLU or SiLU) and zoo's norms; float32 or ``quantize="int8"`` linears; a
float32 or int8 token embedding with learned, rotary or no positions; one token of one
sequence on the CPU, a plain :class:`~zoo.runtime.cache.KVCache`, every layer seeing every key
(no padding, no sliding window, no score bias) and turned by one rotation; no gradients and
no forward hooks on any of these modules; every tensor it points into a plain CPU tensor
(no subclass) inside its storage, re-checked at every step. Anything else (LoRA adapters,
which are hooks; a plugin's own block) takes the per-module path, unchanged.
:mod:`zoo.runtime.native_plan` reads the modules; :class:`~zoo.runtime.decoding.DecoderSession`
tries :func:`one_call` before the model's own forward pass at every prefill and step, and
:class:`~zoo.runtime.slots.SlotBatch` tries :func:`decode_parts` at every step and short
prompt pass.

Numerics: the per-module path's, except the activation (computed in C, within a few ulp of
PyTorch's; ReLU is exact), so greedy tokens stay the same (``tests/test_native_block.py``).
Each row of a batch has the bits it has alone (``tests/test_native_slots.py``).
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..kernels.native import _kernels, _plain_blocks, _vector
from ..nn.positions import Rotation
from .cache import KVCache, LayerCache
from .native_plan import Plan, read_plan

if TYPE_CHECKING:
    from ..nn.decoder import DecoderLM

__all__ = ["decode", "decode_parts", "decode_rows", "one_call", "sees_every_key"]

#: Each model's plan, held beside it (a ctypes structure in a module's own attributes would
#: make the model impossible to copy or pickle) and dropped with it.
_PLANS: weakref.WeakKeyDictionary[nn.Module, Plan] = weakref.WeakKeyDictionary()


def one_call(
    model: DecoderLM, ids: Tensor, keep: Tensor | None, positions: Tensor, cache: KVCache
) -> Tensor | None:
    """``model.logits(ids, keep, positions, cache=cache, last_only=True)`` for one new token
    of one sequence, in one call to zoo's CPU kernels (:func:`decode`), where every layer sees
    every key and turns by the same angles; ``None`` where it does not apply (nothing
    computed, nothing written). On success the cache has advanced by one position.

    Shape:
        ``ids (1, 1) -> (1, 1, vocab_size)``.
    """
    if keep is not None or ids.shape != (1, 1) or not sees_every_key(model):
        return None
    logits = decode(model, ids, positions, cache, model.pos_emb.rotation)
    if logits is None:
        return None
    cache.advance(1)
    return model.finish_logits(logits)


def sees_every_key(model: DecoderLM) -> bool:
    """Whether every layer of ``model`` sees every key before its query (no sliding window,
    no score bias) and turns by the model's one rotation: the attention the kernel
    computes."""
    return not (
        model._other_positions
        or model.pos_emb.adds_score_bias
        or any(window is not None for window in model.layer_windows)
    )


def decode(
    model: nn.Module,
    ids: Tensor,
    positions: Tensor,
    cache: KVCache,
    rotation: Callable[[Tensor], Rotation | None],
) -> Tensor | None:
    """The logits of ``model`` (a :class:`~zoo.nn.decoder.DecoderLM`) for one new token
    ``ids`` ``(1, 1)`` at position ``positions`` ``(1, 1)``, its keys and values written to
    ``cache`` at ``cache.length`` (which the caller advances), in one call to zoo's kernels;
    ``None`` (nothing computed) where the module docstring's conditions do not hold.
    ``rotation(positions)`` gives the rotary rotation (called only once the step applies,
    so that a model it does not take pays nothing for it).

    Shape:
        ``ids (1, 1) -> (1, 1, vocab_size)``.
    """
    if not _one_token(ids, positions, cache) or not _plain_layers(cache):
        return None
    keys = [layer.k for layer in cache.layers]
    values = [layer.v for layer in cache.layers]
    logits = decode_rows(
        model, [int(ids)], [int(positions)], [0], [cache.length], keys, values,
        lambda: rotation(positions),
    )  # fmt: skip
    return None if logits is None else logits.view(1, 1, -1)


def decode_rows(
    model: nn.Module,
    tokens: list[int],
    positions: list[int],
    slots: list[int],
    starts: list[int],
    keys: list[Tensor],
    values: list[Tensor],
    rotation: Callable[[], Rotation | None],
    outputs: list[int] | None = None,
) -> Tensor | None:
    """The logits of ``model`` (a :class:`~zoo.nn.decoder.DecoderLM`) for ``N`` new tokens,
    in one call to zoo's kernels: row ``i``'s token ``tokens[i]`` at position
    ``positions[i]``, its keys and values written at position ``starts[i]`` of slot
    ``slots[i]`` of every layer's caches ``keys``, ``values`` (``(R, H_kv, L, hd)`` each,
    ``R`` slots of ``L`` positions), its queries attending to positions ``[0, starts[i]]`` of
    its slot. Each row is one new token of a sequence decoding (each in its own slot), or of
    a prompt whose tokens are rows of one slot at successive positions (each sees those
    before it). ``rotation()`` gives the rotary rotation of the ``N`` positions
    (``cos``/``sin`` ``(N, 1, 1, rot)``), called only once the step applies. ``None``
    (nothing computed or written) where the module docstring's conditions do not hold; each
    row's logits are those it has computed alone.

    Shape:
        ``N`` tokens -> ``(N, vocab_size)``, or ``(len(outputs), vocab_size)``: the rows
        ``outputs`` (increasing) alone.
    """
    lib = _kernels()
    if lib is None or _records_grad(model):
        return None
    plan = _PLANS.get(model)
    if plan is None or not plan.checks.current():
        plan = _PLANS[model] = read_plan(model)
    if plan.decoder is None or plan.checks.hooked():
        return None
    rows = len(tokens)
    caches = _caches(keys, values, plan.geometry)
    if caches is None or not _placed(slots, starts, rows, keys[0].shape):
        return None
    turn = rotation()  # held here: the kernel reads its cos and sin
    angles = _angles(turn, min(hd for _, hd in plan.geometry), rows)
    if angles is None:
        return None
    key_addresses, value_addresses = caches  # alive through the call
    wanted = list(range(rows)) if outputs is None else outputs
    numbers = [
        torch.tensor(v, dtype=torch.int64) for v in (tokens, positions, slots, starts, wanted)
    ]
    logits = torch.empty(len(wanted), plan.decoder.head.n)
    status = lib.zoo_decode_rows_f32(
        ctypes.byref(plan.decoder), rows, *(t.data_ptr() for t in numbers[:4]), len(wanted),
        numbers[4].data_ptr(), logits.data_ptr(), ctypes.addressof(key_addresses),
        ctypes.addressof(value_addresses), keys[0].shape[2], *angles, torch.get_num_threads(),
    )  # fmt: skip
    return logits if status == 0 else None


def decode_parts(
    model: DecoderLM,
    keys: list[Tensor],
    values: list[Tensor],
    parts: list[tuple[int, int, list[int]]],
) -> Tensor | None:
    """The logits of the last token of each part ``(slot, start, tokens)`` (a sequence's
    next token, or a chunk of its prompt, appended from position ``start`` of its slot of the
    caches ``keys``, ``values``: see :func:`decode_rows`), all in one call to zoo's kernels;
    ``None`` (nothing computed) where it does not apply.

    Shape:
        ``P`` parts -> ``(P, vocab_size)``.
    """
    if not sees_every_key(model):
        return None
    tokens: list[int] = []
    places: list[int] = []
    slots: list[int] = []
    ends: list[int] = []  # each part's last row
    for slot, start, ids in parts:
        tokens += ids
        places += range(start, start + len(ids))
        slots += [slot] * len(ids)
        ends.append(len(tokens) - 1)
    positions = torch.tensor(places)[:, None]  # (T, 1): each token's position
    logits = decode_rows(
        model, tokens, places, slots, places, keys, values,
        lambda: model.pos_emb.rotation(positions), ends,
    )  # fmt: skip
    return None if logits is None else model.finish_logits(logits)


def _one_token(ids: Tensor, positions: Tensor, cache: KVCache) -> bool:
    """Whether the step is one token of one sequence on the CPU with a plain cache."""
    return (
        type(cache) is KVCache
        and ids.shape == positions.shape == (1, 1)
        and ids.is_cpu
        and positions.is_cpu
        and not ids.is_floating_point()
        and not positions.is_floating_point()
    )


def _plain_layers(cache: KVCache) -> bool:
    """Whether every layer of ``cache`` is a plain :class:`LayerCache` (its own buffers)."""
    return all(type(layer) is LayerCache for layer in cache.layers)


def _records_grad(model: nn.Module) -> bool:
    """Whether autograd would record this step (zoo's kernels record nothing)."""
    return torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters())


def _caches(
    keys: list[Tensor], values: list[Tensor], geometry: tuple[tuple[int, int], ...]
) -> tuple[Any, Any] | None:
    """Two arrays of the addresses of every layer's keys and values, where each layer's
    cache is one contiguous float32 block ``(R, H_kv, L, hd)`` of its geometry (the same
    ``R`` and ``L`` for all), a plain tensor inside its storage
    (:func:`zoo.kernels.native._plain_blocks`); ``None`` otherwise."""
    if len(keys) != len(geometry) or len(values) != len(geometry):
        return None
    slots, _, length, _ = keys[0].shape
    shapes = [(slots, heads, length, hd) for heads, hd in geometry]
    if not (
        list(map(Tensor.size, keys)) == shapes == list(map(Tensor.size, values))
        and _plain_blocks(keys + values)
    ):
        return None
    addresses = ctypes.c_void_p * len(keys)
    return addresses(*map(Tensor.data_ptr, keys)), addresses(*map(Tensor.data_ptr, values))


def _placed(slots: list[int], starts: list[int], rows: int, shape: torch.Size) -> bool:
    """Whether ``rows`` tokens sit at different places (slot, position) of a cache of
    ``shape`` ``(R, H_kv, L, hd)``."""
    return (
        rows > 0
        and len(slots) == len(starts) == rows
        and len(set(zip(slots, starts, strict=True))) == rows
        and all(0 <= slot < shape[0] for slot in slots)
        and all(0 <= start < shape[2] for start in starts)
    )


def _angles(
    rotation: Rotation | None, head_dim: int, rows: int
) -> tuple[int, int | None, int | None] | None:
    """The rotary width and the addresses of the rotation's ``cos`` and ``sin`` for the
    kernel (``0, None, None`` without rotary positions); ``None`` where the rotation is not
    :class:`~zoo.nn.positions.Rotation` of one float32 position per row, at most
    ``head_dim`` wide."""
    if rotation is None:
        return 0, None, None
    if type(rotation) is not Rotation:
        return None
    cos, sin = rotation.cos, rotation.sin
    rot = cos.shape[-1]
    if not (
        cos.shape == sin.shape == (rows, 1, 1, rot)
        and 0 < rot <= head_dim
        and rot % 2 == 0
        and _vector(cos, rows * rot)
        and _vector(sin, rows * rot)
    ):
        return None
    return rot, cos.data_ptr(), sin.data_ptr()
