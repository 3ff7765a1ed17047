"""Picking the next token from logits: greedy, or a sample from the tempered distribution
filtered to the top-k and the nucleus (top-p); never an id at or above the settings'
``vocab_limit``. The one picker of :func:`zoo.generate` (:func:`pick`: one setting for a
batch) and ``zoo serve`` (:func:`pick_each`: each row its own).

A sample always has at least one candidate, the most likely token, whatever the settings
(any temperature, ``top_p`` down to the smallest float, any ``top_k``) and whatever the
logits (``-inf`` for masked ids, ``+inf`` or huge values from float16/bfloat16, NaN): the
distribution handed to ``torch.multinomial`` is never empty or ``nan``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .config import GenerationConfig

__all__ = ["filter_logits", "limit_vocab", "next_tokens", "pick", "pick_each", "seeded_generator"]

_FLOAT32 = torch.finfo(torch.float32)


def limit_vocab(logits: Tensor, limits: int | Sequence[int | None] | None) -> Tensor:
    """``logits`` ``(B, V)`` with every id at or above its row's limit set to ``-inf``, so it
    is never picked (a model vocabulary padded beyond its tokenizer's): one limit for every
    row, or one per row (``None``: no limit). A copy when anything is masked."""
    width = logits.shape[-1]
    if limits is None or isinstance(limits, int):
        if limits is None or limits >= width:
            return logits
        logits = logits.clone()
        logits[:, limits:] = float("-inf")
        return logits
    masked = [(i, limit) for i, limit in enumerate(limits) if limit is not None and limit < width]
    if masked:
        logits = logits.clone()
        for i, limit in masked:
            logits[i, limit:] = float("-inf")
    return logits


def filter_logits(
    logits: Tensor, *, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Set to ``-inf`` every logit outside the top-``k`` and outside the nucleus: the smallest
    set of most likely tokens whose probability reaches ``top_p``; the most likely token
    always stays. ``(B, V) -> (B, V)``."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability mass ranked above each token
        drop_sorted = before >= top_p
        # the most likely token has nothing before it, but a top_p below float32's smallest
        # number (1e-300) compares as 0 and would drop it too
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _scores(logits: Tensor) -> tuple[Tensor, Tensor | None]:
    """Each row's logits as float32 scores whose maximum is 0, and which rows have any
    candidate ``(B,)`` (``None``: all of them). Logits that are all numbers, some finite,
    are shifted by their maximum (the usual case, checked on ``B`` numbers); others go
    through :func:`_odd_scores`."""
    logits = logits.float()
    top = logits.amax(dim=-1, keepdim=True)  # (B, 1): nan for a row holding a nan
    if bool(torch.isfinite(top).all()):
        return logits - top, None
    return _odd_scores(logits)


def _odd_scores(logits: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_scores` of rows with a NaN, a ``+inf`` or nothing above ``-inf``: the logits
    equal to their row's maximum score 0 (every ``+inf`` one when there are some: the
    others are infinitely less likely and score ``-inf``), NaN scores ``-inf``. A row with
    nothing above ``-inf`` has no candidate and scores 0 everywhere (a valid distribution,
    which the caller replaces)."""
    clean = logits.masked_fill(logits.isnan(), float("-inf"))
    top = clean.amax(dim=-1, keepdim=True)  # (B, 1)
    scores = torch.where(clean == top, 0.0, clean - top)
    return scores, top.squeeze(-1) > float("-inf")


def _tempered(scores: Tensor, temperature: float) -> Tensor:
    """``scores / temperature`` with the temperature kept within float32's range: one below
    its smallest normal number is taken as that number (a tiny one sharpens towards greedy
    instead of dividing by 0), one above its largest as its largest (float32 would round it
    to ``inf``: every score 0 and ``-inf / inf`` ``nan``, so neither top-k nor top-p could
    tell the most likely token from the others)."""
    return scores / min(max(temperature, _FLOAT32.tiny), _FLOAT32.max)


def next_tokens(
    logits: Tensor,
    *,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
) -> Tensor:
    """Pick the next token of each row, ``(B, V) -> (B,)``: argmax when ``temperature`` is 0,
    otherwise a sample from the filtered, tempered distribution, which always keeps the most
    likely token. The logits are shifted so their maximum is 0 and the temperature is kept
    within float32's range, so no setting produces ``nan``; a row with no logit above
    ``-inf`` (or only NaN) gets its argmax, as greedy would."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    scores, candidates = _scores(logits)
    filtered = filter_logits(_tempered(scores, temperature), top_k=top_k, top_p=top_p)
    probs = filtered.softmax(dim=-1)
    sampled = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    if candidates is None:
        return sampled
    return torch.where(candidates, sampled, logits.argmax(dim=-1))


def seeded_generator(config: GenerationConfig, device: torch.device) -> torch.Generator | None:
    """The generator a sampled reply draws from, seeded with ``config.seed``; ``None``
    (PyTorch's global one) when it has no seed or is greedy."""
    if config.seed is None or config.temperature == 0:
        return None
    return torch.Generator(device=device).manual_seed(config.seed)


def pick(logits: Tensor, config: GenerationConfig, generator: torch.Generator | None) -> Tensor:
    """The next token of each row ``(B, V) -> (B,)`` with ``config``'s settings, never one at
    or above ``config.vocab_limit``."""
    return next_tokens(
        limit_vocab(logits, config.vocab_limit),
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        generator=generator,
    )


def pick_each(
    logits: Tensor,
    configs: Sequence[GenerationConfig],
    generators: Sequence[torch.Generator | None],
) -> list[int]:
    """The next token of each row of ``logits`` ``(N, V)`` with its own settings and
    generator: the argmax of every greedy row at once, :func:`pick` for each sampled one."""
    picked = limit_vocab(logits, [c.vocab_limit for c in configs]).argmax(dim=-1).tolist()
    for i, (config, generator) in enumerate(zip(configs, generators, strict=True)):
        if config.temperature > 0:
            picked[i] = int(pick(logits[i : i + 1], config, generator)[0])
    return picked
