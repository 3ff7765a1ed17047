"""Continuous batching for :class:`zoo.nn.DecoderLM`: rows that decode at their own positions
in one preallocated key/value cache, so a sequence can join the running batch between two
steps and leave it when it ends.

A :class:`DecoderSession` decodes a left-padded batch whose rows share one cache length. A
:class:`SlotBatch` instead gives each row (a *slot*) its own length: a new sequence's prompt
is prefilled alone into a free slot (the same forward pass :func:`zoo.generate` runs for that
prompt), and every :meth:`SlotBatch.step` appends one token to each row, at that row's own
position, under a mask built from the rows' lengths. The rows in use are always the first
``n`` slots of the cache: a row that leaves is replaced by the last one, so a step reads the
buffers through views, never a copy. The model is not changed: the slot cache is a
:class:`~zoo.nn.cache.KVCache` whose layers write each row where that row ends, and the
step's mask is passed to :meth:`DecoderLM.logits` ready made.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

import torch
from torch import Tensor

from .base import activation_dtype, check_token_ids
from .cache import KVCache, LayerCache
from .decoder import DecoderLM

__all__ = ["SlotBatch", "SlotKVCache", "SlotLayerCache", "check_batchable"]

K = TypeVar("K", bound=Hashable)


class SlotLayerCache(LayerCache):
    """One layer's keys and values for rows at different positions.

    Args:
        k, v: the layer's whole buffers, ``(R, H, L, hd)`` (``R`` slots of ``L`` positions).
        rows: the rows in use, the first ``N``.
        span: the positions a step reads, the first ``S``.
        index: ``(N * H,)`` where each row's heads' new keys and values go, in the buffers
            seen as ``R * H * L`` vectors of ``hd``: ``(row * H + head) * L + position``
            (:meth:`SlotBatch.step` computes it once for every layer).
    """

    def __init__(self, k: Tensor, v: Tensor, rows: int, span: int, index: Tensor) -> None:
        super().__init__(k[:rows, :, :span], v[:rows, :, :span])  # (N, H, S, hd) views
        self._k_vectors = k.view(-1, k.shape[-1])  # (R * H * L, hd), the same memory
        self._v_vectors = v.view(-1, v.shape[-1])
        self.index = index

    def write(self, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store each row's one new key and value ``(N, H, 1, hd)`` at that row's position
        (``start`` is ignored) and return every position the step reads, ``(N, H, S, hd)``."""
        if k.shape[2] != 1:
            raise ValueError(f"a slot step appends one token per row, got {k.shape[2]}")
        self._k_vectors.index_copy_(0, self.index, k.reshape(-1, k.shape[-1]))  # (N * H, hd)
        self._v_vectors.index_copy_(0, self.index, v.reshape(-1, v.shape[-1]))
        return self.k, self.v


class SlotKVCache(KVCache):
    """The layers of a :class:`SlotBatch` step: :class:`SlotLayerCache` views that write at
    the rows' own positions. ``length`` stays 0 (each row has its own; the step's mask holds
    them) and :meth:`advance` does nothing (the batch counts)."""

    def __init__(self, layers: list[SlotLayerCache], max_len: int) -> None:  # views, no buffers
        self.layers = list(layers)
        self.max_len = max_len
        self.length = 0

    def advance(self, t: int) -> None:
        """Nothing: :class:`SlotBatch` advances each row's length."""


class _RowCache(KVCache):
    """One slot of a :class:`SlotBatch` as a one-row :class:`KVCache` (views of the slot's
    buffers): what a prompt is prefilled into, exactly as a decoding session's own cache."""

    def __init__(self, keys: list[Tensor], values: list[Tensor], row: int) -> None:
        self.layers = [
            LayerCache(k.narrow(0, row, 1), v.narrow(0, row, 1))
            for k, v in zip(keys, values, strict=True)
        ]
        self.max_len = keys[0].shape[2]
        self.length = 0


def check_batchable(model: object) -> None:
    """Raise ``ValueError`` unless :class:`SlotBatch` can decode ``model``: a
    :class:`DecoderLM` whose position scheme adds no attention score bias."""
    if not isinstance(model, DecoderLM):
        raise ValueError(
            f"continuous batching decodes a zoo.nn.DecoderLM, got {type(model).__name__} "
            "(encoder-decoders and plugins' own model classes generate with zoo.generate)"
        )
    if model.pos_emb.adds_score_bias:
        raise ValueError(
            f"{type(model.pos_emb).__name__} adds attention score biases, which depend on "
            "each row's position; continuous batching supports position schemes without "
            "them (learned, sinusoidal, rotary, none)"
        )


class SlotBatch(Generic[K]):
    """Sequences decoding together, each at its own position: continuous batching.

    Each sequence is known by a key of the caller's choosing. :meth:`add` prefills a prompt
    into a free slot and returns its next-token logits; :meth:`step` appends one token to
    every sequence in :attr:`keys` order and returns the next logits of each; :meth:`remove`
    frees a sequence's slot at once. A sequence's logits do not depend on which others share
    the batch (up to the float rounding of batched kernels): the prompt runs alone, and a
    step's mask lets each row see its own keys only.

    Args:
        model: a :class:`DecoderLM` (its position scheme must add no attention score bias).
        max_rows: slots, the most sequences decoding at once.
        max_len: positions per slot, prompt plus new tokens (default: the context length).

    Shape:
        - add: ``ids`` ``(T,)`` -> logits ``(vocab,)``.
        - step: ``tokens`` ``(N,)`` -> logits ``(N, vocab)``, ``N = len(keys)``.
    """

    def __init__(self, model: DecoderLM, max_rows: int, max_len: int | None = None) -> None:
        check_batchable(model)
        c = model.config
        max_len = c.context_length if max_len is None else max_len
        if not 0 < max_len <= c.context_length:
            raise ValueError(f"max_len must be in [1, {c.context_length}], got {max_len}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be a positive integer, got {max_rows}")
        dtype, device = activation_dtype(model)
        shape = (max_rows, c.n_kv_heads or c.n_heads, max_len, c.head_size)
        # zeros, not empty: a masked-out position still meets the attention weights, and
        # 0 * nan would be nan
        self._k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(c.n_layers)]
        self._v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(c.n_layers)]
        self.model = model
        self.max_rows = max_rows
        self.max_len = max_len
        self.device = device
        self._positions = torch.arange(max_len, device=device)  # (L,)
        self._heads = torch.arange(max_rows * shape[1], device=device).view(max_rows, shape[1])
        #: The sequences in their rows' order.
        self.keys: list[K] = []
        self._lengths: list[int] = []  # tokens in each row's cache

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def free(self) -> int:
        """Slots without a sequence."""
        return self.max_rows - len(self.keys)

    def length(self, key: K) -> int:
        """Tokens in ``key``'s cache: its prompt and the tokens appended since."""
        return self._lengths[self.keys.index(key)]

    def add(self, key: K, ids: Tensor | Sequence[int]) -> Tensor:
        """Prefill a prompt ``(T,)`` into a free slot as sequence ``key``; return its
        next-token logits ``(vocab,)``. Runs the model on the prompt alone, as a decoding
        session would."""
        if key in self.keys:
            raise ValueError(f"sequence {key!r} is in the batch already")
        if not self.free:
            raise ValueError(f"all {self.max_rows} slots are in use; remove a sequence first")
        c = self.model.config
        ids = torch.as_tensor(ids, device=self.device)
        prompt = check_token_ids(
            ids[None], vocab_size=c.vocab_size, context_length=self.max_len, name="prompt ids"
        )  # (1, T)
        t = prompt.shape[1]
        if t >= self.max_len:
            raise ValueError(
                f"the prompt has {t} tokens, and a slot holds {self.max_len} positions: "
                "no room for a new token"
            )
        row = len(self.keys)
        cache = _RowCache(self._k, self._v, row)
        positions = torch.arange(t, device=self.device)[None]  # (1, T)
        logits = self.model.logits(prompt, None, positions, cache=cache, last_only=True)
        self.keys.append(key)
        self._lengths.append(t)
        return logits[0, -1]

    def step(self, tokens: Tensor) -> Tensor:
        """Append one token to each sequence, ``(N,)`` in :attr:`keys` order; return each
        one's next-token logits ``(N, vocab)``."""
        n = len(self.keys)
        if tokens.shape != (n,):
            raise ValueError(f"step takes one token per sequence, shape ({n},); got {tokens.shape}")
        if n and max(self._lengths) >= self.max_len:
            full = self.keys[max(range(n), key=self._lengths.__getitem__)]
            raise ValueError(
                f"sequence {full!r} fills its slot ({self.max_len} positions); remove it"
            )
        span = max(self._lengths) + 1  # positions any row reads this step
        lengths = torch.tensor(self._lengths, device=self.device)  # (N,)
        keys = self._positions[:span]  # (S,)
        allowed = keys <= lengths[:, None]  # (N, S): a row's own keys and the new one
        masks = self.model.window_masks(  # (N, 1, 1, S) per window
            allowed[:, None, None, :], lengths[:, None, None, None], keys
        )
        heads = self._heads  # (N, H): row * H + head
        index = (heads[:n] * self.max_len + lengths[:, None]).reshape(-1)  # (N * H,)
        layers = [
            SlotLayerCache(k, v, n, span, index) for k, v in zip(self._k, self._v, strict=True)
        ]
        logits = self.model.logits(
            tokens.to(self.device)[:, None],  # (N, 1)
            None,
            lengths[:, None],  # (N, 1): each new token's position
            cache=SlotKVCache(layers, self.max_len),
            last_only=True,
            mask=masks,
        )
        self._lengths = [length + 1 for length in self._lengths]
        return logits[:, -1]

    def remove(self, key: K) -> None:
        """Free ``key``'s slot; the last row moves into it (its cache copied), so the rows in
        use stay the first ones."""
        row = self.keys.index(key)
        last = len(self.keys) - 1
        if row != last:
            length = self._lengths[last]
            for buffer in (*self._k, *self._v):
                buffer[row, :, :length] = buffer[last, :, :length]
            self.keys[row] = self.keys[last]
            self._lengths[row] = length
        self.keys.pop()
        self._lengths.pop()

    def clear(self) -> None:
        """Remove every sequence."""
        self.keys.clear()
        self._lengths.clear()
