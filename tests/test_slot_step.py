"""The static slot batch step (:mod:`zoo.runtime.slot_step`: padded to a few shapes, recorded as
CUDA graphs on CUDA, compiled on CPU with ``compile=True``) against the plain
:class:`SlotBatch` step: the same greedy tokens over joins, leaves, rows not stepped (a prompt
prefilled in chunks, a slot filled by copy), free slots and shapes that change; the shapes
it runs in; which batch :func:`slot_batch` picks."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_static_decoding import needs_cpp_compiler

import zoo
from zoo.adapters.lora import LoRA, adapter_state, attach_lora, plan_lora
from zoo.adapters.lora_bank import attach_bank
from zoo.runtime.slot_step import StaticSlotBatch, row_bucket, slot_batch, span_bucket
from zoo.runtime.slots import SlotBatch
from zoo.testing import small_overrides

TINY = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "vocab_size": 300}
MODELS = {
    "learned positions": ("gpt2-124m", TINY),
    "rotary, grouped-query": ("llama-tiny", {"context_length": 256}),
    "sliding window": ("mistral-7b-v0.3", {"sliding_window": 5, "context_length": 256}),
}


def lively(name: str, device: str = "cpu", **overrides: Any) -> torch.nn.Module:
    """A small model with weights of std 1: greedy tokens vary and their logits are far apart
    (a broken step shows, and no rounding flips an argmax)."""
    torch.manual_seed(0)
    overrides = {**small_overrides(name), **overrides} if name != "gpt2-124m" else overrides
    model = zoo.build(name, **overrides).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g))
    return model.to(device)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(1, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def drive(batch: SlotBatch[str]) -> tuple[dict[str, list[int]], list[torch.Tensor]]:
    """A serving-like run: rows join, leave, wait while a prompt is prefilled in chunks (a
    row past the last one stepped: padding when the rows are bucketed), one slot is filled
    by copying another's prompt, and a long prompt takes the positions read past 64. Returns
    each sequence's greedy tokens and every step's logits."""
    got: dict[str, list[int]] = {}
    seen: list[torch.Tensor] = []

    def step(keys: list[str]) -> None:
        logits = batch.step(torch.tensor([got[k][-1] for k in keys]), keys)
        seen.append(logits)
        for key, row in zip(keys, logits, strict=True):
            got[key].append(int(row.argmax()))

    with torch.inference_mode():
        for key, n in (("a", 5), ("b", 9), ("c", 3)):
            got[key] = [int(batch.add(key, prompt(n, len(got))).argmax())]
        for _ in range(3):
            step(["a", "b", "c"])
        long = prompt(70, 7)
        batch.open("d")  # row 3: prefilled in chunks while a and c decode (rows 0-2 run)
        for start in range(0, 60, 20):
            batch.extend([("d", long[start : start + 20])])
            step(["a", "c"])
        got["d"] = [int(batch.extend([("d", long[60:])])[0].argmax())]
        batch.remove("b")  # d moves into row 1
        for _ in range(3):
            step(["a", "d", "c"])
        batch.open("e")  # its prompt's first 5 tokens copied from a's slot
        keys, values = batch.row_cache("e")
        source = batch.row_cache("a")
        for mine, theirs in zip((*keys, *values), (*source[0], *source[1]), strict=True):
            mine[:, :5] = theirs[:, :5]
        batch.fill("e", 5)
        got["e"] = [int(batch.extend([("e", [7, 8])])[0].argmax())]
        for _ in range(3):
            step(["e", "a"])  # a's row is 0, e's is 3: rows 1 and 2 wait
        for key in ("a", "c"):
            batch.remove(key)
        for _ in range(2):
            step(["e", "d"])  # two rows left
        batch.remove("d")
        for _ in range(2):
            step(["e"])  # one
    return got, seen


@pytest.mark.parametrize("case", MODELS)
def test_the_static_step_gives_the_plain_steps_tokens(case):
    name, overrides = MODELS[case]
    model = lively(name, **overrides)
    plain, plain_logits = drive(SlotBatch(model, max_rows=5, max_len=160))
    static = StaticSlotBatch(model, max_rows=5, max_len=160)
    shapes: list[tuple[int, int]] = []
    run = static._run

    def spy(tokens: torch.Tensor, lengths: torch.Tensor, span: int) -> torch.Tensor:
        shapes.append((len(tokens), span))
        return run(tokens, lengths, span)

    static._run = spy
    tokens, logits = drive(static)
    assert tokens == plain
    for i, (a, b) in enumerate(zip(logits, plain_logits, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3, msg=f"step {i}")  # rounding
    assert len({t for row in plain.values() for t in row}) > 8, "degenerate model"
    # 3 rows run as 4, positions read are 64, then 128 with d's long prompt
    assert set(shapes) == {(4, 64), (4, 128), (2, 128), (1, 64)}
    assert static.shapes() == [(r, s) for r in (1, 2, 4, 5) for s in (64, 128, 160)]


def test_buckets_are_powers_of_two_within_the_limits():
    assert [row_bucket(n, 6) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    assert [span_bucket(n, 300) for n in (1, 64, 65, 129, 257, 300)] == [64, 64, 128, 256, 300, 300]
    assert span_bucket(5, 32) == 32
    small = StaticSlotBatch(lively("gpt2-124m", **TINY), 3, 40)
    assert small.shapes() == [(1, 40), (2, 40), (3, 40)]


def test_slot_batch_picks_the_static_step_where_it_applies():
    model = lively("gpt2-124m", **TINY)
    assert type(slot_batch(model, 2)) is SlotBatch  # CPU without compile: eager
    with pytest.raises(ValueError, match="without compile=True"):
        slot_batch(model, 2, before_forward=lambda rows: None, compile=True)


def test_rows_with_lora_adapters_step_eagerly():
    """Which adapter a row applies is picked on the host: a recorded step would freeze it."""
    model = lively("gpt2-124m", **TINY)
    donor = copy.deepcopy(model)
    plans = plan_lora(donor, LoRA(rank=2))
    attach_lora(donor, plans)
    adapter = SimpleNamespace(plans=plans, state=adapter_state(donor))
    attach_bank(model, {"one": adapter})
    with pytest.raises(ValueError, match="LoRA adapters"):
        StaticSlotBatch(model, 2)
    assert type(slot_batch(model, 2)) is SlotBatch


# -- compile=True (CPU) and CUDA graphs --------------------------------------------------------
@pytest.mark.slow  # compiles one shape (about 20 s on 2 idle cores, a cold compile cache)
@needs_cpp_compiler
def test_the_compiled_step_gives_the_plain_steps_tokens():
    model = lively("gpt2-124m", **TINY)
    prompts = {"a": prompt(4, 1), "b": prompt(9, 2)}
    results = []
    for batch in (SlotBatch(model, 2, 64), slot_batch(model, 2, 64, compile=True)):
        got = {}
        with torch.inference_mode():
            for key, ids in prompts.items():
                got[key] = [int(batch.add(key, ids).argmax())]
            for _ in range(8):
                keys = ["a", "b"]
                logits = batch.step(torch.tensor([got[k][-1] for k in keys]), keys)
                for key, row in zip(keys, logits, strict=True):
                    got[key].append(int(row.argmax()))
        results.append(got)
    assert type(batch) is StaticSlotBatch and batch._run != batch._forward_rows  # compiled
    assert results[0] == results[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", MODELS)
def test_on_cuda_the_step_replays_graphs_and_gives_the_plain_steps_tokens(case):
    name, overrides = MODELS[case]
    model = lively(name, "cuda", **overrides)
    static = slot_batch(model, max_rows=5, max_len=160)
    assert type(static) is StaticSlotBatch
    assert type(slot_batch(model, 5, cuda_graphs=False)) is SlotBatch
    plain, _ = drive(SlotBatch(model, max_rows=5, max_len=160))
    tokens, _ = drive(static)
    assert tokens == plain
    assert static._graphs, "no CUDA graph was recorded"
