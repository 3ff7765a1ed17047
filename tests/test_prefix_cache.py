"""Chunked and batched prefill in the slot batch, and the prefix cache: a prompt entered in
chunks, several prompts entered in one left-padded pass, or a prompt whose prefix is copied
in from the cache gives the tokens (and, to float rounding, the logits) of the whole prompt
prefilled alone; rows not stepped keep their caches; the cache is bounded, evicts chains from
their ends and keeps adapters apart."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import zoo
from zoo.config import DecoderConfig
from zoo.generation import GenerationConfig, generate_ids
from zoo.nn import DecoderLM
from zoo.runtime.prefix_cache import PrefixCache
from zoo.runtime.slots import SlotBatch
from zoo.testing import small_overrides


def lively(model: torch.nn.Module, seed: int = 0) -> DecoderLM:
    """Weights of std 1: logits far apart, so no rounding flips a greedy token."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g))
    return model.eval()  # type: ignore[return-value]


MIXED = {"vocab_size": 97, "context_length": 64, "d_model": 32, "n_heads": 4, "n_kv_heads": 2,
         "n_layers": 3, "d_ff": 48, "positions": "rotary", "norm": "rmsnorm1p", "ffn": "geglu",
         "activation": "gelu_tanh", "block": "sandwich", "bias": False, "tie_embeddings": True,
         "scale_embeddings": True, "sliding_window": 3, "rope_local_theta": 10.0,
         "layer_types": ("sliding_attention", "full_attention", "sliding_attention"),
         "attn_softcap": 1.5, "final_softcap": 2.0}  # fmt: skip

MODELS = {
    "gpt2": lambda: lively(zoo.build("gpt2-124m", **small_overrides("gpt2-124m"))),  # learned
    "llama-tiny": lambda: lively(zoo.build("llama-tiny")),  # rotary, grouped-query
    "mixed": lambda: lively(DecoderLM(DecoderConfig(**MIXED))),  # windows, softcaps
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest) -> DecoderLM:
    torch.manual_seed(0)
    return MODELS[request.param]()


def alone(model: DecoderLM, prompt: list[int], n: int) -> list[int]:
    """The greedy continuation of ``prompt`` by zoo.generate's core, on its own."""
    config = GenerationConfig(max_new_tokens=n, temperature=0)
    return generate_ids(model, torch.tensor([prompt]), None, config)[0, len(prompt) :].tolist()


def prompt_of(n: int, seed: int, vocab: int = 90) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def decode(batch: SlotBatch[str], first: dict[str, torch.Tensor], n: int) -> dict[str, list[int]]:
    """``n`` greedy tokens of each sequence of ``first`` (its first logits), stepped together."""
    keys = list(first)
    got = {k: [int(first[k].argmax())] for k in keys}
    for _ in range(n - 1):
        logits = batch.step(torch.tensor([got[k][-1] for k in keys]), keys)
        for k, row in zip(keys, logits, strict=True):
            got[k].append(int(row.argmax()))
    return got


def cut(prompt: list[int], sizes: list[int]) -> list[list[int]]:
    out, at = [], 0
    for size in sizes:
        out.append(prompt[at : at + size])
        at += size
    return [*out, prompt[at:]] if at < len(prompt) else out


# -- chunked and batched prefill ---------------------------------------------------------------
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_a_prompt_in_chunks_gives_the_whole_prompts_tokens(model, data):
    n = data.draw(st.integers(2, 20), label="prompt length")
    prompt = prompt_of(n, seed=n)
    sizes = data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=5), label="chunks")
    whole = SlotBatch(model, 1, 40)
    want = whole.add("p", prompt)
    batch: SlotBatch[str] = SlotBatch(model, 1, 40)
    batch.open("p")
    for chunk in cut(prompt, sizes):
        if chunk:
            got = batch.extend([("p", chunk)])[0]
    assert batch.length("p") == n
    # chunks of other sizes sum in another float32 order (up to 1.07e-4 seen at n=20, chunks
    # [1, 1, 2]); the exactness that matters is the tokens, next
    torch.testing.assert_close(got, want, rtol=1e-4, atol=3e-4)
    assert decode(batch, {"p": got}, 6)["p"] == alone(model, prompt, 6)


def test_prompts_prefilled_together_give_each_ones_tokens(model):
    """Three prompts of other lengths and starts in one left-padded pass, in slots that are
    not the first ones (the pass gathers its rows), while another row decodes."""
    prompts = {
        "a": prompt_of(13, 1),
        "b": prompt_of(4, 2),
        "c": prompt_of(9, 3),
        "d": prompt_of(6, 4),
    }
    batch: SlotBatch[str] = SlotBatch(model, 4, 40)
    first = {"d": batch.add("d", prompts["d"])}  # row 0 decodes meanwhile
    for key in "abc":
        batch.open(key)
    batch.extend([("a", prompts["a"][:5])])  # "a" is part way in already
    d_token = int(first["d"].argmax())
    stepped = batch.step(torch.tensor([d_token]), ["d"])  # rows 1-3 ride along, untouched
    logits = batch.extend([("c", prompts["c"]), ("a", prompts["a"][5:]), ("b", prompts["b"])])
    for key, row in zip("cab", logits, strict=True):
        want = SlotBatch(model, 1, 40).add(key, prompts[key])
        torch.testing.assert_close(row, want, rtol=1e-4, atol=1e-4)
        first[key] = row
    first["d"] = stepped[0]
    got = decode(batch, first, 5)
    for key in "abc":
        assert got[key] == alone(model, prompts[key], 5), key
    assert [d_token, *got["d"]] == alone(model, prompts["d"], 6)


def test_rows_not_stepped_keep_their_caches(model):
    """A row prefilling in chunks between the steps of the rows around it."""
    p = {k: prompt_of(n, i) for i, (k, n) in enumerate({"x": 7, "y": 15, "z": 5}.items())}
    batch: SlotBatch[str] = SlotBatch(model, 3, 40)
    first = {"x": batch.add("x", p["x"])}
    batch.open("y")
    first["z"] = batch.add("z", p["z"])
    tokens = {k: [int(v.argmax())] for k, v in first.items()}
    for chunk in cut(p["y"], [4, 4, 4]):
        logits = batch.step(torch.tensor([tokens["x"][-1], tokens["z"][-1]]), ["x", "z"])
        tokens["x"].append(int(logits[0].argmax()))
        tokens["z"].append(int(logits[1].argmax()))
        last = batch.extend([("y", chunk)])[0]
    rest = decode(batch, {"y": last}, 4)
    assert rest["y"] == alone(model, p["y"], 4)
    assert tokens["x"] == alone(model, p["x"], 5) and tokens["z"] == alone(model, p["z"], 5)


def test_extend_refuses_what_does_not_fit(model):
    batch: SlotBatch[str] = SlotBatch(model, 2, 10)
    batch.open("a")
    with pytest.raises(ValueError, match="at least one chunk"):
        batch.extend([])
    with pytest.raises(ValueError, match="at most one chunk per sequence"):
        batch.extend([("a", [1]), ("a", [2])])
    batch.extend([("a", [1, 2, 3, 4, 5, 6])])
    with pytest.raises(ValueError, match="a slot holds 10 positions: no room for a new token"):
        batch.extend([("a", [1, 2, 3, 4])])  # 6 + 4 = 10 leaves none
    with pytest.raises(ValueError, match="outside the vocabulary"):
        batch.extend([("a", [10**6])])
    assert batch.length("a") == 6  # the refused chunks changed nothing
    batch.extend([("a", [1, 2, 3])])
    batch.open("b")
    batch.extend([("b", [4])])
    token = torch.tensor([5])
    batch.step(token, ["a"])  # "a" now fills its 10 positions
    with pytest.raises(ValueError, match="sequence 'a' fills its slot"):
        batch.step(token, ["b"])  # "a" rides along and could write nowhere
    with pytest.raises(ValueError, match="a filled length must be in"):
        batch.fill("a", 10)


# -- the prefix cache --------------------------------------------------------------------------
def cache_for(model: DecoderLM, blocks: int, block_size: int = 4) -> PrefixCache:
    c = model.config
    probe = PrefixCache(c.n_layers, c.n_kv_heads or c.n_heads, c.head_size, max_bytes=0,
                        block_size=block_size)  # fmt: skip
    return PrefixCache(c.n_layers, c.n_kv_heads or c.n_heads, c.head_size,
                       max_bytes=blocks * probe.block_bytes, block_size=block_size)  # fmt: skip


def test_a_cached_prefix_gives_the_tokens_of_a_miss(model):
    shared = prompt_of(13, 7)
    first, second = shared + prompt_of(3, 8), shared + prompt_of(5, 9)
    cache = cache_for(model, 16)
    batch: SlotBatch[str] = SlotBatch(model, 2, 40)
    batch.add("first", first)
    assert cache.store(first, *batch.row_cache("first")) == 4  # 16 tokens: 4 whole blocks
    batch.open("second")
    match = cache.match(second)
    assert match.length == 12  # the 3 whole blocks of the shared 13 tokens
    k, v = batch.row_cache("second")
    cache.load(match, k, v)
    for layer, source in zip(k, batch.row_cache("first")[0], strict=True):
        assert torch.equal(layer[:, :12], source[:, :12])  # a copy, bit for bit
    batch.fill("second", match.length)
    logits = batch.extend([("second", second[12:])])[0]
    assert decode(batch, {"second": logits}, 6)["second"] == alone(model, second, 6)
    stats = cache.stats()
    assert (stats.queries, stats.hits, stats.hit_tokens, stats.miss_tokens) == (1, 1, 12, 6)
    assert stats.blocks == 4 and stats.bytes == 4 * cache.block_bytes


def test_keys_computed_with_another_adapter_or_other_tokens_are_never_hit():
    cache = PrefixCache(1, 1, 2, max_bytes=10**6, block_size=2)
    rows = [torch.randn(1, 8, 2)], [torch.randn(1, 8, 2)]
    cache.store([1, 2, 3, 4], *rows, salt=0)
    assert cache.match([1, 2, 3, 4], salt=1).length == 0  # another adapter's keys
    assert cache.match([1, 2, 3, 5], salt=0).length == 2  # the second block differs
    assert cache.match([9, 2, 3, 4], salt=0).length == 0  # a later block never hits alone
    assert cache.match([1, 2, 3, 4], salt=0).length == 4
    assert cache.match([1], salt=0).length == 0  # no whole block


def test_bytes_salts_keep_clients_apart_and_never_equal_an_adapters():
    cache = PrefixCache(1, 1, 2, max_bytes=10**6, block_size=2)
    rows = [torch.randn(1, 8, 2)], [torch.randn(1, 8, 2)]
    cache.store([1, 2, 3, 4], *rows, salt=b"client a")
    assert cache.match([1, 2, 3, 4], salt=b"client b").length == 0
    assert cache.match([1, 2, 3, 4], salt=b"client a").length == 4
    zero = (0).to_bytes(8, "little", signed=True)
    cache.store([5, 6], *rows, salt=0)
    assert cache.match([5, 6], salt=zero).length == 0  # not the adapter 0's
    assert cache.match([5, 6], salt=b"").length == 0
    with pytest.raises(TypeError, match="int or bytes"):
        cache.match([5, 6], salt="text")  # type: ignore[arg-type]


def test_eviction_takes_the_least_recently_used_chains_from_their_ends():
    cache = PrefixCache(1, 1, 2, max_bytes=4 * 2 * 2 * 2 * 4, block_size=2)  # 4 blocks
    assert cache.capacity == 4
    rows = [torch.randn(1, 16, 2)], [torch.randn(1, 16, 2)]
    a, b = [1, 1, 2, 2, 3, 3], [7, 7, 8, 8, 9, 9]
    cache.store(a, *rows)
    cache.store(b, *rows)  # 3 new blocks, 1 free slot: two of a's go, its last ones
    stats = cache.stats()
    assert (stats.blocks, stats.evictions) == (4, 2)
    assert stats.bytes == stats.capacity_bytes
    assert cache.match(a).length == 2  # a's first block is still reachable
    assert cache.match(b).length == 6
    long = list(range(20, 32))  # 6 blocks, more than the cache holds
    assert cache.store(long, [torch.randn(1, 16, 2)], [torch.randn(1, 16, 2)]) == 4
    assert cache.match(long).length == 8  # its first 4 blocks: the rest found no room


@settings(max_examples=25, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 8)), max_size=30))
def test_every_block_held_is_reachable_and_the_bound_holds(ops):
    """Whatever the order of stores and lookups, the cache holds no more than its capacity
    and every block it holds is the end of a prefix some stored prompt reaches."""
    cache = PrefixCache(1, 1, 2, max_bytes=5 * 2 * 2 * 2 * 4, block_size=2)  # 5 blocks
    rows = [torch.randn(1, 32, 2)], [torch.randn(1, 32, 2)]
    stored: list[list[int]] = []
    for store, seed, blocks in ops:
        prompt = [random.Random(seed * 100 + i // 4).randrange(3) for i in range(2 * blocks)]
        if store:
            cache.store(prompt, *rows)
            stored.append(prompt)
        else:
            cache.match(prompt)
        assert cache.stats().bytes <= cache.stats().capacity_bytes
    probe = copy.deepcopy(cache)
    reachable = {tuple(p[:end]) for p in stored for end in range(2, probe.match(p).length + 1, 2)}
    assert len(reachable) == cache.stats().blocks


def test_prefix_cache_refuses_bad_settings():
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        PrefixCache(1, 1, 2, max_bytes=100, block_size=0)
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        PrefixCache(1, 1, 2, max_bytes=-1)
    empty = PrefixCache(1, 1, 2, max_bytes=0)
    assert empty.store(list(range(40)), [torch.zeros(1, 40, 2)], [torch.zeros(1, 40, 2)]) == 0
    assert empty.match(list(range(40))).length == 0
