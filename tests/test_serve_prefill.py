"""The serving engine's chunked prefill and prefix cache: replies equal ``zoo.generate``'s
whether prompts enter whole or in chunks, alone or together, and whether their prefixes are
computed or copied from the cache; a long prompt enters over several steps while the running
streams keep getting a token every step; ``zoo chat``'s turns reuse the conversation so far."""

from __future__ import annotations

import pytest
import torch
from serve_events import Collect

import zoo
from zoo.generation import GenerationConfig, stream_continuation
from zoo.serve.engine import Engine, Request
from zoo.serve.local import Turns
from zoo.serve.prefill_budget import MIN_CHUNK, PrefillBudget
from zoo.serve.scheduler import Chunk, plan_chunks


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return zoo.load("shakespeare-byte").eval()


def greedy(n: int) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=n, temperature=0)


def run(engine: Engine, prompts: list[str], n: int) -> list[Collect]:
    """Submit ``prompts`` together and step the engine on this thread until they end."""
    tok = engine.model.tokenizer  # type: ignore[union-attr]
    sinks = [Collect() for _ in prompts]
    engine.submit(
        [
            Request(tok.encode(p), greedy(n), tok, s, tok.end_ids)
            for p, s in zip(prompts, sinks, strict=True)
        ]
    )
    with torch.inference_mode():
        while not all(s.done.is_set() for s in sinks):
            engine.step()
    return sinks


PROMPTS = [
    "ROMEO:",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n",
    "KING",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n",
]


def test_plan_chunks_fills_the_budget_with_the_most_prompt_tokens():
    assert plan_chunks([900], 128) == [128]
    assert plan_chunks([30, 30, 30, 30], 128) == [30, 30, 30, 30]  # 4 rows of 32
    assert plan_chunks([900, 20], 128) == [128]  # two rows of 64 would prefill less
    assert plan_chunks([5, 900], 128) == [5, 64]  # 2 rows of 64: 69 real > 1 row's 5
    assert plan_chunks([3, 3], None) == [3, 3]  # no budget: whole prompts
    for left in ([7, 1, 300, 2], [1] * 20, [500, 500, 500]):
        sizes = plan_chunks(left, 16)
        assert len(sizes) * max(sizes) <= 16 and all(
            0 < s <= n for s, n in zip(sizes, left, strict=False)
        )


def test_the_budget_sizes_a_chunk_to_the_decoding_steps_it_may_take():
    budget = PrefillBudget(512, max_stall=2.0)
    assert budget.tokens(decoding=False) == 512  # nothing timed yet, no stream waits
    assert budget.tokens(decoding=True) == MIN_CHUNK  # streams wait, no step timed: the least
    budget.prefilled(20, 0.05)  # the streams' own prompts, before any of them decodes
    budget.decoded(0.1)
    assert budget.tokens(decoding=True) == 80  # 20 tokens in 50 ms: 80 in 2 steps of 100 ms
    assert budget.tokens(decoding=False) == 512  # no stream waits
    assert budget.tokens(4, waiting=1) == budget.tokens(4, waiting=4) == 80
    assert budget.tokens(2, waiting=3) == 120  # 2 steps for each of 1.5 prompts per stream
    assert budget.tokens(1, waiting=7) == 512  # a burst beside one stream: whole, to the most
    budget.prefilled(80, 0.1)  # a pass costs less per token when larger: the aim climbs
    assert budget.tokens(decoding=True) == 160
    budget.prefilled(10, 0.05)  # a prompt's last few tokens: nothing said about 160
    assert budget.tokens(decoding=True) == 160
    budget.prefilled(160, 2.0)  # the machine got busy: over the target, the aim drops
    assert budget.tokens(decoding=True) == MIN_CHUNK
    fast = PrefillBudget(64, max_stall=2.0)
    fast.decoded(1.0)
    fast.prefilled(10, 0.001)
    assert fast.tokens(decoding=True) == 64  # never above the most
    assert PrefillBudget(8, 2.0).tokens(True) == 8 and PrefillBudget(None).tokens(True) is None
    assert PrefillBudget(300, max_stall=None).tokens(True) == 300
    with pytest.raises(ValueError, match="prefill_chunk must be a positive integer"):
        PrefillBudget(0)
    with pytest.raises(ValueError, match="max_stall must be a positive number"):
        PrefillBudget(10, float("nan"))


def test_a_pass_that_decodes_and_prefills_at_once_sizes_the_next_chunk():
    """Mixed passes (the streams' step and prompt chunks in one call): before any plain step
    is timed, the pass bounds one and the chunk doubles; after, the chunk is charged what the
    pass took beyond a plain step."""
    budget = PrefillBudget(512, max_stall=2.0)
    assert budget.tokens(decoding=True) == MIN_CHUNK
    budget.mixed(MIN_CHUNK, 0.25)
    assert budget.tokens(decoding=True) == 2 * MIN_CHUNK  # 16 in (at most) 250 ms: 32 in 500
    budget.mixed(2 * MIN_CHUNK, 0.375)  # 125 ms beyond the 250 ms bound: 128 tokens in 500
    assert budget.tokens(decoding=True) == 128
    timed = PrefillBudget(512, max_stall=2.0)
    timed.decoded(0.25)
    timed.mixed(40, 0.375)  # 125 ms beyond the 250 ms step: 40 tokens in 125 ms, 160 in 500
    assert timed.tokens(decoding=True) == 160
    timed.mixed(160, 0.25)  # no more than a plain step (noise): charged a tenth of the pass
    assert timed.tokens(decoding=True) == 512


def test_a_pass_beside_few_streams_is_charged_beyond_a_step_of_as_many_rows():
    """Steps of 16 rows take 300 ms and of 1 row 100 ms; a pass that decodes one stream and
    prefills 40 tokens in 320 ms charges its chunk 220 ms, not the 20 ms beyond the average
    step (which aimed the next chunk at the whole 512 tokens: a stall of about 30 steps for
    streams decoding beside a long prompt)."""
    budget = PrefillBudget(512, max_stall=2.0)
    for rows, seconds in ((16, 0.3), (1, 0.1)):
        budget.decoded(seconds, rows)
    budget.mixed(40, 0.32, rows=1)
    assert budget.tokens(1) == 36  # 40 tokens in 220 ms: 36 in 2 steps of 100 ms
    assert budget.tokens(16) == 109  # 2 steps of 300 ms
    assert budget.tokens(4) == 36  # 4 rows not timed: as the most rows timed below


def test_a_chunk_that_costs_a_fixed_part_climbs_to_its_target():
    """Passes that cost 40 ms plus 1 ms a token, decoding steps of 100 ms, a target of 2
    steps: the aim settles at the 160 tokens that take 200 ms, from a first pass of 16."""
    budget = PrefillBudget(512, max_stall=2.0)
    budget.decoded(0.1)
    size = 16
    for _ in range(12):
        budget.prefilled(size, 0.04 + 0.001 * size)
        size = budget.tokens(decoding=True) or 0
    assert 150 <= size <= 160


def test_the_engine_times_its_steps_for_the_budget(model):
    """Each decoding step and each prefill pass (its padded tokens) reach the scheduler's
    budget, and a step plans with the budget for streams decoding once one does (the plan
    comes first in a step, then the passes it holds are timed)."""
    calls: list[tuple[str, object]] = []

    class Recording(PrefillBudget):
        def tokens(self, decoding: int, waiting: int = 1) -> int | None:
            calls.append(("tokens", decoding > 0))
            return super().tokens(decoding, waiting)

        def decoded(self, seconds: float, rows: int = 1) -> None:
            calls.append(("decoded", (seconds > 0, rows)))

        def prefilled(self, tokens: int, seconds: float, rows: int = 1) -> None:
            calls.append(("prefilled", tokens))
            calls.append(("beside", rows))

    engine = Engine(model, max_batch=2, max_queue=2, prefill_chunk=16, prefix_cache_bytes=0)
    engine.scheduler.budget = Recording(16)
    run(engine, ["ROMEO:", PROMPTS[1]], 3)
    # step 1: 6 + 8 tokens, rows of 8; step 2: "ROMEO:" decodes, planned with the rest
    want = [("tokens", False), ("prefilled", 16), ("beside", 0), ("tokens", True)]
    assert calls[:5] == [*want, ("decoded", (True, 1))]
    left = len(model.tokenizer.encode(PROMPTS[1])) - 8  # 42: 16 + 16 + 10
    assert [n for kind, n in calls if kind == "prefilled"] == [16, 16, 16, left - 32]
    # "ROMEO:" decodes beside the middle two chunks and has its 3 tokens before the last
    assert [n for kind, n in calls if kind == "beside"] == [0, 1, 1, 0]


def test_the_first_step_that_streams_decode_in_carries_the_least_chunk(model):
    """The scheduler plans a step before its decoding pass is timed: the first step that
    streams decode in has no decoding time to size the chunk by, and takes the least chunk
    (not the whole ``prefill_chunk``, which would hold the streams for a whole pass)."""
    engine = Engine(model, max_batch=2, max_queue=2, prefill_chunk=64, prefix_cache_bytes=0)
    sizes: list[int] = []
    extend = engine.runner.batch.extend

    def logged_extend(chunks: list[tuple[Request, list[int]]]) -> torch.Tensor:
        sizes.append(len(chunks) * max(len(ids) for _, ids in chunks))
        return extend(chunks)

    engine.runner.batch.extend = logged_extend  # type: ignore[method-assign]
    both = engine.runner.batch.step_and_extend

    def logged_both(tokens: torch.Tensor, keys: list[Request], chunks: list) -> object:
        out = both(tokens, keys, chunks)
        if out is not None:  # (None: nothing ran, and extend runs)
            sizes.append(len(chunks) * max(len(ids) for _, ids in chunks))
        return out

    engine.runner.batch.step_and_extend = logged_both  # type: ignore[method-assign]
    sinks = run(engine, ["ROMEO:", PROMPTS[3][:-1]], 2)  # 6 and 80 tokens
    assert sizes[:2] == [64, MIN_CHUNK]  # 6 + 32 in rows of 32; then "ROMEO:" decodes
    long_reply = zoo.generate(model, PROMPTS[3][:-1], max_new_tokens=2, temperature=0)
    assert sinks[1].text == long_reply


@pytest.mark.parametrize("chunk", [None, 5, 16])
def test_replies_equal_generate_whole_chunked_and_cached(model, chunk):
    engine = Engine(model, max_batch=3, max_queue=8, prefill_chunk=chunk)
    for _ in range(2):  # the second time every prompt's blocks are in the cache
        sinks = run(engine, PROMPTS, 12)
        for prompt, sink in zip(PROMPTS, sinks, strict=True):
            assert sink.finish is not None and sink.finish.reason == "length"
            assert sink.text == zoo.generate(model, prompt, max_new_tokens=12, temperature=0)
    stats = engine.prefix_cache_stats()
    assert stats is not None and stats.hits == 2  # the prompts of a whole block or more


def test_a_long_prompt_enters_over_steps_while_the_streams_keep_emitting(model):
    engine = Engine(
        model, max_batch=4, max_queue=4, prefill_chunk=8, max_stall=None, prefix_cache_bytes=0
    )
    tok = model.tokenizer
    log: list[tuple[str, int]] = []  # ("step", rows) and ("extend", padded tokens), in order
    step, extend = engine.runner.batch.step, engine.runner.batch.extend

    def logged_step(tokens: torch.Tensor, keys: list[Request]) -> torch.Tensor:
        log.append(("step", len(keys)))
        return step(tokens, keys)

    def logged_extend(chunks: list[tuple[Request, list[int]]]) -> torch.Tensor:
        log.append(("extend", len(chunks) * max(len(ids) for _, ids in chunks)))
        return extend(chunks)

    both = engine.runner.batch.step_and_extend

    def logged_both(tokens: torch.Tensor, keys: list[Request], chunks: list) -> object:
        out = both(tokens, keys, chunks)
        if out is not None:  # one pass: the step's tokens, then the chunks (None: they run)
            log.append(("step", len(keys)))
            log.append(("extend", len(chunks) * max(len(ids) for _, ids in chunks)))
        return out

    engine.runner.batch.step = logged_step  # type: ignore[method-assign]
    engine.runner.batch.extend = logged_extend  # type: ignore[method-assign]
    engine.runner.batch.step_and_extend = logged_both  # type: ignore[method-assign]
    streams = [Collect(), Collect()]
    engine.submit(
        [Request(tok.encode(p), greedy(40), tok, s, ()) for p, s in zip("AB", streams, strict=True)]
    )
    with torch.inference_mode():
        for _ in range(3):
            engine.step()
        long_prompt = PROMPTS[3][:-1]  # 80 bytes: 10 chunks of 8
        late = Collect()
        engine.submit([Request(tok.encode(long_prompt), greedy(4), tok, late, ())])
        start = len(log)
        while not late.done.is_set():
            engine.step()
    during = log[start:]
    extends = [n for kind, n in during if kind == "extend"]
    assert len(tok.encode(long_prompt)) == 80
    assert len(extends) == 10 and max(extends) <= 8  # the budget, padding included
    assert during[:20:2] == [("step", 2)] * 10  # the streams got a token before each chunk
    assert late.text == zoo.generate(model, long_prompt, max_new_tokens=4, temperature=0)
    with torch.inference_mode():
        while not all(s.done.is_set() for s in streams):
            engine.step()
    for prompt, sink in zip("AB", streams, strict=True):
        assert sink.text == zoo.generate(model, prompt, max_new_tokens=40, temperature=0)


def test_a_small_cache_evicts_and_replies_stay_the_same(model):
    c = model.config
    block = 2 * c.n_layers * c.n_heads * 16 * c.head_size * 4  # bytes of 16 positions
    engine = Engine(model, max_batch=2, max_queue=8, prefix_cache_bytes=6 * block)
    stats = engine.prefix_cache_stats()
    assert stats is not None and stats.capacity_bytes == 6 * block
    prompts = PROMPTS[::-1]  # 5 + 0 + 3 + 0 blocks of prompt, and the replies'
    for _ in range(2):
        for prompt, sink in zip(prompts, run(engine, prompts, 6), strict=True):
            assert sink.text == zoo.generate(model, prompt, max_new_tokens=6, temperature=0)
    stats = engine.prefix_cache_stats()
    assert stats is not None and stats.evictions > 0 and stats.bytes <= stats.capacity_bytes


def test_a_request_cancelled_part_way_in_frees_its_slot(model):
    engine = Engine(model, max_batch=1, max_queue=2, prefill_chunk=4)
    tok = model.tokenizer
    gone, after = Collect(), Collect()
    request = Request(tok.encode(PROMPTS[3]), greedy(5), tok, gone, ())
    engine.submit([request])
    with torch.inference_mode():
        engine.step()  # admitted, its first chunk in
        assert engine.scheduler.prefilling == [request]
        request.cancel()
        engine.submit([Request(tok.encode("KING"), greedy(5), tok, after, ())])
        while not after.done.is_set():
            engine.step()
    assert gone.finish is not None and gone.finish.reason == "cancelled" and gone.pieces == []
    assert after.text == zoo.generate(model, "KING", max_new_tokens=5, temperature=0)
    assert len(engine.runner) == 0


def test_zoo_chats_turns_reuse_the_conversation_so_far(model):
    tok = model.tokenizer
    turns = Turns(model, tok)
    config = GenerationConfig(max_new_tokens=20, temperature=0, stop_ids=tuple(tok.end_ids))
    first = tok.encode("ROMEO:\nWhat light through yonder window breaks?\nJULIET:\n")
    reply = "".join(turns.stream(first, config))
    assert reply == "".join(stream_continuation(model, first, config))
    second = first + tok.encode(reply) + tok.encode("\nROMEO:\n")
    again = "".join(turns.stream(second, config))
    assert again == "".join(stream_continuation(model, second, config))
    stats = turns.stats()
    assert stats is not None and stats.hit_tokens >= (len(first) + 16) // 16 * 16 - 16
    assert stats.hit_tokens > len(first)  # the reply's own keys were kept too
    with pytest.raises(ValueError, match="exceeds the context length"):
        turns.stream([1] * 250, config)


def test_the_runner_refuses_a_chunk_that_does_not_continue_its_prompt(model):
    engine = Engine(model, max_batch=1, max_queue=1, prefix_cache_bytes=0)
    tok = model.tokenizer
    request = Request(tok.encode("ROMEO:"), greedy(2), tok, Collect(), ())
    assert engine.runner.admit(request) == 0
    with pytest.raises(ValueError, match="from 3 does not continue a prompt of 6 tokens with 0"):
        engine.runner.prefill([Chunk(request, 3, 2, False)])
