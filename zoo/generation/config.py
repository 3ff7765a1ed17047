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
    #: the beams of a beam search (:mod:`zoo.generation.beam`: transformers' beam search, to
    #: the token); 1 (default) picks each token greedily or by sampling. A beam search is
    #: deterministic: it takes no ``top_k``, ``top_p``, ``seed`` or ``stop``, and its
    #: ``temperature`` must be left at 1 (or 0).
    num_beams: int = 1
    #: the best hypotheses a beam search returns per prompt, best first (1 to ``num_beams``).
    num_return_sequences: int = 1
    #: a finished hypothesis ranks by its summed log-probabilities divided by its number of
    #: new tokens to this power: above 0 favours longer ones, below 0 shorter ones.
    length_penalty: float = 1.0
    #: when a beam search ends: ``True`` once ``num_beams`` hypotheses have finished;
    #: ``False`` (default) also once no running beam can beat the worst finished one at its
    #: present length; ``"never"`` only once none could at any length (transformers' three).
    early_stopping: bool | Literal["never"] = False
    #: no n-gram of this many tokens occurs twice in a row's ids (a decoder's prompt counts);
    #: 0: no check.
    no_repeat_ngram_size: int = 0
    #: the end ids are not picked before this many new tokens.
    min_new_tokens: int = 0
    #: the end ids are not picked while the sequence, prefix included, is shorter than this.
    min_length: int = 0
    #: sequences of ids never generated (a list of lists is taken as tuples): the last id of
    #: each is not picked where the ids before it end the row; a one-id sequence that is an
    #: end id is ignored (transformers' ``bad_words_ids``: Marian's pad id).
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    #: the first new token when the prefix is one token (an encoder-decoder's target).
    forced_bos_id: int | None = None
    #: the token (or tokens, each given the same score) forced as the last new token.
    forced_eos_id: int | tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        stop: object = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        elif isinstance(stop, list):
            stop = tuple(stop)
        object.__setattr__(self, "stop", stop)
        if isinstance(self.stop_ids, list):
            object.__setattr__(self, "stop_ids", tuple(self.stop_ids))
        if isinstance(self.bad_words_ids, (list, tuple)):
            words = [tuple(w) if isinstance(w, list) else w for w in self.bad_words_ids]
            object.__setattr__(self, "bad_words_ids", tuple(words))
        if isinstance(self.forced_eos_id, list):
            object.__setattr__(self, "forced_eos_id", tuple(self.forced_eos_id))
        check_fields(self)
        self._check_ranges()
        self._check_constraints()
        self._check_beams()
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

    def _check_constraints(self) -> None:
        for name in ("no_repeat_ngram_size", "min_new_tokens", "min_length"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {getattr(self, name)}")
        for words in self.bad_words_ids:
            if not words or min(words) < 0:
                raise ConfigError(
                    "bad_words_ids must be a list of non-empty lists of token ids (integers "
                    f">= 0), e.g. [[pad_id]]; got {list(map(list, self.bad_words_ids))}"
                )
        forced = self.forced_eos_id
        eos = (forced,) if isinstance(forced, int) else forced or ()
        bos = () if self.forced_bos_id is None else (self.forced_bos_id,)
        if (isinstance(forced, tuple) and not forced) or min((*eos, *bos), default=0) < 0:
            raise ConfigError(
                "forced_bos_id and forced_eos_id must be token ids (integers >= 0), got "
                f"{self.forced_bos_id!r} and {forced!r}"
            )

    def _check_beams(self) -> None:
        if self.num_beams < 1:
            raise ConfigError(f"num_beams must be a positive integer, got {self.num_beams}")
        if not 1 <= self.num_return_sequences <= self.num_beams:
            raise ConfigError(
                f"num_return_sequences must be from 1 to num_beams ({self.num_beams}), got "
                f"{self.num_return_sequences}; a beam search returns at most its beams"
            )
        if self.num_beams == 1:
            return
        sampling = {
            "temperature": self.temperature if self.temperature not in (0, 1) else None,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": self.stop or None,
        }
        given = [f"{name}={value!r}" for name, value in sampling.items() if value is not None]
        if given:
            raise ConfigError(
                f"beam search (num_beams={self.num_beams}) is deterministic and picks whole "
                f"hypotheses, so it takes no {', '.join(given)}: leave them out (temperature "
                "at 1 or 0), or sample with num_beams=1; end rows with end ids, not stop "
                "strings"
            )

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Every id that ends a row: ``eos_id`` first, then ``stop_ids`` (no repeats). A row
        that has ended repeats the first."""
        ids = [] if self.eos_id is None else [self.eos_id]
        return tuple(dict.fromkeys([*ids, *(self.stop_ids or ())]))
