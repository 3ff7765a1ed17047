"""Decoding state above the model code: key/value caches (:mod:`~zoo.runtime.cache`), the
decoding sessions every generation path runs (:mod:`~zoo.runtime.session`,
:mod:`~zoo.runtime.decoding`: :func:`start_decoding` opens one for any model), the one-call
batch-1 CPU step (:mod:`~zoo.runtime.native_block` with :mod:`~zoo.runtime.native_plan`), the
slot batch of continuous batching (:mod:`~zoo.runtime.slots`), its step in a few fixed shapes
(:mod:`~zoo.runtime.slot_step`), the cache of prompt prefixes kept between requests
(:mod:`~zoo.runtime.prefix_cache`) and beam search's reordering of a session's rows
(:mod:`~zoo.runtime.reorder`)."""

from .cache import KVCache, LayerCache, StaticKVCache, StaticLayerCache
from .decoding import DecoderSession, StaticDecoderSession, start_decoding, start_session
from .reorder import check_reorderable, reorder_rows
from .session import DecodingSession, RecomputeSession, context_overflow

__all__ = [
    "DecoderSession",
    "DecodingSession",
    "KVCache",
    "LayerCache",
    "RecomputeSession",
    "StaticDecoderSession",
    "StaticKVCache",
    "StaticLayerCache",
    "check_reorderable",
    "context_overflow",
    "reorder_rows",
    "start_decoding",
    "start_session",
]
