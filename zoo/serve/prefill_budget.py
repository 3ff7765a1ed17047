"""How many prompt tokens a step of ``zoo serve`` prefills, in plain Python (no torch).

A step runs one decoding token for every stream and then a chunk of the prompts still coming
in; the chunk is what the streams wait for. :class:`PrefillBudget` sizes it: at most
``max_tokens``, and while streams decode, as many tokens as the last prefill passes say take
about ``max_stall`` times the last decoding steps, so a step that carries a chunk takes about
``1 + max_stall`` times a plain one on any machine, model or load. With nothing decoding, the
whole ``max_tokens`` go (no stream waits). While streams decode but no decoding step has been
timed yet (the first step they decode in is planned before its pass runs), the chunk is the
least one, ``MIN_CHUNK``: nothing says yet what the streams can wait for.
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
    average decoding step): after a prefill pass of ``n`` tokens that took ``t``, the next
    chunk aims at ``n * target / t`` tokens. A pass's cost is not proportional to its tokens
    (a pass has a fixed cost too), so the estimate from a small pass is low; the next pass
    is larger, and the aim climbs to the size that takes the target time instead of staying
    where a small first pass put it.

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
        self._step: float | None = None  # seconds of a decoding step, averaged
        self._pass: tuple[int, float] | None = None  # the last prefill pass: tokens, seconds
        self._aim: float | None = None  # the chunk aimed at while streams decode

    def tokens(self, decoding: bool) -> int | None:
        """The next step's budget (``None``: no bound), given whether streams decode."""
        if self.max_tokens is None or self.max_stall is None or not decoding:
            return self.max_tokens
        if self._step is None:  # streams wait, and how long a step of theirs takes is unknown
            return min(MIN_CHUNK, self.max_tokens)
        if self._aim is None:
            return self.max_tokens
        return max(min(MIN_CHUNK, self.max_tokens), min(self.max_tokens, int(self._aim)))

    def decoded(self, seconds: float) -> None:
        """A decoding step took ``seconds``."""
        first = self._step is None
        self._step = _average(self._step, seconds)
        if first and self._pass is not None:
            self._retarget(*self._pass)

    def mixed(self, tokens: int, seconds: float) -> None:
        """A pass that ran the streams' decoding step and ``tokens`` of prompt chunks
        (padding included) at once took ``seconds``: the chunks took what it took beyond a
        plain decoding step (at least a tenth of it). Before any plain step has been timed,
        the pass is the bound of one (a plain step reads the same weights, for fewer rows),
        so the chunks double from pass to pass instead of staying the least."""
        if self._step is None:
            self.decoded(seconds)
            self.prefilled(tokens, seconds)
            return
        self.prefilled(tokens, max(seconds - self._step, seconds / 10))

    def prefilled(self, tokens: int, seconds: float) -> None:
        """A prefill pass of ``tokens`` (padding included) took ``seconds``."""
        if tokens > 0 and seconds > 0:
            self._pass = (tokens, seconds)
            self._retarget(tokens, seconds)

    def _retarget(self, tokens: int, seconds: float) -> None:
        """Aim at the chunk that ``tokens`` in ``seconds`` say takes the target time; a pass
        well under the aim that kept to the target (a prompt's last few tokens) says little
        about a larger one and moves nothing."""
        if self._step is None or self.max_stall is None or self.max_tokens is None:
            return
        target = self.max_stall * self._step
        if self._aim is not None and seconds <= target and tokens < self._aim / 2:
            return
        self._aim = min(max(tokens * target / seconds, MIN_CHUNK), self.max_tokens)


def _average(mean: float | None, value: float) -> float:
    return value if mean is None else (1 - SMOOTHING) * mean + SMOOTHING * value
