"""How many prompt tokens a step of ``zoo serve`` prefills, in plain Python (no torch).

A step runs one decoding token for every stream and then a chunk of the prompts still coming
in; the chunk is what the streams wait for. :class:`PrefillBudget` sizes it: at most
``max_tokens``, and while streams decode, as many tokens as the last prefill passes say take
about ``max_stall`` times the last decoding steps, so a step that carries a chunk takes about
``1 + max_stall`` times a plain one on any machine, model or load. With nothing decoding, the
whole ``max_tokens`` go (no stream waits).
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_STALL", "DEFAULT_PREFILL_CHUNK", "MIN_CHUNK", "PrefillBudget"]

#: Prompt tokens a step prefills at most, unless told otherwise.
DEFAULT_PREFILL_CHUNK = 512
#: A step's prompt chunk takes at most about this many decoding steps, unless told otherwise.
DEFAULT_MAX_STALL = 2.0
#: The fewest prompt tokens a step prefills while prompts wait, however slow they are.
MIN_CHUNK = 16
#: Weight of the newest timing in the running averages.
SMOOTHING = 0.3


class PrefillBudget:
    """The prompt tokens of the next step: see the module.

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
        self._step: float | None = None  # seconds of a decoding step
        self._token: float | None = None  # seconds of a prompt token in a prefill pass

    def tokens(self, decoding: bool) -> int | None:
        """The next step's budget (``None``: no bound), given whether streams decode."""
        if self.max_tokens is None or self.max_stall is None or not decoding:
            return self.max_tokens
        if self._step is None or self._token is None:
            return self.max_tokens
        fit = int(self.max_stall * self._step / self._token)
        return max(min(MIN_CHUNK, self.max_tokens), min(self.max_tokens, fit))

    def decoded(self, seconds: float) -> None:
        """A decoding step took ``seconds``."""
        self._step = _average(self._step, seconds)

    def prefilled(self, tokens: int, seconds: float) -> None:
        """A prefill pass of ``tokens`` (padding included) took ``seconds``."""
        if tokens > 0:
            self._token = _average(self._token, seconds / tokens)


def _average(mean: float | None, value: float) -> float:
    return value if mean is None else (1 - SMOOTHING) * mean + SMOOTHING * value
