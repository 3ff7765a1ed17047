"""The settings of one generation: a frozen, validated :class:`GenerationConfig`, and the
checks of the two values that are not plain fields (a seed a ``torch.Generator`` takes, text
that is Unicode). Torch-free, so the command line can check its arguments before loading."""

from __future__ import annotations

import dataclasses
from typing import Literal

from ..errors import ConfigError
from ..fields import check_fields, check_seed
from ..options import GENERATION_DEFAULTS, SEED_RANGE

__all__ = ["DEFAULTS", "SEED_RANGE", "GenerationConfig", "check_seed", "check_text"]

#: The defaults :func:`zoo.generate` and ``zoo generate`` use (:mod:`zoo.options`).
DEFAULTS = GENERATION_DEFAULTS


def check_text(text: str, what: str = "the prompt") -> None:
    """Raise ``ValueError`` when ``text`` is not Unicode: it holds a lone surrogate, which is
    how Python keeps bytes it could not decode (``errors="surrogateescape"``: a command-line
    argument or file name that is not UTF-8). Checked here, before any tokenizer sees it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} holds a lone surrogate {text[exc.start]!r} at index {exc.start}, which is "
            "not a Unicode character (undecodable bytes kept by errors='surrogateescape'); "
            "decode the source bytes as UTF-8, or with errors='replace'"
        ) from None


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How to generate: every decoding option, checked when the config is made (types by
    :func:`zoo.fields.check_fields`, ranges here). The defaults are
    :data:`zoo.options.GENERATION_DEFAULTS`, shared with ``zoo generate``.

    Example::

        config = GenerationConfig(max_new_tokens=20, temperature=0.8, top_p=0.9, seed=0)
        out = zoo.generation.generate_ids(model, ids, None, config)  # (B, T) -> (B, T + N)
    """

    #: tokens to generate at most; prompt + new tokens must fit the model's context.
    max_new_tokens: int = DEFAULTS.max_new_tokens
    #: 0 is greedy; otherwise logits are divided by it before sampling (a tiny one approaches
    #: greedy).
    temperature: float = DEFAULTS.temperature
    #: sample only from the ``top_k`` most likely tokens (``None``: all).
    top_k: int | None = DEFAULTS.top_k
    #: sample only from the nucleus of probability ``top_p`` (``None``: all).
    top_p: float | None = DEFAULTS.top_p
    #: makes sampling reproducible: an integer from 0 to 2**64 - 1 (negative ones wrap).
    seed: int | None = None
    #: stop strings: generated text ends before the first one (text and streaming only; a
    #: string or a list is taken as a tuple).
    stop: tuple[str, ...] = ()
    #: end-of-text id: a row that picks it ends, and repeats it while the others go on
    #: (the text wrappers take the tokenizer's when ``None``).
    eos_id: int | None = None
    #: more ids that end a row, as ``eos_id`` does (an instruct model's end-of-turn: Qwen's
    #: ``<|im_end|>`` and ``<|endoftext|>``); a row that picks one repeats ``eos_id`` (or the
    #: first of these) after it. ``None``: the tokenizer's end ids
    #: (:attr:`zoo.tokenizers.Tokenizer.end_ids`) when ``eos_id`` is ``None`` too, else none.
    stop_ids: tuple[int, ...] | None = None
    #: the first target token of an encoder-decoder (the text wrappers take the tokenizer's
    #: bos when ``None``).
    start_id: int | None = None
    #: ids at or above it are never picked: a model vocabulary padded beyond its tokenizer's
    #: (the text wrappers take the tokenizer's size when ``None``).
    vocab_limit: int | None = None
    #: run each decoding step through ``torch.compile`` (CPU, the built-in decoders).
    compile: bool = False
    #: the CPU threads of each decoding step: ``None`` (default) leaves torch's count as the
    #: caller set it; ``"auto"`` runs each step with the cores other processes leave free (at
    #: most torch's count, put back after each step: :class:`zoo.kernels.threads.DecodeThreads`,
    #: what ``zoo generate``, ``zoo chat`` and ``zoo serve`` use); ``N`` runs steps with
    #: ``N`` threads. Ignored on other devices.
    threads: int | Literal["auto"] | None = None

    def __post_init__(self) -> None:
        stop: object = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        elif isinstance(stop, list):
            stop = tuple(stop)
        object.__setattr__(self, "stop", stop)
        if isinstance(self.stop_ids, list):
            object.__setattr__(self, "stop_ids", tuple(self.stop_ids))
        check_fields(self)
        self._check_ranges()
        for i, text in enumerate(self.stop):
            if not isinstance(text, str) or not text:
                raise ConfigError(
                    f"stop must be a non-empty string or a list of them, got {self.stop!r}"
                )
            check_text(text, f"stop string {i}")

    def _check_ranges(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(
                f"max_new_tokens must be a positive integer, got {self.max_new_tokens}"
            )
        if self.temperature < 0:
            raise ConfigError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}"
            )
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be a positive integer or None, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1] or None, got {self.top_p}")
        for token_id in self.stop_ids or ():
            if type(token_id) is not int or token_id < 0:
                raise ConfigError(
                    f"stop_ids must be token ids (integers >= 0), got {self.stop_ids!r}"
                )
        if self.vocab_limit is not None and self.vocab_limit < 1:
            raise ConfigError(
                f"vocab_limit must be a positive integer or None, got {self.vocab_limit}"
            )
        check_seed(self.seed)
        if isinstance(self.threads, int) and self.threads < 1:
            raise ConfigError(
                f"threads must be None (torch's count, untouched), 'auto' (the cores other "
                f"processes leave free) or a count >= 1, got {self.threads}"
            )

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Every id that ends a row: ``eos_id`` first, then ``stop_ids`` (no repeats). A row
        that has ended repeats the first."""
        ids = [] if self.eos_id is None else [self.eos_id]
        return tuple(dict.fromkeys([*ids, *(self.stop_ids or ())]))
