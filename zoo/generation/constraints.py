"""What a generation may not pick at a step, applied to the scores of every row as
transformers' logits processors apply them, in the same order and with the same arithmetic:
no repeated n-gram (``no_repeat_ngram_size``), no bad words (``bad_words_ids``), no end id
too early (``min_length``, ``min_new_tokens``), a forced first and last token
(``forced_bos_id``, ``forced_eos_id``). Greedy and sampled decoding apply them to the logits,
beam search to the log-probabilities (as transformers does).

Each constraint reads the ids so far: the session's prefix (a decoder's prompt as given,
padding included; an encoder-decoder's start token) followed by the new tokens.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .config import GenerationConfig

__all__ = ["Constraints"]


def _bad_word_groups(
    words: list[tuple[int, ...]], device: torch.device
) -> list[tuple[Tensor, Tensor]]:
    """Bad words of two ids or more grouped by length: ``(prefixes (G, L), last ids (G,))``
    for each length ``L + 1``, in the order transformers matches them."""
    by_length: dict[int, list[tuple[int, ...]]] = {}
    for word in words:
        if len(word) > 1:
            by_length.setdefault(len(word) - 1, []).append(word)
    return [
        (
            torch.tensor([w[:-1] for w in group], device=device),
            torch.tensor([w[-1] for w in group], device=device),
        )
        for group in by_length.values()
    ]


class Constraints:
    """The constraints of one generation, ready to apply (:meth:`of` makes them; ``None``
    when the settings ask for none).

    Args:
        config: the settings (``no_repeat_ngram_size``, ``bad_words_ids``, ``min_length``,
            ``min_new_tokens``, ``forced_bos_id``, ``forced_eos_id``, the end ids).
        prefix_length: the ids each row starts from (``P``: the session's prefix).
        max_new_tokens: the new tokens at most (the last one is where ``forced_eos_id`` goes).
        vocab_size: the model's vocabulary (a bad word outside it is an error).
        device: where the scores are.
    """

    def __init__(
        self,
        config: GenerationConfig,
        prefix_length: int,
        max_new_tokens: int,
        vocab_size: int,
        device: torch.device,
    ) -> None:
        ends = config.end_ids
        words = [w for w in config.bad_words_ids if not (len(w) == 1 and w[0] in ends)]
        outside = sorted({i for w in words for i in w if i >= vocab_size})
        if outside:
            raise ValueError(
                f"bad_words_ids holds ids outside the model's vocabulary of {vocab_size}: "
                f"{outside}; give ids below {vocab_size}"
            )
        self.ngram = config.no_repeat_ngram_size
        self.single = torch.tensor([w[0] for w in words if len(w) == 1], device=device)
        self.groups = _bad_word_groups(words, device)
        self.ends = torch.tensor(ends, device=device) if ends else None
        self.min_length = config.min_length
        self.min_new_tokens = config.min_new_tokens
        self.prefix_length = prefix_length
        self.forced_bos = config.forced_bos_id
        forced = config.forced_eos_id
        self.forced_eos = (forced,) if isinstance(forced, int) else forced
        #: the longest sequence: prefix plus new tokens (transformers' ``max_length``).
        self.max_length = prefix_length + max_new_tokens

    @classmethod
    def of(
        cls,
        config: GenerationConfig,
        prefix_length: int,
        max_new_tokens: int,
        vocab_size: int,
        device: torch.device,
    ) -> Constraints | None:
        """The constraints ``config`` asks for, or ``None`` when it asks for none (decoding
        then runs exactly as it does without this module)."""
        asked = (
            config.no_repeat_ngram_size > 0
            or config.bad_words_ids
            or config.min_length > 0
            or config.min_new_tokens > 0
            or config.forced_bos_id is not None
            or config.forced_eos_id is not None
        )
        return cls(config, prefix_length, max_new_tokens, vocab_size, device) if asked else None

    def __call__(self, ids: Tensor, scores: Tensor, *, own: bool = False) -> Tensor:
        """``scores`` ``(N, V)`` of the next token after ``ids`` ``(N, L)``, with what may not
        follow set to ``-inf`` (and a forced token's score to 0, every other ``-inf``).
        ``own``: ``scores`` is the caller's to overwrite (a tensor it made for this step), so
        the bans are written into it instead of into a copy of the ``(N, V)`` scores."""
        length = ids.shape[-1]
        no_repeat = self.ngram > 0 and length >= self.ngram
        no_bad_words = bool(self.single.numel() or self.groups)
        if (no_repeat or no_bad_words) and not own:
            scores = scores.clone()  # one copy, which the bans below are written into
        if no_repeat:
            self._no_repeat(ids, scores)
        if no_bad_words:
            self._no_bad_words(ids, scores)
        too_short = length < self.min_length or length - self.prefix_length < self.min_new_tokens
        if self.ends is not None and too_short:
            vocab = torch.arange(scores.shape[-1], device=scores.device)
            scores = torch.where(torch.isin(vocab, self.ends), -math.inf, scores)
        if self.forced_bos is not None and length == 1:
            scores = torch.full_like(scores, -math.inf)
            scores[:, self.forced_bos] = 0
        if self.forced_eos is not None and length == self.max_length - 1:
            scores = torch.full_like(scores, -math.inf)
            scores[:, list(self.forced_eos)] = 0
        return scores

    def _no_repeat(self, ids: Tensor, scores: Tensor) -> None:
        """Ban each token that would complete an n-gram already in the row: every window
        whose first ``n - 1`` ids are the row's last ``n - 1`` bans its own last id."""
        n = self.ngram
        prefix = ids[:, ids.shape[-1] + 1 - n :]
        windows = ids.unfold(dimension=1, size=n, step=1)
        matches = (windows[..., :-1] == prefix.unsqueeze(1)).all(dim=-1)
        vocab_size = scores.shape[-1]  # a spare column past it takes the windows that miss
        banned = scores.new_zeros((scores.shape[0], vocab_size + 1), dtype=torch.bool)
        last = torch.where(matches, windows[..., -1].clamp(max=vocab_size), vocab_size)
        banned.scatter_(1, last, True)
        scores.masked_fill_(banned[:, :vocab_size], -math.inf)

    def _no_bad_words(self, ids: Tensor, scores: Tensor) -> None:
        """Ban every one-id bad word, and the last id of each longer one whose other ids end
        the row, in ``scores`` itself."""
        if self.single.numel():  # no mask the size of the scores
            scores.index_fill_(1, self.single, -math.inf)
        if not self.groups:
            return
        banned = torch.zeros_like(scores, dtype=torch.bool)
        for prefixes, last in self.groups:
            if prefixes.shape[1] > ids.shape[1]:  # longer than the row so far: cannot match
                continue
            matching = (ids[:, None, -prefixes.shape[1] :] == prefixes).all(dim=-1)  # (N, G)
            rows, group = matching.nonzero(as_tuple=True)
            banned[rows, last[group]] = True
        scores.masked_fill_(banned, -math.inf)
