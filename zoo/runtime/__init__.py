"""Serving state above the model code: the slot batch of continuous batching
(:mod:`~zoo.runtime.slots`), its step in a few fixed shapes (:mod:`~zoo.runtime.slot_step`)
and the cache of prompt prefixes kept between requests (:mod:`~zoo.runtime.prefix_cache`)."""
