"""Upper bounds on the counts a user types on the command line, each derived from what it
controls and checked before torch is imported (``zoo train --eval-batches
4611686018427387904`` was once taken, and the run never ended). ``zoo train``'s
:class:`~zoo.train.TrainConfig` fields bound themselves (:data:`zoo.train.config.MAX_STEPS`
...); these are the other commands' flags and ``zoo train``'s own:

- positions (``--max-new-tokens``, ``--max-model-len``, ``--prefill-chunk``): at most the
  longest context a model config takes, :data:`zoo.config.MAX_TOKENS` (2**24); ids
  (``--top-k``, ``--train-tokenizer``): at most the largest vocabulary, the same 2**24;
- ``--lora`` RANK: at most :data:`MAX_LORA_RANK` (2**16): an update ``B @ A`` has rank at
  most the width of the layer it adapts (thousands), and the memory check bounds it further;
- ``--tokenizer-max-distinct`` BYTES: the trainer holds up to ~120 bytes per byte, so at
  most this machine's memory / 120; ``--prefix-cache-mb``: at most this machine's memory;
- ``zoo serve``'s ``--max-batch`` (slots decoding together, each with its own cache): at
  most :data:`MAX_SLOTS` (2**16); ``--max-queue`` (requests held waiting): at most
  :data:`MAX_QUEUE` (2**20); ``--max-body-bytes``: at most 1 GiB, what a request body may
  hold in memory; ``--seed``: a ``torch.Generator``'s range;
- ``zoo tour --max-mib``: a finite number, 0 or more (NaN compared false with every size).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable

from ..config import MAX_TOKENS
from ..fields import check_seed, short_int

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_LORA_RANK",
    "MAX_QUEUE",
    "MAX_SLOTS",
    "check_counts",
    "check_finite",
    "check_seed_flag",
    "generation_bounds",
    "machine_memory",
    "serve_bounds",
    "train_bounds",
]

MAX_LORA_RANK = 1 << 16
MAX_SLOTS = 1 << 16
MAX_QUEUE = 1 << 20
MAX_BODY_BYTES = 1 << 30
#: Bytes the BPE trainer holds per byte of distinct words (``zoo train --help``).
_TRAINER_BYTES_PER_BYTE = 120

#: ``(argument's dest, its flag, the bound, why)``; a bound of ``None`` is unknown here.
Bound = tuple[str, str, "int | None", str]


def machine_memory() -> int | None:
    """This machine's physical memory in bytes (``None`` where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_counts(args: argparse.Namespace, bounds: Iterable[Bound]) -> None:
    """Refuse the first value of ``args`` above its bound, naming the flag, the bound and
    why (a ``ValueError``: one line, exit 2)."""
    for dest, flag, high, why in bounds:
        value = getattr(args, dest, None)
        if isinstance(value, int) and high is not None and value > high:
            raise ValueError(f"{flag} must be at most {high:,} ({why}), got {short_int(value)}")


def generation_bounds() -> list[Bound]:
    """``zoo generate``'s and ``zoo chat``'s counts."""
    return [
        ("max_new_tokens", "--max-new-tokens", MAX_TOKENS, "the longest context a model has"),
        ("top_k", "--top-k", MAX_TOKENS, "the largest vocabulary a model has"),
    ]


def train_bounds() -> list[Bound]:
    """``zoo train``'s own counts (its TrainConfig fields bound themselves)."""
    memory = machine_memory()
    return [
        ("lora", "--lora", MAX_LORA_RANK, "a LoRA's update has at most the rank of the layer"),
        ("train_tokenizer", "--train-tokenizer", MAX_TOKENS, "the largest vocabulary"),
        (
            "tokenizer_max_distinct",
            "--tokenizer-max-distinct",
            None if memory is None else memory // _TRAINER_BYTES_PER_BYTE,
            f"the trainer holds ~{_TRAINER_BYTES_PER_BYTE} bytes per byte, and this machine "
            "has that much memory",
        ),
    ]


def serve_bounds() -> list[Bound]:
    """``zoo serve``'s counts (``--max-connections`` is bounded by ``ulimit -n`` where the
    server starts; ``--max-model-len`` again by the model's context once it is loaded)."""
    memory = machine_memory()
    return [
        ("max_batch", "--max-batch", MAX_SLOTS, "slots decoding together, each with a cache"),
        ("max_queue", "--max-queue", MAX_QUEUE, "requests held waiting for a slot"),
        ("max_model_len", "--max-model-len", MAX_TOKENS, "the longest context a model has"),
        ("prefill_chunk", "--prefill-chunk", MAX_TOKENS, "the longest context a model has"),
        (
            "prefix_cache_mb",
            "--prefix-cache-mb",
            None if memory is None else memory // 2**20,
            "this machine's memory, in MiB",
        ),
        ("max_body_bytes", "--max-body-bytes", MAX_BODY_BYTES, "a body is held in memory"),
    ]


def check_seed_flag(seed: int | None, flag: str = "--seed") -> None:
    """``seed`` in a ``torch.Generator``'s range, said with its flag."""
    try:
        check_seed(seed)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def check_finite(value: float, flag: str) -> None:
    """A float flag that must be a finite number, 0 or more."""
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{flag} must be a finite number, 0 or more, got {value}")
