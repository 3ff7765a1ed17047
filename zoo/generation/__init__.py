"""Text generation for every zoo model, through its decoding session.

One core, ids in and ids out as tensors (:mod:`zoo.generation.core`):
:func:`generate_ids` ``(B, T) -> (B, T + N)`` and :func:`stream_ids` (the new tokens step by
step), driven by one frozen, validated :class:`GenerationConfig`. Thin wrappers with exact
return types stand on it (:mod:`zoo.generation.text`): :func:`generate_text` (``str`` ->
``str``), :func:`generate_texts` (``list[str]`` -> ``list[str]``), :func:`stream_text`
(``str`` -> ``Iterator[str]``) and :func:`stream_continuation` (prompt ids ->
``Iterator[str]``, for chat prompts). :func:`zoo.generate` takes every form in one call and
routes it (:mod:`zoo.generation.dispatch`).

What ``zoo chat`` and ``zoo serve`` share with them lives here once: the token picker
(:mod:`zoo.generation.sampling`: :func:`~zoo.generation.sampling.pick` for a batch with one
setting, :func:`~zoo.generation.sampling.pick_each` for rows with their own), the end-id,
stop-string and length check of a reply (:mod:`zoo.generation.reply`) and the incremental
detokeniser with stop-string hold-back (:mod:`zoo.generation.detokenize`).

Importing the package imports no torch: :class:`GenerationConfig` and its checks are plain
Python (``zoo generate`` checks its flags with them before torch loads); the rest is
imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from ..options import GenerationDefaults
from .config import DEFAULTS, SEED_RANGE, GenerationConfig, check_seed, check_text

if TYPE_CHECKING:  # type checkers see the real names (and generate's overloads)
    from .core import _session_options as _session_options  # what ZOO_CUDA_GRAPHS reaches
    from .core import generate_ids, left_pad, stream_ids
    from .dispatch import generate
    from .sampling import filter_logits, next_tokens
    from .text import generate_text, generate_texts, stream_continuation, stream_text

#: Imported on first use: they import torch.
_LAZY = {
    "_session_options": "zoo.generation.core:_session_options",
    "generate_ids": "zoo.generation.core:generate_ids",
    "left_pad": "zoo.generation.core:left_pad",
    "stream_ids": "zoo.generation.core:stream_ids",
    "generate": "zoo.generation.dispatch:generate",
    "filter_logits": "zoo.generation.sampling:filter_logits",
    "next_tokens": "zoo.generation.sampling:next_tokens",
    "generate_text": "zoo.generation.text:generate_text",
    "generate_texts": "zoo.generation.text:generate_texts",
    "stream_continuation": "zoo.generation.text:stream_continuation",
    "stream_text": "zoo.generation.text:stream_text",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "DEFAULTS",
    "SEED_RANGE",
    "GenerationConfig",
    "GenerationDefaults",
    "check_seed",
    "check_text",
    "filter_logits",
    "generate",
    "generate_ids",
    "generate_text",
    "generate_texts",
    "left_pad",
    "next_tokens",
    "stream_continuation",
    "stream_ids",
    "stream_text",
]
