"""The kit's ``reference`` check on an encoder-decoder: the small random model against the
``transformers`` class its Hugging Face layout names (Marian's ``MarianMTModel``, BART's
``BartForConditionalGeneration``, mBART's, T5's ``T5ForConditionalGeneration``).

The model is written with :func:`zoo.export` and read back by that class (float32, eager
attention), so what is compared is the loaded model, as a user would run it. On the same
weights, with the same settings on both sides (no forced, banned or blocked tokens, whatever
the exported ``config.json`` or a ``generation_config.json`` would add):

1. logits (max absolute difference <= :data:`~zoo.testing.reference.REFERENCE_ATOL`) of a
   batch of sources of :data:`SOURCE_LENGTHS` tokens, right-padded with a source mask, and
   targets right-padded with a target mask, over the real target positions. The padding goes
   on the right: zoo counts a row's positions from its first real token, transformers from
   column 0, and the two agree where every row starts at column 0;
2. greedy decoding of that source batch (:data:`GREEDY_TOKENS` new tokens, no end id): the
   logits of every step of zoo's decoding session, fed the reference's tokens, against the
   raw logits of transformers' ``generate``, and the tokens of :func:`zoo.generate` against
   ``generate``'s, token for token (a near tie of the reference's logits may go either way);
3. a beam search (``num_beams`` :data:`NUM_BEAMS`) of the same batch, with an end id that
   the greedy tokens pick (so that hypotheses finish before the last step), token for token.

A random post-LN model with a tied head (Marian, BART) tends to repeat one token: the token
it reads is also the one its head favours most. Each source is therefore the one of
:data:`CANDIDATES` seeded draws of its length whose greedy decoding (by the reference) picks
the most different tokens, and the step logits of (2) are compared whatever the tokens are,
so that a decoding bug that leaves the argmax alone still shows.
"""

from __future__ import annotations

import contextlib
import importlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .hf_reference import REFERENCE_ATOL, IdsTokenizer, transformers_reference

if TYPE_CHECKING:
    from ..nn.base import ZooModel

__all__ = [
    "BUFFER_STD",
    "CANDIDATES",
    "GREEDY_TOKENS",
    "NUM_BEAMS",
    "SOURCE_LENGTHS",
    "EncoderDecoderReference",
    "compare_encdec_with_reference",
    "load_encdec_reference",
    "randomize_buffers",
]

#: The source lengths of the compared batch (right-padded to the first).
SOURCE_LENGTHS = (11, 7, 3)

#: Target tokens of the logits comparison (the start token, then random ids), and how many
#: of them each row pads on the right.
TARGET_LENGTH = 8
TARGET_PADDING = (0, 3, 5)

#: Seeded source draws per length, the liveliest decoded.
CANDIDATES = 8

#: New tokens of the greedy and beam comparisons.
GREEDY_TOKENS = 16

#: The beams of the beam-search comparison.
NUM_BEAMS = 3

#: Standard deviation of the random values of the buffers saved with the weights (Marian's
#: and BART's ``final_logits_bias``, zero in a fresh model: a missing bias would not show).
BUFFER_STD = 0.1

#: transformers' generation settings the exported files could set, held neutral on both sides.
_NEUTRAL: dict[str, Any] = {
    "do_sample": False,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "bad_words_ids": None,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "min_length": 0,
    "length_penalty": 1.0,
    "early_stopping": False,
    "num_return_sequences": 1,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
}


def randomize_buffers(model: nn.Module, seed: int = 0) -> None:
    """Give every floating buffer that ``model`` saves with its weights (its ``state_dict``)
    seeded normal values of std :data:`BUFFER_STD`, in place."""
    saved = set(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in saved and buffer.is_floating_point():
                buffer.copy_((torch.randn(buffer.shape, generator=g) * BUFFER_STD).to(buffer))


class _EndTokenizer(IdsTokenizer):
    """:class:`IdsTokenizer` with an end id: a row that picks ``eos_id`` ends."""

    def __init__(self, vocab_size: int, eos_id: int) -> None:
        super().__init__(vocab_size)
        self.eos_id = eos_id  # type: ignore[assignment]
        self.end_ids = (eos_id,)


class EncoderDecoderReference:
    """A ``transformers`` encoder-decoder loaded from a folder: logits and ``generate`` with
    the settings given and every other generation setting neutral (:data:`_NEUTRAL`).

    Shape:
        ``src``, ``src_mask``: ``(B, S)`` int64, right-padded; ``tgt``, ``tgt_mask``:
        ``(B, T)`` int64, right-padded. Logits are ``(B, T, vocab)``.
    """

    def __init__(self, model: Any, loading_info: dict[str, Any] | None = None) -> None:
        self.model = model
        #: what ``from_pretrained`` reported (missing or unexpected keys), named on a failure.
        self.loading_info = loading_info or {}

    def logits(self, src: Tensor, src_mask: Tensor, tgt: Tensor, tgt_mask: Tensor) -> Tensor:
        """The logits of every target position."""
        with torch.no_grad():
            out = self.model(
                input_ids=src,
                attention_mask=src_mask,
                decoder_input_ids=tgt,
                decoder_attention_mask=tgt_mask,
            )
        return out.logits

    def generate(
        self,
        src: Tensor,
        src_mask: Tensor,
        *,
        start: int,
        new: int,
        num_beams: int = 1,
        eos: int | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``(sequences, logits)``: the targets ``(B, 1 + N)`` (start token first, rows that
        ended padded with ``eos``) and, for greedy decoding, the raw logits of each step
        ``(B, N, vocab)`` (``None`` for a beam search)."""
        greedy = num_beams == 1
        with torch.no_grad():
            out = self.model.generate(
                input_ids=src,
                attention_mask=src_mask,
                max_new_tokens=new,
                num_beams=num_beams,
                decoder_start_token_id=start,
                eos_token_id=eos,
                pad_token_id=eos if eos is not None else 0,
                output_logits=greedy,
                return_dict_in_generate=True,
                **_NEUTRAL,
            )
        logits = torch.stack(out.logits, dim=1) if greedy else None
        return out.sequences, logits


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings off while a folder loads (its notes on the weights' ties)."""
    try:
        logging = importlib.import_module("transformers").utils.logging
    except ImportError:  # transformers_reference says so, with the command that installs it
        yield
        return
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def load_encdec_reference(folder: Path) -> EncoderDecoderReference:
    """The :class:`EncoderDecoderReference` of a Hugging Face folder: the ``transformers``
    class its ``config.json`` names (:func:`~zoo.testing.reference.transformers_reference`).

    Raises:
        CheckSkipped: transformers is not installed, or has no class of that name.
    """
    with _quiet_transformers():
        loaded = transformers_reference(folder)
    return EncoderDecoderReference(loaded.model, loaded.loading_info)


# -- the inputs -----------------------------------------------------------------------------
def _right_padded(rows: list[list[int]]) -> tuple[Tensor, Tensor]:
    """``(ids, mask)``, both ``(B, T)`` int64, each row from column 0 (padding id 0)."""
    length = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def _distinct(sequences: Tensor) -> list[int]:
    """How many different new tokens each row of ``(B, 1 + N)`` targets has."""
    return [len(set(row[1:])) for row in sequences.tolist()]


def _draw(vocab: int, length: int, g: torch.Generator) -> list[int]:
    """``length`` random source ids from 3 up (no special id where the vocabulary allows)."""
    return torch.randint(min(3, vocab - 1), vocab, (length,), generator=g).tolist()


def _lively_sources(
    reference: EncoderDecoderReference, vocab: int, start: int, g: torch.Generator
) -> list[list[int]]:
    """One source per length of :data:`SOURCE_LENGTHS`: of :data:`CANDIDATES` draws each
    (:func:`_draw`), the one whose greedy decoding by the reference picks the
    most different tokens (the first such draw)."""
    draws = [_draw(vocab, length, g) for length in SOURCE_LENGTHS for _ in range(CANDIDATES)]
    sequences, _ = reference.generate(*_right_padded(draws), start=start, new=GREEDY_TOKENS)
    lively = _distinct(sequences)
    chosen = []
    for k in range(len(SOURCE_LENGTHS)):
        group = range(k * CANDIDATES, (k + 1) * CANDIDATES)
        chosen.append(draws[max(group, key=lambda i: (lively[i], -i))])
    return chosen


def _targets(vocab: int, start: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Targets of :data:`TARGET_LENGTH` (the start token, then random ids), right-padded
    by :data:`TARGET_PADDING`."""
    rows = [
        [start, *torch.randint(0, vocab, (TARGET_LENGTH - 1 - pad,), generator=g).tolist()]
        for pad in TARGET_PADDING
    ]
    return _right_padded(rows)


# -- the comparisons ------------------------------------------------------------------------
def _check_logits(
    model: ZooModel, reference: EncoderDecoderReference, batch: tuple[Tensor, ...]
) -> float:
    src, src_mask, tgt, tgt_mask = batch
    with torch.no_grad():
        ours = model(src, tgt, src_mask.bool(), tgt_mask.bool())
    theirs = reference.logits(src, src_mask, tgt, tgt_mask)
    if ours.shape != theirs.shape:
        raise AssertionError(
            f"logits of shape {tuple(ours.shape)}, the reference's {tuple(theirs.shape)}"
        )
    real = tgt_mask.bool()
    diff = float((ours[real] - theirs[real]).abs().max())
    if not diff <= REFERENCE_ATOL:
        raise AssertionError(
            f"logits differ from the reference's by {diff:.3g} on a batch of sources of "
            f"{', '.join(map(str, SOURCE_LENGTHS))} tokens and targets of {TARGET_LENGTH}, "
            f"right-padded, real target positions (tolerance {REFERENCE_ATOL:g})"
        )
    return diff


def _session_logits(
    model: ZooModel, src: Tensor, src_mask: Tensor, tokens: Tensor, start: int
) -> Tensor:
    """zoo's decoding session over the source batch, fed ``tokens`` ``(B, N)``: the logits
    before each of them, ``(B, N, vocab)``."""
    from ..runtime.decoding import start_decoding

    with torch.no_grad():
        session = start_decoding(model, src, src_mask.bool(), tokens.shape[1], start_id=start)
        steps = [session.prefill()]
        steps += [session.step(tokens[:, i]) for i in range(tokens.shape[1] - 1)]
    return torch.stack(steps, dim=1)


def _tied(logits: Tensor, row: int, step: int, a: int, b: int) -> bool:
    return abs(float(logits[row, step, a] - logits[row, step, b])) <= REFERENCE_ATOL


def _check_greedy(
    model: ZooModel, reference: EncoderDecoderReference, src: Tensor, src_mask: Tensor, start: int
) -> tuple[Tensor, float]:
    """Greedy decoding compared (step logits, then tokens); returns the reference's targets
    and the largest step-logit difference."""
    from ..generation import generate

    want, step_logits = reference.generate(src, src_mask, start=start, new=GREEDY_TOKENS)
    assert step_logits is not None
    ours = _session_logits(model, src, src_mask, want[:, 1:], start)
    diff = float((ours - step_logits).abs().max())
    if not diff <= REFERENCE_ATOL:
        raise AssertionError(
            f"greedy decoding: the decoding session's logits differ from those of the "
            f"reference's generate by {diff:.3g} over {GREEDY_TOKENS} steps of a right-padded "
            f"source batch (tolerance {REFERENCE_ATOL:g})"
        )
    vocab: int = model.config.vocab_size  # type: ignore[attr-defined]
    ids: Any = IdsTokenizer(vocab)  # no end id: every token is generated
    got = generate(
        model, src, attention_mask=src_mask, tokenizer=ids, max_new_tokens=GREEDY_TOKENS,
        temperature=0.0, start_id=start,
    )  # fmt: skip
    for row, (mine, theirs) in enumerate(zip(got.tolist(), want.tolist(), strict=True)):
        k = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
        if k is None and len(mine) == len(theirs):
            continue
        if k is not None and k > 0 and _tied(step_logits, row, k - 1, mine[k], theirs[k]):
            continue  # the reference's own logits tie there: either pick is right
        raise AssertionError(
            f"greedy tokens differ: zoo.generate gives {got.tolist()}, the reference's "
            f"generate {want.tolist()} (step logits within {diff:.3g})"
        )
    return want, diff


def _until_end(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos, 1) + 1] if eos in row[1:] else row


def _check_beams(
    model: ZooModel, reference: EncoderDecoderReference, src: Tensor, src_mask: Tensor,
    start: int, eos: int,
) -> None:  # fmt: skip
    from ..generation import generate

    want, _ = reference.generate(
        src, src_mask, start=start, new=GREEDY_TOKENS, num_beams=NUM_BEAMS, eos=eos
    )
    vocab: int = model.config.vocab_size  # type: ignore[attr-defined]
    ends: Any = _EndTokenizer(vocab, eos)
    got = generate(
        model, src, attention_mask=src_mask, tokenizer=ends, max_new_tokens=GREEDY_TOKENS,
        temperature=0.0, start_id=start, num_beams=NUM_BEAMS, length_penalty=1.0,
        early_stopping=False, no_repeat_ngram_size=0, min_new_tokens=0, bad_words_ids=(),
    )  # fmt: skip
    mine = [_until_end(row, eos) for row in got.tolist()]
    theirs = [_until_end(row, eos) for row in want.tolist()]
    if mine != theirs:
        raise AssertionError(
            f"beam search ({NUM_BEAMS} beams, end id {eos}) differs: zoo.generate gives "
            f"{mine}, the reference's generate {theirs}"
        )


def _end_id(greedy: Tensor) -> int:
    """The token the greedy targets pick most often from their middle on: as an end id, some
    beam hypotheses finish before the last step."""
    later = greedy[:, 1 + GREEDY_TOKENS // 2 :].flatten().tolist()
    return Counter(later).most_common(1)[0][0]


def compare_encdec_with_reference(
    model: ZooModel,
    reference: EncoderDecoderReference,
    *,
    start: int,
    generation: bool = True,
    seed: int = 0,
) -> str:
    """Compare the encoder-decoder ``model`` (CPU, float32, eval) with ``reference`` on the
    same weights: logits of a right-padded source and target batch and, with
    ``generation``, greedy decoding and a beam search from ``start`` (the module's
    docstring). Returns what was compared.

    Raises:
        AssertionError: a difference, saying where and how much.
    """
    config: Any = model.config
    g = torch.Generator().manual_seed(seed)
    if generation:
        sources = _lively_sources(reference, config.source_vocab, start, g)
    else:
        sources = [_draw(config.source_vocab, n, g) for n in SOURCE_LENGTHS]
    src, src_mask = _right_padded(sources)
    tgt, tgt_mask = _targets(config.vocab_size, start, g)
    diff = _check_logits(model, reference, (src, src_mask, tgt, tgt_mask))
    if not generation:
        return f"max logit difference {diff:.2g}"
    greedy, step_diff = _check_greedy(model, reference, src, src_mask, start)
    eos = _end_id(greedy)
    _check_beams(model, reference, src, src_mask, start, eos)
    lively = "/".join(map(str, _distinct(greedy)))
    return (
        f"max logit difference {max(diff, step_diff):.2g}; greedy tokens equal "
        f"({GREEDY_TOKENS} per source, {lively} distinct), beam search ({NUM_BEAMS} beams) "
        "equal"
    )
