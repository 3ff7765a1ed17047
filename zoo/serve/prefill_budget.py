"""How many prompt tokens a step of ``zoo serve`` prefills, in plain Python (no torch).

A step runs one decoding token for every stream and then a chunk of the prompts still coming
in; the chunk is what the streams wait for. :class:`PrefillBudget` sizes it: at most
``max_tokens``, and while streams decode, as many tokens as the last prefill passes say take
about ``max_stall`` times the last decoding steps for each prompt waiting per stream decoding
(at least ``max_stall`` steps), so a step that carries a chunk takes about ``1 + max_stall``
times a plain one on any machine, model or load, unless more prompts wait than streams
decode: then the streams' wait buys a first token for more requests than it holds up, and a
burst of short prompts beside few streams enters in one pass, as vLLM's token budget takes
it. With nothing decoding, the whole ``max_tokens`` go (no stream waits). While streams
decode but no decoding step has been timed yet (the first step they decode in is planned
before its pass runs), the chunk is the least one, ``MIN_CHUNK``: nothing says yet what the
streams can wait for.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_STALL", "DEFAULT_PREFILL_CHUNK", "MIN_CHUNK", "PrefillBudget"]

#: Prompt tokens a step prefills at most, unless told otherwise.
DEFAULT_PREFILL_CHUNK = 512
#: A step's prompt chunk takes at most about this many decoding steps, unless told otherwise.
DEFAULT_MAX_STALL = 2.0
#: The fewest prompt tokens a step prefills while prompts wait, however slow they are.
MIN_CHUNK = 16
#: Weight of the newest decoding step's time in its running average.
SMOOTHING = 0.3


class PrefillBudget:
    """The prompt tokens of the next step: see the module.

    While streams decode, the chunk is steered to its target time (``max_stall`` times the
    average decoding step of as many rows as decode): after a prefill pass of ``n`` tokens
    that took ``t``, the next chunk aims at ``n * target / t`` tokens. A pass's cost is not
    proportional to its tokens (a pass has a fixed cost too), so the estimate from a small
    pass is low; the next pass is larger, and the aim climbs to the size that takes the
    target time instead of staying where a small first pass put it. Decoding steps are
    timed by their rows (a step of many rows takes longer than one of few), and a pass that
    decodes one stream beside its chunks is charged beyond a step of one row, not beyond the
    average step (which would charge its chunks too little, and aim the next chunk too
    high).

    Args:
        max_tokens: tokens per step at most, padding included (``None``: whole prompts,
            whatever they cost).
        max_stall: while streams decode, a chunk is sized to take at most about this many
            decoding steps (``None``: only ``max_tokens`` bounds it).
    """

    def __init__(self, max_tokens: int | None, max_stall: float | None = DEFAULT_MAX_STALL) -> None:
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"prefill_chunk must be a positive integer, got {max_tokens}")
        if max_stall is not None and not 0 < max_stall < float("inf"):
            raise ValueError(f"max_stall must be a positive number, got {max_stall}")
        self.max_tokens = max_tokens
        self.max_stall = max_stall
        self._steps: dict[int, float] = {}  # seconds of a decoding step by its rows, averaged
        self._rate: float | None = None  # prompt tokens a second, as the aim extrapolates

    def tokens(self, decoding: int, waiting: int = 1) -> int | None:
        """The next step's budget (``None``: no bound), given the streams decoding and the
        prompts waiting for chunks: the aim, times the prompts waiting per stream where
        more wait than decode (see the module)."""
        if self.max_tokens is None or self.max_stall is None or not decoding:
            return self.max_tokens
        step = self._step(decoding)
        if step is None:  # streams wait, and how long a step of theirs takes is unknown
            return min(MIN_CHUNK, self.max_tokens)
        if self._rate is None:
            return self.max_tokens
        aim = self._aim(step) * max(1.0, waiting / decoding)
        return max(min(MIN_CHUNK, self.max_tokens), min(self.max_tokens, int(aim)))

    def decoded(self, seconds: float, rows: int = 1) -> None:
        """A decoding step of ``rows`` streams took ``seconds``."""
        self._steps[rows] = _average(self._steps.get(rows), seconds)

    def mixed(self, tokens: int, seconds: float, rows: int = 1) -> None:
        """A pass that ran the decoding step of ``rows`` streams and ``tokens`` of prompt
        chunks (padding included) at once took ``seconds``: the chunks took what it took
        beyond a plain step of those rows (at least a tenth of it). Before any plain step
        has been timed, the pass is the bound of one (a plain step reads the same weights,
        for fewer rows), so the chunks double from pass to pass instead of staying the
        least."""
        step = self._step(rows)
        if step is None:
            self.decoded(seconds, rows)
            self.prefilled(tokens, seconds, rows)
            return
        self.prefilled(tokens, max(seconds - step, seconds / 10), rows)

    def prefilled(self, tokens: int, seconds: float, rows: int = 1) -> None:
        """A prefill pass of ``tokens`` (padding included) took ``seconds`` while ``rows``
        streams decoded (they waited for it): aim at the chunk that takes the target time
        for them. A pass well under the aim that kept to the target (a prompt's last few
        tokens) says little about a larger one and moves nothing."""
        if tokens <= 0 or seconds <= 0:
            return
        step = self._step(rows)
        if step is not None and self._rate is not None and self.max_stall is not None:
            target = self.max_stall * step
            if seconds <= target and tokens < self._aim(step) / 2:
                return
        self._rate = tokens / seconds

    def _aim(self, step: float) -> float:
        """The chunk that takes ``max_stall`` decoding steps of ``step`` seconds, as the last
        pass extrapolates (between ``MIN_CHUNK`` and ``max_tokens``)."""
        assert self._rate is not None and self.max_stall is not None
        aim = max(self._rate * self.max_stall * step, MIN_CHUNK)
        return aim if self.max_tokens is None else min(aim, self.max_tokens)

    def _step(self, rows: int) -> float | None:
        """A decoding step of ``rows`` streams: as timed, else the step of the most rows
        timed below (a step of fewer rows costs no more), else of the fewest timed."""
        if not self._steps:
            return None
        below = [r for r in self._steps if r <= rows]
        return self._steps[max(below) if below else min(self._steps)]


def _average(mean: float | None, value: float) -> float:
    return value if mean is None else (1 - SMOOTHING) * mean + SMOOTHING * value
