"""Choices and defaults that the Python API and the ``zoo`` command line share, in one place
(torch-free, so the command line's parser imports no torch).

- :data:`GENERATION_DEFAULTS`: the defaults of :func:`zoo.generate` and ``zoo generate``;
- :data:`SEED_RANGE`: the seeds a ``torch.Generator`` takes;
- :data:`QUANTIZE_MODES`: what ``zoo.load(..., quantize=...)`` and ``--quantize`` accept,
  with a line on each;
- :data:`GGUF_TYPES`: the tensor types ``zoo.export(..., layout="gguf", type=...)`` and
  ``zoo convert --to gguf --type`` write;
- :data:`MAX_DISTINCT_BYTES`: how much distinct text a tokenizer is trained on by default
  (``SubwordBPE.train``, ``zoo train --tokenizer-max-distinct``).
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

__all__ = [
    "GENERATION_DEFAULTS",
    "GGUF_TYPES",
    "MAX_DISTINCT_BYTES",
    "QUANTIZE_MODES",
    "QUANTIZE_MODE_HELP",
    "SEED_RANGE",
    "GenerationDefaults",
]


#: The tensor types a GGUF file is written in (llama.cpp's converter's, and its q4_0).
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")

#: Default of ``SubwordBPE.train``'s ``max_distinct_bytes``: what the trainer holds grows
#: with the distinct words it has seen, up to ~120 bytes per byte of them on text made of
#: distinct words (random words, random Unicode), however often each word comes back.
MAX_DISTINCT_BYTES = 2_000_000


@dataclasses.dataclass(frozen=True)
class GenerationDefaults:
    """The defaults of :func:`zoo.generate` and of ``zoo generate`` (one set, read by both:
    the same prompt and seed give the same text from Python and from the command line)."""

    #: tokens to generate at most.
    max_new_tokens: int = 50
    #: logits are divided by it before sampling; 0 is greedy, 1 samples the model's own
    #: distribution.
    temperature: float = 1.0
    #: sample only from the ``top_k`` most likely tokens (``None``: all of them).
    top_k: int | None = None
    #: sample only from the nucleus of this probability (``None``: all of it).
    top_p: float | None = None


#: The defaults :func:`zoo.generate` and ``zoo generate`` use.
GENERATION_DEFAULTS = GenerationDefaults()

#: The seeds a ``torch.Generator`` takes, inclusive: 0 to 2**64 - 1; negative ones down to
#: -2**63 wrap around modulo 2**64, as torch does.
SEED_RANGE = (-(2**63), 2**64 - 1)

#: Each quantization mode of ``zoo.load(..., quantize=MODE)``, with what it does.
QUANTIZE_MODE_HELP = MappingProxyType(
    {
        "int8": "int8 weights, and on the CPU int8 activations quantized per call (dynamic "
        "int8, fastest on CPU; elsewhere as int8-weight)",
        "int8-weight": "weight-only int8, activations in float (most accurate)",
        "int4": "weight-only int4, groups of 32 with a scale and zero point (least memory)",
    }
)

#: The quantization modes, in the order documented.
QUANTIZE_MODES: tuple[str, ...] = tuple(QUANTIZE_MODE_HELP)
