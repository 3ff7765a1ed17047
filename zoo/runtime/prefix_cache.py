"""Keys and values of prompt prefixes, kept between requests: prefix caching.

A prompt's tokens are cut into blocks of ``block_size``; a block is known by a digest of its
tokens chained to the digest of the block before it (and a ``salt`` mixed into the first
block's: the LoRA adapter the keys were computed with, and who may reuse them, such as a
server's client and its request's ``cache_salt``), so equal digests mean the same tokens
from position 0 on under the same salt. Prompts of different salts never share a block: one
client cannot learn from a hit whether another's prompt is held. The
keys and values of a block live in a pool of preallocated block slots, one tensor per layer.
:meth:`PrefixCache.match` finds how many leading blocks of a new prompt are held and
:meth:`PrefixCache.load` copies them into a decoding row's cache, so only the rest of the
prompt is computed; :meth:`PrefixCache.store` copies a row's blocks in once they are computed.

Memory is bounded (``max_bytes``) and the least recently used blocks are evicted first. A
block is always used after the block it extends, so a chain's later blocks are older than
its earlier ones and eviction takes a chain from its end: no block held is unreachable.

Digests are keyed BLAKE2b (a secret drawn per cache), so no prompt can be crafted to take
another prompt's entry: a hit means the same tokens, and gives the same keys and values a miss
computes (up to the float rounding of a differently shaped forward pass).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import secrets
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..nn.base import activation_dtype

if TYPE_CHECKING:
    from ..nn.decoder import DecoderLM

__all__ = [
    "PrefixCache",
    "PrefixCacheStats",
    "PrefixMatch",
    "Salt",
    "prefix_cache_for",
    "token_bytes",
]

#: Tokens per block unless told otherwise.
DEFAULT_BLOCK_SIZE = 16

#: What keeps prompts apart in the cache: an integer (a LoRA adapter's index) or bytes (a
#: digest of the adapter, the client and the request's own salt); equal salts share blocks.
Salt = int | bytes


def token_bytes(n_layers: int, n_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one position's keys and values over ``n_layers`` layers of ``n_heads``
    key/value heads."""
    return 2 * n_layers * n_heads * head_dim * dtype.itemsize


def prefix_cache_for(model: DecoderLM, max_bytes: int | None) -> PrefixCache | None:
    """A prefix cache of ``max_bytes`` for ``model``'s keys and values (``None`` for 0; for
    ``None``, room for one whole context: a conversation's turns)."""
    c = model.config
    heads = c.n_kv_heads or c.n_heads
    dtype, device = activation_dtype(model)
    if max_bytes is None:
        max_bytes = token_bytes(c.n_layers, heads, c.head_size, dtype) * c.context_length
    if max_bytes < 0:
        raise ValueError(f"the prefix cache's memory must be >= 0 bytes, got {max_bytes}")
    if not max_bytes:
        return None
    return PrefixCache(
        c.n_layers, heads, c.head_size, max_bytes=max_bytes, dtype=dtype, device=device
    )


@dataclasses.dataclass(frozen=True)
class PrefixCacheStats:
    """What a :class:`PrefixCache` has done and holds.

    Attributes:
        queries: prompts looked up.
        hits: prompts that reused at least one block.
        hit_tokens: prompt tokens whose keys and values came from the cache.
        miss_tokens: prompt tokens looked up and not found (computed).
        bytes: bytes of keys and values held now.
        capacity_bytes: the most it may hold.
        blocks: blocks held now.
        evictions: blocks evicted so far.
    """

    queries: int
    hits: int
    hit_tokens: int
    miss_tokens: int
    bytes: int
    capacity_bytes: int
    blocks: int
    evictions: int


@dataclasses.dataclass(frozen=True)
class PrefixMatch:
    """The leading blocks of a prompt that a :class:`PrefixCache` holds: ``slots`` (their
    pool slots, in order) cover the first ``length`` tokens."""

    length: int
    slots: tuple[int, ...]


class PrefixCache:
    """A bounded, least-recently-used store of prompt prefixes' keys and values.

    Args:
        n_layers, n_heads, head_dim: the geometry of the model's caches (``n_heads``: key/value
            heads).
        max_bytes: the most its keys and values may take; blocks beyond it evict the least
            recently used.
        block_size: tokens per block: prefixes are matched and kept in whole blocks.
        dtype, device: those of the model's caches.
    """

    def __init__(
        self,
        n_layers: int,
        n_heads: int,
        head_dim: int,
        *,
        max_bytes: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size}")
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        #: Bytes of one block's keys and values over every layer.
        self.block_bytes = token_bytes(n_layers, n_heads, head_dim, dtype) * block_size
        self.capacity = max_bytes // self.block_bytes  # blocks
        self.block_size = block_size
        self._shape = (self.capacity, n_heads, block_size, head_dim)
        self._layers = n_layers
        self._dtype = dtype
        self._device = torch.device(device)
        self._keys: list[Tensor] = []  # per layer (capacity, H, B, hd), made at the first store
        self._values: list[Tensor] = []
        # digest -> pool slot, least recently used first
        self._blocks: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._free = list(range(self.capacity - 1, -1, -1))  # pool slots, popped from the end
        self._secret = secrets.token_bytes(16)
        self._queries = self._hits = self._hit_tokens = self._miss_tokens = self._evictions = 0

    def stats(self) -> PrefixCacheStats:
        """Counts so far and what is held now."""
        return PrefixCacheStats(
            queries=self._queries,
            hits=self._hits,
            hit_tokens=self._hit_tokens,
            miss_tokens=self._miss_tokens,
            bytes=len(self._blocks) * self.block_bytes,
            capacity_bytes=self.capacity * self.block_bytes,
            blocks=len(self._blocks),
            evictions=self._evictions,
        )

    def _digests(self, tokens: Sequence[int], salt: Salt) -> list[bytes]:
        """The chained digest of each whole block of ``tokens``, ``salt`` in the first's."""
        digests: list[bytes] = []
        parent = _salt_bytes(salt)
        b = self.block_size
        for start in range(0, len(tokens) - b + 1, b):
            block = array("q", tokens[start : start + b]).tobytes()
            parent = hashlib.blake2b(parent + block, digest_size=16, key=self._secret).digest()
            digests.append(parent)
        return digests

    def _touch(self, digests: Sequence[bytes]) -> None:
        """Mark a chain used, its first block last: a block stays more recent than every
        block that extends it, so eviction takes chains from their ends."""
        for digest in reversed(digests):
            self._blocks.move_to_end(digest)

    def match(self, tokens: Sequence[int], salt: Salt = 0) -> PrefixMatch:
        """The leading whole blocks of ``tokens`` held (computed with ``salt``), marked used,
        and counted as one query of ``len(tokens)`` tokens."""
        found: list[bytes] = []
        for digest in self._digests(tokens, salt):
            if digest not in self._blocks:
                break
            found.append(digest)
        self._touch(found)
        length = len(found) * self.block_size
        self._queries += 1
        self._hits += bool(found)
        self._hit_tokens += length
        self._miss_tokens += len(tokens) - length
        return PrefixMatch(length, tuple(self._blocks[d] for d in found))

    def load(self, match: PrefixMatch, keys: Sequence[Tensor], values: Sequence[Tensor]) -> None:
        """Copy the blocks of ``match`` into one row's caches, positions
        ``[0, match.length)``: ``keys``/``values`` hold a ``(H, L, hd)`` tensor per layer."""
        if not match.slots:
            return
        n, b = len(match.slots), self.block_size
        index = torch.tensor(match.slots, device=self._device)
        for pool, rows in ((self._keys, keys), (self._values, values)):
            for layer, row in zip(pool, rows, strict=True):
                _blocks(row, b, n).copy_(layer.index_select(0, index))

    def store(
        self,
        tokens: Sequence[int],
        keys: Sequence[Tensor],
        values: Sequence[Tensor],
        salt: Salt = 0,
    ) -> int:
        """Keep the whole blocks of ``tokens`` that are not held yet, copied from one row's
        caches (``keys``/``values``: a ``(H, L, hd)`` tensor per layer whose first
        ``len(tokens)`` positions hold those tokens' keys and values, computed with
        ``salt``); return how many blocks were added. Evicts the least recently used blocks
        to make room, never one of this chain's."""
        digests = self._digests(tokens, salt)
        if not digests or not self.capacity:
            return 0
        held = [d for d in digests if d in self._blocks]
        self._touch(held)  # this chain's blocks are the last to go
        chain = set(digests)
        new: list[tuple[int, int]] = []  # (block index, pool slot)
        for i, digest in enumerate(digests):
            if digest in self._blocks:
                continue
            slot = self._take_slot(chain)
            if slot is None:  # every block held is this chain's: it is as long as it can be
                break
            self._blocks[digest] = slot
            new.append((i, slot))
        self._touch(digests[: len(held) + len(new)])
        if new:
            self._copy_in(new, keys, values)
        return len(new)

    def _take_slot(self, chain: set[bytes]) -> int | None:
        """A free pool slot, evicting the least recently used block if none is free (but
        not one of ``chain``)."""
        if self._free:
            return self._free.pop()
        digest = next(iter(self._blocks))
        if digest in chain:
            return None
        self._evictions += 1
        return self._blocks.pop(digest)

    def _copy_in(
        self, new: list[tuple[int, int]], keys: Sequence[Tensor], values: Sequence[Tensor]
    ) -> None:
        if not self._keys:  # the pool is made when first needed
            self._keys = [self._empty() for _ in range(self._layers)]
            self._values = [self._empty() for _ in range(self._layers)]
        b = self.block_size
        blocks = torch.tensor([i for i, _ in new], device=self._device)
        slots = torch.tensor([s for _, s in new], device=self._device)
        for pool, rows in ((self._keys, keys), (self._values, values)):
            for layer, row in zip(pool, rows, strict=True):
                whole = _blocks(row, b, row.shape[1] // b)
                layer.index_copy_(0, slots, whole.index_select(0, blocks))

    def _empty(self) -> Tensor:
        return torch.empty(self._shape, dtype=self._dtype, device=self._device)

    def clear(self) -> None:
        """Drop every block (the counts stay)."""
        self._blocks.clear()
        self._free = list(range(self.capacity - 1, -1, -1))


def _salt_bytes(salt: Salt) -> bytes:
    """``salt`` as the bytes the first block's digest starts from: an integer as 8 bytes, bytes
    as they are, after a tag byte so that no bytes salt equals an integer's."""
    if isinstance(salt, bytes):
        return b"b" + salt
    if isinstance(salt, int) and not isinstance(salt, bool):
        return b"i" + salt.to_bytes(8, "little", signed=True)
    raise TypeError(f"a prefix cache salt is an int or bytes, got {type(salt).__name__}")


def _blocks(row: Tensor, block_size: int, n: int) -> Tensor:
    """The first ``n`` blocks of one row's cache ``(H, L, hd)`` as a view ``(n, H, B, hd)``."""
    h, _, hd = row.shape
    return row[:, : n * block_size].view(h, n, block_size, hd).permute(1, 0, 2, 3)
