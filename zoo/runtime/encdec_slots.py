"""Continuous batching for an encoder-decoder: each sequence's source encoded once, its
decoder row stepping with the others at its own target position.

A :class:`~zoo.runtime.slots.SlotBatch` gives each row of a decoder-only model its own
length; :class:`EncoderDecoderSlots` does the same for the decoder of an encoder-decoder
(zoo's ``EncoderDecoder``, which the Marian, BART and T5 families share). A sequence that
joins (:meth:`EncoderDecoderSlots.open`) has its source run through the encoder alone, once,
exactly as :func:`zoo.generate` runs one source, and each decoder layer's cross-attention
keys and values over it are kept in its slot (a source shorter than the slot's source
positions leaves the rest unread: each row's cross-attention mask covers its own source
only). Every :meth:`~EncoderDecoderSlots.step` appends one target token to each stepping
row at that row's own position, under a self-attention mask built from the rows' lengths
(plus the position scheme's score bias where it adds one: T5's relative bias, read for each
row at its own query position), so a row's logits do not depend on which others share the
pass (up to the float rounding of batched kernels). The first token of a target is the
model's start token, stepped like any other.

As in the decoder-only batch, the rows in use are always the first ``n`` slots: a row that
leaves is replaced by the last one (its caches copied), and a pass runs on the rows up to the
last one stepped, the others writing only where their own next token will go.

The model is read through what its decoder is made of (:class:`EncoderDecoderLike`): this
layer cannot import the plugin that defines the class.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast

import torch
from torch import Tensor, nn

from ..kernels.pages import make_resident
from ..nn.base import activation_dtype, check_token_ids
from .slots import SlotKVCache, SlotLayerCache, _check_cache_fits

__all__ = ["EncoderDecoderLike", "EncoderDecoderSlots", "check_encoder_decoder_batchable"]

K = TypeVar("K", bound=Hashable)

#: What a continuously batched encoder-decoder must have (zoo's ``EncoderDecoder`` has each).
NEEDED = ("encode", "memory_kv", "embed", "decoder", "decoder_head", "pos_emb")


class EncoderDecoderLike(Protocol):
    """The parts of zoo's encoder-decoder that a slot batch runs: the encoder
    (:meth:`encode`), each decoder layer's cross-attention keys and values
    (:meth:`memory_kv`), the target's embedding (:meth:`embed`), the decoder's layers and
    what turns their output into logits (:meth:`decoder_head`)."""

    config: Any
    decoder: nn.ModuleList
    pos_emb: Any

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor: ...

    def memory_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]: ...

    def embed(self, ids: Tensor, positions: Tensor, *, source: bool = False) -> Tensor: ...

    def decoder_head(self, x: Tensor) -> Tensor: ...


def check_encoder_decoder_batchable(model: object) -> EncoderDecoderLike:
    """``model`` as an :class:`EncoderDecoderLike`, or ``ValueError`` saying what it lacks:
    an encoder-decoder (``is_encoder_decoder``) built like zoo's ``EncoderDecoder``."""
    if not getattr(model, "is_encoder_decoder", False):
        raise ValueError(
            f"{type(model).__name__} is not an encoder-decoder; decoder-only models batch "
            "with zoo.runtime.slots.SlotBatch"
        )
    missing = [name for name in NEEDED if not hasattr(model, name)]
    if missing:
        raise ValueError(
            f"{type(model).__name__} is an encoder-decoder without {', '.join(missing)}: "
            "continuous batching runs encoder-decoders built like zoo's EncoderDecoder "
            "(transformer-encdec, Marian, BART, T5); generate with zoo.generate instead"
        )
    scheme = getattr(model, "pos_emb")  # noqa: B009 (checked just above)
    if scheme.adds_score_bias and not callable(getattr(scheme, "score_bias", None)):
        raise ValueError(f"{type(scheme).__name__} adds score biases without score_bias()")
    return cast("EncoderDecoderLike", model)


class EncoderDecoderSlots(Generic[K]):
    """Sequences of an encoder-decoder decoding together, each at its own target position.

    Each sequence is known by a key of the caller's choosing. :meth:`open` encodes its source
    into a free slot; :meth:`step` appends one target token to each stepping sequence and
    returns their next-token logits; :meth:`remove` frees a slot at once.

    Args:
        model: an encoder-decoder built like zoo's ``EncoderDecoder``
            (:func:`check_encoder_decoder_batchable`), in eval mode.
        max_rows: slots, the most sequences decoding at once.
        max_len: target positions per slot (the start token plus the new tokens), and the
            most source tokens a slot holds (default: the context length, which bounds both).

    Shape:
        - open: ``source`` ``(S,)``.
        - step: ``tokens`` ``(N,)`` -> logits ``(N, vocab)``, ``N = len(keys)``.
    """

    def __init__(self, model: object, max_rows: int, max_len: int | None = None) -> None:
        self.model = check_encoder_decoder_batchable(model)
        make_resident(cast("nn.Module", model))  # (each step streams the weights)
        c = self.model.config
        max_len = c.context_length if max_len is None else max_len
        if not 0 < max_len <= c.context_length:
            raise ValueError(f"max_len must be in [1, {c.context_length}], got {max_len}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be a positive integer, got {max_rows}")
        dtype, device = activation_dtype(cast("nn.Module", model))
        heads, layers = c.n_kv_heads or c.n_heads, c.n_decoder_layers
        # the target's and the source's positions side by side, for the memory check
        _check_cache_fits((max_rows, heads, 2 * max_len, c.head_size), 2 * layers, dtype, device)
        shape = (max_rows, heads, max_len, c.head_size)

        def buffers() -> list[Tensor]:  # zeros: a masked-out position still meets the weights
            return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

        self._k, self._v = buffers(), buffers()  # the decoder's own keys and values
        self._ck, self._cv = buffers(), buffers()  # cross-attention's, over each source
        self.max_rows = max_rows
        self.max_len = max_len
        self.device = device
        self.dtype = dtype
        self._positions = torch.arange(max_len, device=device)  # (L,)
        self._heads = torch.arange(max_rows * heads, device=device).view(max_rows, heads)
        #: The sequences in their rows' order.
        self.keys: list[K] = []
        self._lengths: list[int] = []  # target tokens in each row's cache
        self._sources: list[int] = []  # source tokens of each row

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def free(self) -> int:
        """Slots without a sequence."""
        return self.max_rows - len(self.keys)

    def length(self, key: K) -> int:
        """Target tokens in ``key``'s cache (the start token and those appended since)."""
        return self._lengths[self.keys.index(key)]

    def source_length(self, key: K) -> int:
        """Tokens of ``key``'s source."""
        return self._sources[self.keys.index(key)]

    def open(self, key: K, source: Tensor | Sequence[int]) -> None:
        """Encode ``source`` ``(S,)`` into a free slot as sequence ``key`` (its target empty:
        step its start token first)."""
        if key in self.keys:
            raise ValueError(f"sequence {key!r} is in the batch already")
        if not self.free:
            raise ValueError(f"all {self.max_rows} slots are in use; remove a sequence first")
        c = self.model.config
        ids = torch.as_tensor(source, device=self.device)
        ids = check_token_ids(
            ids[None], vocab_size=c.source_vocab, context_length=self.max_len, name="source ids"
        )  # (1, S)
        memory = self.model.encode(ids)  # (1, S, d_model): the source alone, as generate runs it
        row, s = len(self.keys), ids.shape[1]
        for i, (k, v) in enumerate(self.model.memory_kv(memory)):  # (1, H, S, hd) each
            self._ck[i][row, :, :s] = k[0]
            self._cv[i][row, :, :s] = v[0]
        self.keys.append(key)
        self._lengths.append(0)
        self._sources.append(s)

    def step(self, tokens: Tensor, keys: Sequence[K] | None = None) -> Tensor:
        """Append one target token to each sequence of ``keys`` (default: every one, in
        :attr:`keys` order), ``tokens`` ``(N,)`` in that order; return each one's next-token
        logits ``(N, vocab)``. The pass runs on the rows up to the last one stepped; a row not
        stepped writes only where its next token will go."""
        keys = self.keys if keys is None else keys
        n = len(keys)
        if tokens.shape != (n,):
            raise ValueError(f"step takes one token per sequence, shape ({n},); got {tokens.shape}")
        if not n:
            return torch.empty(0, self.model.config.vocab_size, device=self.device)
        rows = [self.keys.index(key) for key in keys]
        if len(set(rows)) != n:
            raise ValueError("step takes each sequence at most once")
        used = max(rows) + 1
        for key, length in zip(self.keys[:used], self._lengths[:used], strict=True):
            if length >= self.max_len:  # stepped or riding along, it has nowhere to write
                raise ValueError(
                    f"sequence {key!r} fills its slot ({self.max_len} target positions); remove it"
                )
        inputs = torch.zeros(used, dtype=torch.long, device=self.device)
        inputs[rows] = tokens.to(self.device)
        logits = self._forward_rows(inputs)  # (U, vocab)
        for row in rows:
            self._lengths[row] += 1
        return logits if rows == list(range(used)) else logits[rows]

    def _forward_rows(self, inputs: Tensor) -> Tensor:
        """One target token ``inputs`` ``(U,)`` for each of rows ``[0, U)`` at its row's
        position: logits ``(U, vocab)``, the model's decoder layer by layer as its own
        ``decoder_logits`` runs them, with each row's masks and positions."""
        model, used = self.model, len(inputs)
        lengths = torch.tensor(self._lengths[:used], device=self.device)  # (U,)
        span = int(lengths.max()) + 1  # target positions any row reads
        index = (self._heads[:used] * self.max_len + lengths[:, None]).reshape(-1)  # (U * H,)
        caches = SlotKVCache(
            [
                SlotLayerCache(k, v, used, span, index)
                for k, v in zip(self._k, self._v, strict=True)
            ],
            self.max_len,
        )
        sources = torch.tensor(self._sources[:used], device=self.device)  # (U,)
        width = int(sources.max())
        cross_mask = (self._positions[:width] < sources[:, None])[:, None, None, :]  # (U,1,1,S)
        x = model.embed(inputs[:, None], lengths[:, None])  # (U, 1, d_model)
        self_mask = self._self_mask(lengths, span, x.dtype)
        for i, layer in enumerate(model.decoder):
            x = layer(
                x,
                mask=self_mask,
                memory_mask=cross_mask,
                memory_kv=(self._ck[i][:used, :, :width], self._cv[i][:used, :, :width]),
                cache=caches.layers[i],
            )
        return model.decoder_head(x)[:, -1]  # (U, vocab)

    def _self_mask(self, lengths: Tensor, span: int, dtype: torch.dtype) -> Tensor:
        """Each row's query at its own position sees its own keys and the new one: boolean
        ``(U, 1, 1, S)``, or, where the position scheme adds a score bias, float
        ``(U, H, 1, S)`` (the bias of each row's query position, ``-inf`` elsewhere)."""
        allowed = (self._positions[:span] <= lengths[:, None])[:, None, None, :]  # (U, 1, 1, S)
        scheme = self.model.pos_emb
        if not scheme.adds_score_bias:
            return allowed
        bias = scheme.score_bias(span, span, self.device)  # (H, S, S): queries 0 .. S - 1
        rows = bias[:, lengths].permute(1, 0, 2)[:, :, None, :].to(dtype)  # (U, H, 1, S)
        blocked = torch.tensor(float("-inf"), dtype=dtype, device=self.device)
        return torch.where(allowed, rows, blocked)

    def remove(self, key: K) -> None:
        """Free ``key``'s slot; the last row moves into it (its caches copied), so the rows in
        use stay the first ones."""
        row = self.keys.index(key)
        last = len(self.keys) - 1
        if row != last:
            length, source = self._lengths[last], self._sources[last]
            for buffer in (*self._k, *self._v):
                buffer[row, :, :length] = buffer[last, :, :length]
            for buffer in (*self._ck, *self._cv):
                buffer[row, :, :source] = buffer[last, :, :source]
            self.keys[row] = self.keys[last]
            self._lengths[row] = length
            self._sources[row] = source
        self.keys.pop()
        self._lengths.pop()
        self._sources.pop()

    def clear(self) -> None:
        """Remove every sequence."""
        self.keys.clear()
        self._lengths.clear()
        self._sources.clear()
