"""Continuous batching for :class:`zoo.nn.DecoderLM`: rows that decode at their own positions
in one preallocated key/value cache, so a sequence can join the running batch between two
steps and leave it when it ends.

A :class:`DecoderSession` decodes a left-padded batch whose rows share one cache length. A
:class:`SlotBatch` instead gives each row (a *slot*) its own length. A new sequence's prompt
enters its slot in chunks (:meth:`SlotBatch.extend`): one chunk runs as :func:`zoo.generate`
runs a prompt, several of different sequences run in one left-padded pass, each at its own
position; the slot's first positions may also be copied in (a prefix cache's blocks). Every
:meth:`SlotBatch.step` appends one token to each decoding row, at that row's own position,
under a mask built from the rows' lengths. The rows in use are always the first ``n`` slots
of the cache: a row that leaves is replaced by the last one, so a step reads the buffers
through views, never a copy. The model is not changed: the slot cache is a
:class:`~zoo.runtime.cache.KVCache` whose layers write each row where that row ends, and the
pass's mask is passed to :meth:`DecoderLM.logits` ready made.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

import torch
from torch import Tensor

from ..errors import InsufficientMemoryError
from ..kernels.pages import make_resident
from ..memory import ALLOW_LARGE_ENV, allow_large, available_memory, format_bytes
from ..nn.base import activation_dtype, check_token_ids
from ..nn.decoder import DecoderLM
from .cache import KVCache, LayerCache
from .native_block import decode_parts

__all__ = [
    "ONE_CALL_PROMPT_ROWS",
    "SlotBatch",
    "SlotKVCache",
    "SlotLayerCache",
    "check_batchable",
    "one_call_fits",
]

#: The prompt tokens a prefill pass runs through zoo's one-call CPU step (each a row of its
#: weights' products) whatever their chunks; see :func:`one_call_fits`.
ONE_CALL_PROMPT_ROWS = 64


def one_call_fits(sizes: Sequence[int]) -> bool:
    """Whether prompt chunks of ``sizes`` tokens run best through the one-call step: up to
    :data:`ONE_CALL_PROMPT_ROWS` tokens in all, or up to four times that where the model's
    own pass, which pads every chunk to the longest, would run a fifth more tokens than
    they hold. A token costs the one call a little more than a padded token costs the
    model's pass, whose kernels are made for many rows (docs/benchmarks.md, "Figures behind
    design choices")."""
    real, padded = sum(sizes), len(sizes) * max(sizes, default=0)
    most = 4 * ONE_CALL_PROMPT_ROWS
    return real <= ONE_CALL_PROMPT_ROWS or (real <= most and 6 * real <= 5 * padded)


K = TypeVar("K", bound=Hashable)


class SlotLayerCache(LayerCache):
    """One layer's keys and values for rows at different positions.

    Args:
        k, v: the layer's whole buffers, ``(R, H, L, hd)`` (``R`` slots of ``L`` positions).
        rows: the rows a forward pass runs on: the first ``N`` (an int; read as views), or
            the slots of each of its ``N`` rows (a ``(N,)`` tensor; read as a gathered copy).
        span: the positions a step reads, the first ``S``.
        index: ``(N * H * T,)`` where each row's heads' new keys and values go, in the
            buffers seen as ``R * H * L`` vectors of ``hd``: ``(slot * H + head) * L +
            position`` (computed once for every layer).
    """

    def __init__(self, k: Tensor, v: Tensor, rows: int | Tensor, span: int, index: Tensor) -> None:
        if isinstance(rows, int):
            super().__init__(k[:rows, :, :span], v[:rows, :, :span])  # (N, H, S, hd) views
            self._rows: Tensor | None = None
        else:
            super().__init__(k[:, :, :span], v[:, :, :span])  # (R, H, S, hd), gathered on read
            self._rows = rows
        self._k_vectors = k.view(-1, k.shape[-1])  # (R * H * L, hd), the same memory
        self._v_vectors = v.view(-1, v.shape[-1])
        self.index = index

    def write(self, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store each row's new keys and values ``(N, H, T, hd)`` at that row's positions
        (``start`` is ignored) and return every position the pass reads, ``(N, H, S, hd)``."""
        self._k_vectors.index_copy_(0, self.index, k.reshape(-1, k.shape[-1]))  # (N * H * T, hd)
        self._v_vectors.index_copy_(0, self.index, v.reshape(-1, v.shape[-1]))
        if self._rows is None:
            return self.k, self.v
        return self.k.index_select(0, self._rows), self.v.index_select(0, self._rows)


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

    Each sequence is known by a key of the caller's choosing. :meth:`open` gives a sequence
    a free slot; :meth:`extend` runs prompt chunks of several sequences in one forward pass
    (each at its own position) and returns each one's next-token logits; :meth:`step`
    appends one token to each decoding sequence and returns their next logits; :meth:`remove`
    frees a sequence's slot at once. :meth:`add` is :meth:`open` plus one :meth:`extend` of
    the whole prompt. A sequence's logits do not depend on which others share the batch (up
    to the float rounding of batched kernels): a pass's mask lets each row see its own keys
    only.

    A slot's first positions may also be filled by copying keys and values in
    (:meth:`row_cache`, then :meth:`fill`), e.g. from a
    :class:`~zoo.runtime.prefix_cache.PrefixCache`.

    Args:
        model: a :class:`DecoderLM` (its position scheme must add no attention score bias).
        max_rows: slots, the most sequences decoding at once.
        max_len: positions per slot, prompt plus new tokens (default: the context length).
        before_forward: called before each forward pass with the sequences of its rows, in
            row order (e.g. to pick each row's LoRA adapter, :mod:`zoo.adapters.lora_bank`).

    Shape:
        - add: ``ids`` ``(T,)`` -> logits ``(vocab,)``.
        - extend: ``M`` chunks of ``T_i`` ids -> logits ``(M, vocab)``.
        - step: ``tokens`` ``(N,)`` -> logits ``(N, vocab)``, ``N = len(keys)``.
    """

    def __init__(
        self,
        model: DecoderLM,
        max_rows: int,
        max_len: int | None = None,
        *,
        before_forward: Callable[[list[K]], None] | None = None,
    ) -> None:
        check_batchable(model)
        make_resident(model)  # (each step streams the weights: onto huge pages)
        c = model.config
        max_len = c.context_length if max_len is None else max_len
        if not 0 < max_len <= c.context_length:
            raise ValueError(f"max_len must be in [1, {c.context_length}], got {max_len}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be a positive integer, got {max_rows}")
        dtype, device = activation_dtype(model)
        shape = (max_rows, c.n_kv_heads or c.n_heads, max_len, c.head_size)
        _check_cache_fits(shape, 2 * c.n_layers, dtype, device)
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
        self._before_forward = before_forward

    def _prepare(self, rows: list[K]) -> None:
        if self._before_forward is not None:
            self._before_forward(rows)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def free(self) -> int:
        """Slots without a sequence."""
        return self.max_rows - len(self.keys)

    def length(self, key: K) -> int:
        """Tokens in ``key``'s cache: its prompt and the tokens appended since."""
        return self._lengths[self.keys.index(key)]

    def open(self, key: K) -> None:
        """Give sequence ``key`` a free slot, empty (fill it with :meth:`extend`)."""
        if key in self.keys:
            raise ValueError(f"sequence {key!r} is in the batch already")
        if not self.free:
            raise ValueError(f"all {self.max_rows} slots are in use; remove a sequence first")
        self.keys.append(key)
        self._lengths.append(0)

    def row_cache(self, key: K) -> tuple[list[Tensor], list[Tensor]]:
        """``key``'s slot: its keys and values, a ``(H, L, hd)`` view per layer."""
        row = self.keys.index(key)
        return [k[row] for k in self._k], [v[row] for v in self._v]

    def fill(self, key: K, length: int) -> None:
        """Count the first ``length`` positions of ``key``'s slot as holding its keys and
        values (copied in through :meth:`row_cache`)."""
        if not 0 <= length < self.max_len:
            raise ValueError(f"a filled length must be in [0, {self.max_len}), got {length}")
        self._lengths[self.keys.index(key)] = length

    def add(self, key: K, ids: Tensor | Sequence[int]) -> Tensor:
        """Prefill a prompt ``(T,)`` into a free slot as sequence ``key``; return its
        next-token logits ``(vocab,)``. Runs the model on the prompt alone, as a decoding
        session would."""
        self.open(key)
        try:
            return self.extend([(key, ids)])[0]
        except BaseException:
            self.remove(key)
            raise

    def extend(self, chunks: Sequence[tuple[K, Tensor | Sequence[int]]]) -> Tensor:
        """Append each chunk of ids ``(T_i,)`` to its sequence's cache, all in one forward
        pass; return each sequence's next-token logits ``(M, vocab)``, in ``chunks`` order.

        One chunk runs exactly as a decoding session would run it; several are left-padded
        to the longest, their padding kept out of every cache and every real token's view.
        """
        if not chunks:
            raise ValueError("extend takes at least one chunk")
        rows = [self.keys.index(key) for key, _ in chunks]
        if len(set(rows)) != len(rows):
            raise ValueError("extend takes at most one chunk per sequence")
        ids = [self._checked(key, chunk) for key, chunk in chunks]
        self._prepare([key for key, _ in chunks])
        fused = self._extend_one_call(rows, ids)
        if fused is not None:
            return fused
        if len(ids) == 1:
            return self._extend_one(rows[0], ids[0])
        return self._extend_many(rows, ids)

    def _checked(self, key: K, chunk: Tensor | Sequence[int]) -> Tensor:
        """``chunk`` as validated ids ``(T,)`` that fit in ``key``'s slot with room for a new
        token."""
        c = self.model.config
        ids = torch.as_tensor(chunk, device=self.device)
        ids = check_token_ids(
            ids[None], vocab_size=c.vocab_size, context_length=self.max_len, name="prompt ids"
        )[0]  # (T,)
        length = self._lengths[self.keys.index(key)]
        if length + len(ids) >= self.max_len:
            raise ValueError(
                f"the prompt has {length + len(ids)} tokens, and a slot holds {self.max_len} "
                "positions: no room for a new token"
            )
        return ids

    def _extend_one_call(self, rows: list[int], chunks: list[Tensor]) -> Tensor | None:
        """:meth:`extend`'s logits ``(M, vocab)`` in one call to zoo's CPU kernels (each
        chunk's tokens rows of its slot at successive positions: :meth:`_in_one_call`), for
        chunks it fits (:func:`one_call_fits`); ``None`` (nothing computed) otherwise, and
        the model's own pass runs."""
        if not one_call_fits([len(chunk) for chunk in chunks]):
            return None
        parts = [(row, chunk.tolist()) for row, chunk in zip(rows, chunks, strict=True)]
        logits = self._in_one_call(parts)
        if logits is not None:
            for row, chunk in zip(rows, chunks, strict=True):
                self._lengths[row] += len(chunk)
        return logits

    def _in_one_call(self, parts: list[tuple[int, list[int]]]) -> Tensor | None:
        """The logits ``(P, vocab)`` of the last token of each part ``(row, tokens)``, the
        tokens appended to the row's cache (lengths not advanced), in one call to zoo's CPU
        kernels (:func:`~zoo.runtime.native_block.decode_parts`: the weights read once for
        all, each row as it is computed alone); ``None`` (nothing computed) where it does not
        apply, and the model's own pass runs."""
        if self.device.type != "cpu" or self._before_forward is not None:
            return None
        places = [(row, self._lengths[row], tokens) for row, tokens in parts]
        return decode_parts(self.model, self._k, self._v, places)

    def _extend_one(self, row: int, ids: Tensor) -> Tensor:
        """One chunk, as a decoding session runs it: ``(1, vocab)``."""
        start, t = self._lengths[row], len(ids)
        cache = _RowCache(self._k, self._v, row)
        cache.length = start
        keep = (
            None if start == 0 else torch.ones(1, start + t, dtype=torch.bool, device=self.device)
        )
        positions = torch.arange(start, start + t, device=self.device)[None]  # (1, T)
        logits = self.model.logits(ids[None], keep, positions, cache=cache, last_only=True)
        self._lengths[row] = start + t
        return logits[:, -1]

    def _extend_many(self, rows: list[int], chunks: list[Tensor]) -> Tensor:
        """Several chunks, left-padded into one ``(M, T)`` pass: ``(M, vocab)``. A padding
        token sits at position 0, sees key 0 only, and writes to the slot's last position,
        which no prompt token can hold (a prompt leaves room for a new token)."""
        m, t = len(chunks), max(len(c) for c in chunks)
        starts = torch.tensor([self._lengths[r] for r in rows], device=self.device)  # (M,)
        sizes = torch.tensor([len(c) for c in chunks], device=self.device)  # (M,)
        ids = torch.zeros(m, t, dtype=torch.long, device=self.device)
        for i, chunk in enumerate(chunks):
            ids[i, t - len(chunk) :] = chunk
        offsets = torch.arange(t, device=self.device) - t  # (T,): -T .. -1
        query = starts[:, None] + sizes[:, None] + offsets  # (M, T); padding < start
        real = offsets >= -sizes[:, None]  # (M, T)
        where = torch.where(real, query, self.max_len - 1)  # (M, T) cache position written
        positions = torch.where(real, query, 0)  # (M, T)
        span = int((starts + sizes).max())
        keys = self._positions[:span]  # (S,)
        allowed = keys <= positions[:, None, :, None]  # (M, 1, T, S)
        masks = self.model.window_masks(allowed, positions[:, None, :, None], keys)
        slots = torch.tensor(rows, device=self.device)  # (M,)
        heads = self._heads[slots]  # (M, H): slot * H + head
        index = (heads[:, :, None] * self.max_len + where[:, None, :]).reshape(-1)  # (M * H * T,)
        read: int | Tensor = m if rows == list(range(m)) else slots
        layers = [
            SlotLayerCache(k, v, read, span, index) for k, v in zip(self._k, self._v, strict=True)
        ]
        logits = self.model.logits(
            ids,
            None,
            positions,
            cache=SlotKVCache(layers, self.max_len),
            last_only=True,
            mask=masks,
        )
        for row, chunk in zip(rows, chunks, strict=True):
            self._lengths[row] += len(chunk)
        return logits[:, -1]

    def step(self, tokens: Tensor, keys: Sequence[K] | None = None) -> Tensor:
        """Append one token to each sequence of ``keys`` (default: every one, in
        :attr:`keys` order), ``tokens`` ``(N,)`` in that order; return each one's
        next-token logits ``(N, vocab)``. The others (e.g. sequences still prefilling) keep
        their caches: the pass runs on the rows up to the last one stepped, and a row not
        stepped writes only where its next token will go."""
        keys = self.keys if keys is None else keys
        n = len(keys)
        if tokens.shape != (n,):
            raise ValueError(f"step takes one token per sequence, shape ({n},); got {tokens.shape}")
        if not n:
            return torch.empty(0, self.model.config.vocab_size, device=self.device)
        rows = [self.keys.index(key) for key in keys]
        used = max(rows) + 1  # the pass runs on rows [0, used)
        for key, length in zip(self.keys[:used], self._lengths[:used], strict=True):
            if length >= self.max_len:  # stepped or riding along, it has nowhere to write
                raise ValueError(
                    f"sequence {key!r} fills its slot ({self.max_len} positions); remove it"
                )
        self._prepare(self.keys[:used])
        logits = self._step_logits(rows, tokens)  # (N, vocab)
        for row in rows:
            self._lengths[row] += 1
        return logits

    def step_and_extend(
        self,
        tokens: Tensor,
        keys: Sequence[K],
        chunks: Sequence[tuple[K, Tensor | Sequence[int]]],
    ) -> tuple[Tensor, Tensor] | None:
        """:meth:`step` for ``keys`` and :meth:`extend` for ``chunks`` (of other sequences)
        in one call to zoo's CPU kernels (continuous batching's mixed step: the weights read
        once for both, each token computed as it is alone), where it applies: prompt chunks
        it fits (:func:`one_call_fits`). Returns the step's logits
        ``(N, vocab)`` and the chunks' ``(M, vocab)``, or ``None`` (nothing computed: run
        :meth:`step` and :meth:`extend`)."""
        n = len(keys)
        if tokens.shape != (n,):
            raise ValueError(f"step takes one token per sequence, shape ({n},); got {tokens.shape}")
        rows = [self.keys.index(key) for key in keys]
        chunk_rows = [self.keys.index(key) for key, _ in chunks]
        if len({*rows, *chunk_rows}) != n + len(chunk_rows):
            raise ValueError("a sequence steps or takes a chunk at most once a call")
        ids = [self._checked(key, chunk) for key, chunk in chunks]
        room = all(self._lengths[row] < self.max_len for row in rows)
        if not (n and ids and room and one_call_fits(list(map(len, ids)))):
            return None
        parts = [(row, [token]) for row, token in zip(rows, tokens.tolist(), strict=True)]
        parts += [(row, chunk.tolist()) for row, chunk in zip(chunk_rows, ids, strict=True)]
        logits = self._in_one_call(parts)  # (N + M, vocab)
        if logits is None:
            return None
        for row, size in zip(rows + chunk_rows, [1] * n + list(map(len, ids)), strict=True):
            self._lengths[row] += size
        return logits[:n], logits[n:]

    def _step_logits(self, rows: list[int], tokens: Tensor) -> Tensor:
        """:meth:`step`'s forward pass over rows ``[0, max(rows)]``, ``tokens`` ``(N,)`` for
        ``rows``: their next-token logits ``(N, vocab)`` (lengths not yet advanced)."""
        fused = self._one_call(rows, tokens)
        if fused is not None:
            return fused
        used = max(rows) + 1
        inputs = torch.zeros(used, dtype=torch.long, device=self.device)
        inputs[rows] = tokens.to(self.device)
        lengths = torch.tensor(self._lengths[:used], device=self.device)  # (U,)
        span = int(lengths.max()) + 1  # positions any row reads this step
        logits = self._forward_rows(inputs, lengths, span)  # (U, vocab)
        return logits if rows == list(range(used)) else logits[rows]

    def _one_call(self, rows: list[int], tokens: Tensor) -> Tensor | None:
        """:meth:`step`'s logits ``(N, vocab)`` for ``rows`` alone in one call to zoo's CPU
        kernels (:meth:`_in_one_call`); ``None`` where it does not apply."""
        parts = [(row, [token]) for row, token in zip(rows, tokens.tolist(), strict=True)]
        return self._in_one_call(parts)

    def _forward_rows(self, inputs: Tensor, lengths: Tensor, span: int) -> Tensor:
        """One token ``inputs`` ``(U,)`` for each of rows ``[0, U)`` at positions ``lengths``
        ``(U,)``, reading each row's first ``span`` positions: logits ``(U, vocab)``. Waits
        for nothing on the host (:mod:`zoo.runtime.slot_step` records and compiles it)."""
        used = len(inputs)
        key_positions = self._positions[:span]  # (S,)
        allowed = key_positions <= lengths[:, None]  # (U, S): a row's own keys and the new one
        masks = self.model.window_masks(  # (U, 1, 1, S) per window
            allowed[:, None, None, :], lengths[:, None, None, None], key_positions
        )
        index = (self._heads[:used] * self.max_len + lengths[:, None]).reshape(-1)  # (U * H,)
        layers = [
            SlotLayerCache(k, v, used, span, index) for k, v in zip(self._k, self._v, strict=True)
        ]
        return self.model.logits(
            inputs[:, None],  # (U, 1)
            None,
            lengths[:, None],  # (U, 1): each new token's position
            cache=SlotKVCache(layers, self.max_len),
            last_only=True,
            mask=masks,
        )[:, -1]  # (U, vocab)

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


def _check_cache_fits(
    shape: tuple[int, int, int, int], tensors: int, dtype: torch.dtype, device: torch.device
) -> None:
    """Refuse, before allocating it, a slot cache (``tensors`` of ``shape``: keys and values
    of every layer) that the device cannot hold, naming the most rows that fit
    (``zoo serve --max-batch 65536`` was once a RuntimeError traceback)."""
    free = available_memory(device)
    row = tensors * shape[1] * shape[2] * shape[3] * dtype.itemsize
    if free is None or allow_large() or shape[0] * row <= free:
        return
    rows = int(0.9 * free) // row  # a tenth left for the model's own steps
    advice = f"--max-batch {rows} fits" if rows else "not one slot fits: lower --max-model-len"
    raise InsufficientMemoryError(
        f"{shape[0]} slots of {shape[2]} positions need {format_bytes(shape[0] * row)} of keys "
        f"and values, but {format_bytes(free)} is available on {device}: {advice} "
        f"({ALLOW_LARGE_ENV}=1 skips this check)"
    )
