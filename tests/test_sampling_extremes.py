"""Sampling always keeps at least the most likely token: every extreme of
every sampling setting (temperature from the smallest float to the largest, ``top_p`` from
the smallest float to 1, ``top_k`` from 1 to beyond the vocabulary, seeds at both ends of
their range) on every kind of logits (masked ``-inf`` ids, +-3e38, float16/bfloat16, ``+inf``,
NaN, a row with nothing above ``-inf``) picks a valid id among the most likely ones, through
:func:`zoo.generation.next_tokens`, :func:`zoo.generate` and zoo serve's picker
(:func:`zoo.generation.sampling.pick_each`); ``zoo
serve`` and ``zoo chat`` themselves are tested in tests/test_serve.py and
tests/test_chat_cli.py."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import pytest
import torch
from test_generation import small

import zoo
from zoo.generation import GenerationConfig, generate_ids, next_tokens
from zoo.generation.sampling import limit_vocab, pick_each
from zoo.options import SEED_RANGE

INF, NAN = math.inf, math.nan
V = 12  # vocabulary of the unit cases

#: The extremes of each setting GenerationConfig takes (and ordinary values between).
TEMPERATURES = [5e-324, 1e-45, 1.0, 2.0, 3.4e38, 3.4028236e38, 1.7e308]
TOP_KS = [None, 1, 2, V, 10**30]
TOP_PS = [None, 5e-324, 1e-45, 0.5, 1.0]
SEEDS = [SEED_RANGE[0], 0, SEED_RANGE[1]]
#: A top_p or temperature this small leaves only the most likely token (ties aside).
TINY = 1e-30


def _rows(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


_PLAIN = torch.randn(3, V, generator=torch.Generator().manual_seed(0)) * 3
_MASKED = _PLAIN.clone()
_MASKED[:, 5:] = -INF  # a padded vocabulary (vocab_limit), as zoo.generate masks it
#: The logits of each kind, (B, V) rows.
LOGITS = {
    "plain": _PLAIN,
    "masked ids": _MASKED,
    "+-3e38": _rows(
        [3e38, -3e38, 0, 1, 2, 3e38, -1e38, 5, 6, 7, 8, 9],
        [-3e38] * (V - 1) + [3e38],
        [1e38, 2e38, -3e38, 3.4e38, *range(V - 4)],
    ),
    "float16": (_PLAIN * 1e4).half(),  # +-inf where it overflows float16
    "bfloat16": _rows([3e38, -3e38, *range(V - 2)], [-3.3e38] * V).bfloat16(),
    "+inf": _rows([INF, 1, INF, -INF, *range(V - 4)], [1, 2, 3, INF, *[-3e38] * (V - 4)]),
    "NaN": _rows([NAN, 1, 2, *range(V - 3)], [NAN] * (V - 1) + [-INF]),
    "nothing above -inf": _rows([-INF] * V, [NAN] * V, [-INF, *[NAN] * (V - 1)]),
}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny tensors on one thread: a parallel multinomial on a loaded machine spends
    milliseconds waking its thread pool, hundreds of times a test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _allowed(row: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None):
    """The ids a sample of ``row`` may be: the most likely ones when the settings leave no
    others, else every candidate in the top ``top_k``. Ranked by float32 logits minus the
    row's largest (3e38 - 3e38 is 0, -3e38 - 3e38 is -inf: float32 cannot rank them
    further); ``+inf`` is infinitely more likely than any number, NaN never is."""
    logits = [-INF if math.isnan(x) else x for x in row.float().tolist()]
    top = max(logits)
    if top == -INF:  # no distribution: the greedy pick
        return {int(row.argmax())}
    if top == INF:
        return {i for i, x in enumerate(logits) if x == INF}
    values = (torch.tensor(logits) - top).tolist()  # float32, as a model's logits are
    top = 0.0
    allowed = {i for i, x in enumerate(values) if x > -INF}
    if top_k is not None:
        kth = sorted(values, reverse=True)[min(top_k, V) - 1]
        allowed = {i for i in allowed if values[i] >= kth}
    if top_k == 1 or (top_p is not None and top_p < TINY) or temperature < TINY:
        allowed = {i for i in allowed if values[i] == top}
    return allowed


@pytest.mark.parametrize("kind", list(LOGITS))
def test_every_extreme_setting_picks_one_of_the_most_likely_tokens(kind):
    logits = LOGITS[kind]
    grid = itertools.product(TEMPERATURES, TOP_KS, TOP_PS)
    for i, (temperature, top_k, top_p) in enumerate(grid):
        settings = f"{kind}: temperature={temperature} top_k={top_k} top_p={top_p}"
        generator = torch.Generator().manual_seed(SEEDS[i % len(SEEDS)])
        picked = next_tokens(
            logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
        )
        assert picked.shape == (logits.shape[0],) and picked.dtype == torch.long, settings
        for row, token in zip(logits, picked.tolist(), strict=True):
            assert token in _allowed(row, temperature, top_k, top_p), settings


@pytest.mark.parametrize("kind", list(LOGITS))
def test_the_servers_picker_keeps_the_most_likely_token_of_each_row(kind):
    """zoo serve picks each row with its own settings, generator and vocab_limit (the
    masking and sampler zoo.generate uses): the same guarantee, row by row (every 7th
    setting of the grid: all of each field's values, fewer combinations)."""
    logits = LOGITS[kind]
    limits = [None, 5, V - 1][: logits.shape[0]]
    masked = limit_vocab(logits, limits)
    grid = itertools.product(TEMPERATURES, TOP_KS, TOP_PS)
    for i, (temperature, top_k, top_p) in enumerate(itertools.islice(grid, 0, None, 7)):
        settings = f"{kind}: temperature={temperature} top_k={top_k} top_p={top_p}"
        configs = [
            GenerationConfig(temperature=temperature, top_k=top_k, top_p=top_p, vocab_limit=limit)
            for limit in limits
        ]
        generators = [
            torch.Generator().manual_seed(SEEDS[(i + j) % len(SEEDS)]) for j in range(len(limits))
        ]
        picked = pick_each(logits, configs, generators)
        for row, token in zip(masked, picked, strict=True):
            assert token in _allowed(row, temperature, top_k, top_p), settings


def test_a_tiny_top_p_keeps_the_most_likely_token_not_nothing():
    """top_p=1e-300 compares as float32 0 with the mass ranked above the most likely token
    (0), which dropped it too: every id masked, then torch.multinomial's 'probability
    tensor contains either inf, nan or element < 0' (HTTP 500 in zoo serve)."""
    for top_p in (5e-324, 1e-300, 1e-46):
        picked = next_tokens(_PLAIN, temperature=1.0, top_k=None, top_p=top_p, generator=None)
        assert picked.tolist() == _PLAIN.argmax(dim=-1).tolist()
        filtered = zoo.generation.filter_logits(_PLAIN, top_p=top_p)
        assert (torch.isfinite(filtered).sum(dim=-1) == 1).all()


def test_ordinary_settings_sample_as_before():
    """The bit-for-bit guard beside the golden tests: the draws of ordinary settings on
    ordinary logits, recorded before the extremes were handled."""
    generator = torch.Generator().manual_seed(7)
    batch = _MASKED.repeat(4, 1)  # (12, V)
    drawn = [
        next_tokens(batch, temperature=t, top_k=k, top_p=p, generator=generator).tolist()
        for t, k, p in [(1.0, None, None), (0.7, 3, None), (1.3, None, 0.8), (2.0, 4, 0.95)]
    ]
    assert drawn == RECORDED


RECORDED = [
    [4, 1, 4, 4, 2, 4, 4, 0, 3, 4, 2, 0],
    [4, 1, 4, 4, 1, 2, 4, 2, 3, 4, 2, 3],
    [4, 2, 3, 4, 2, 4, 4, 2, 4, 4, 1, 2],
    [4, 1, 4, 4, 2, 2, 4, 2, 4, 4, 1, 2],
]


# -- through zoo.generate: a tiny model, a few tokens each ---------------------------------
#: Settings that leave only the most likely token: they give exactly the greedy tokens.
AS_GREEDY = [
    {"temperature": 5e-324},
    {"temperature": 1e-300, "top_p": 1e-300},
    {"temperature": 1.0, "top_p": 1e-300},
    {"temperature": 1e300, "top_p": 5e-324, "seed": SEED_RANGE[1]},
    {"temperature": 2.0, "top_k": 1, "top_p": 1.0, "seed": SEED_RANGE[0]},
]
#: Settings that sample among many: valid ids from the unmasked vocabulary.
SAMPLING = [
    {"temperature": 1e300, "top_k": 10**30, "top_p": 1.0, "seed": SEED_RANGE[1]},
    {"temperature": 1.7e308, "top_k": 1000, "seed": SEED_RANGE[0]},
    {"temperature": 2.0, "top_k": 999, "top_p": 0.999999, "seed": 0},
]


@pytest.fixture(scope="module")
def gpt2():
    return small("gpt2-124m")  # vocabulary 1000


def test_zoo_generate_keeps_the_most_likely_token_at_every_extreme(gpt2):
    prompt = [[3, 17, 42], [8, 9, 10]]
    greedy = zoo.generate(gpt2, prompt, max_new_tokens=4, temperature=0)
    for settings in AS_GREEDY:
        assert zoo.generate(gpt2, prompt, max_new_tokens=4, **settings) == greedy, settings
    for settings in SAMPLING:  # vocab_limit masks ids 900..999: -inf logits
        config = GenerationConfig(max_new_tokens=4, vocab_limit=900, **settings)
        new = generate_ids(gpt2, torch.tensor(prompt), None, config)[:, 3:]
        assert new.shape == (2, 4) and int(new.min()) >= 0 and int(new.max()) < 900, settings


@pytest.mark.parametrize("dtype, scale", [(torch.float32, 3e37), (torch.float16, 1e4)])
def test_zoo_generate_samples_from_logits_that_overflow(dtype, scale):
    """A model whose logits reach +-inf (a float16 one's easily): every setting still picks
    ids of the vocabulary (+inf - +inf was nan)."""
    model = small("gpt2-124m").to(dtype)
    with torch.no_grad():
        model.final_norm.weight.mul_(scale)
        model.final_norm.bias.zero_()
    for settings in [*AS_GREEDY, *SAMPLING]:
        ids = zoo.generate(model, [3, 17, 42], max_new_tokens=3, **settings)
        assert len(ids) == 6 and all(0 <= i < 1000 for i in ids), settings
