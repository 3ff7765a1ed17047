"""zoo's one-call CPU step over a slot batch (:func:`zoo.runtime.native_block.decode_rows`,
``zoo_decode_rows_f32``), which :class:`~zoo.runtime.slots.SlotBatch` runs for continuous
batching (``zoo serve``): over joins, leaves, rows not stepped and slots filled by copy, its
logits equal the per-module pass's to 1e-5 with the same greedy tokens, every row's logits
have the bits that row has decoding alone (zoo.generate's batch-1 step), and it runs at every
step of the families the batch-1 step computes (counted), float32 and int8. Each case runs
in a child process (zoo's C kernels: a crash fails the test, not the run)."""

from __future__ import annotations

import pytest
from native_child import run_native
from test_fast_path_loads import FAMILIES, ONE_CALL

CHILD = """
import hashlib, warnings
import torch, zoo
from zoo.kernels.native_load import isa_name
from zoo.runtime import native_block, slots
from zoo.runtime.decoding import DecoderSession
from zoo.testing.reference import randomize_parameters
from zoo.testing.small import reference_overrides
warnings.simplefilter("ignore")
named, quantize = NAMED, QUANTIZE
torch.manual_seed(0)
model = zoo.build(named, **reference_overrides(named))
randomize_parameters(model)
model = model.eval()
if quantize:
    from zoo.quant.layers import quantize_
    model = quantize_(model, quantize)
steps, prefills = [], []  # whether each step's and each prompt pass's one call ran
step_call, prefill_call = slots.SlotBatch._one_call, slots.SlotBatch._extend_one_call

def counted(record, call):
    def run(*args):
        out = call(*args)
        record.append(out is not None)
        return out
    return run

slots.SlotBatch._one_call = counted(steps, step_call)
slots.SlotBatch._extend_one_call = counted(prefills, prefill_call)

def batch(one_call_steps=True, one_call_prompts=True):
    b = slots.SlotBatch(model, max_rows=4, max_len=48)
    if not one_call_steps:
        b._one_call = lambda rows, tokens: None
    if not one_call_prompts:
        b._extend_one_call = lambda rows, chunks: None
    return b

vocab = model.config.vocab_size
PROMPTS = {"a": 5, "b": 9, "c": 3, "d": 12}

def prompt(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (n,), generator=g).tolist()

def drive(batch):
    # every row's tokens so far (prompt + greedy) and every step's logits per key
    got, seen = {}, {}
    def step(keys):
        logits = batch.step(torch.tensor([got[k][-1] for k in keys]), keys)
        for key, row in zip(keys, logits):
            got[key].append(int(row.argmax()))
            seen.setdefault(key, []).append(row)
    with torch.inference_mode():
        for i, key in enumerate("abc"):
            got[key] = prompt(PROMPTS[key], i)
            got[key].append(int(batch.add(key, got[key]).argmax()))
        for _ in range(3):
            step(["a", "b", "c"])
        batch.open("d")  # row 3 prefills in two chunks while a and c decode
        got["d"] = prompt(PROMPTS["d"], 3)
        batch.extend([("d", got["d"][:6])])
        step(["a", "c"])
        got["d"].append(int(batch.extend([("d", got["d"][6:])])[0].argmax()))
        batch.remove("b")  # d moves into row 1
        for _ in range(3):
            step(["c", "d", "a"])
        batch.remove("a")
        for _ in range(2):
            step(["d"])  # a row past the first stepped alone
    return got, seen

tokens, logits = drive(batch())
counts = sum(steps), len(steps), sum(prefills), len(prefills)  # of the first drive
worst = 0.0
if not quantize:  # (int8: the per-module pass quantizes the rows together, the step each alone)
    tokens_pm, logits_pm = drive(batch(False, False))
    assert tokens == tokens_pm, (tokens, tokens_pm)
    pairs = [(x, y) for k in logits for x, y in zip(logits[k], logits_pm[k])]
    worst = max(float((x - y).abs().max() / max(1.0, float(y.abs().max()))) for x, y in pairs)
    assert worst <= 1e-5, worst
# each row prefilled whole, alone: the batch-1 session's steps on the same tokens (the batch's
# prompts prefilled as the session prefills them, by the model's own pass)
tokens_alone, logits_alone = drive(batch(True, False))
alone_equal = True
with torch.inference_mode():
    for key in "abc":
        ids, n, row_logits = tokens_alone[key], PROMPTS[key], logits_alone[key]
        session = DecoderSession(model, torch.tensor([ids[:n]]), None, n + len(row_logits))
        session.prefill()
        for i, expected in enumerate(row_logits):
            out = session.step(torch.tensor([ids[n + i]]))
            alone_equal &= torch.equal(out.reshape(-1), expected)
digest = hashlib.sha256(b"".join(x.numpy().tobytes() for k in sorted(logits) for x in logits[k]))
print("ok", *counts, int(alone_equal), f"{worst:.2e}",
      isa_name(), digest.hexdigest())
"""


def _drive(named: str, quantize: str | None, **variables: str) -> list[str]:
    """The child's figures: steps in one call, steps, prompt passes in one call, prompt
    passes, whether each row stepped with its alone bits, the largest difference from the
    per-module pass, the kernels' instruction set, a digest of every logit."""
    code = CHILD.replace("NAMED", repr(named)).replace("QUANTIZE", repr(quantize))
    (line,) = run_native(code, timeout=300, **variables)
    return line.split()[1:]


def _run(named: str, quantize: str | None) -> tuple[int, int, int, int, int]:
    ran, steps, ran_prompts, prompts, alone, *_ = _drive(named, quantize)
    return int(ran), int(steps), int(ran_prompts), int(prompts), int(alone)


#: The families the one-call step computes, and two it declines (soft caps, a window).
STEPPED = sorted(ONE_CALL | {"gemma2", "phi3"})


@pytest.mark.parametrize("family", STEPPED)
def test_the_slot_step_runs_in_one_call_and_equals_the_per_module_pass(family: str) -> None:
    ran, steps, ran_prompts, prompts, alone = _run(FAMILIES[family], None)
    if family in ONE_CALL:
        assert ran == steps == 9, (ran, steps)  # every step of the batch in one call
        assert ran_prompts == prompts == 5  # every prompt pass (short ones) too
        assert alone == 1  # each row with the bits it has decoding alone
    else:
        assert ran == ran_prompts == 0  # declined (and the per-module pass gave the same tokens)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_int8_slot_step_runs_in_one_call(family: str) -> None:
    ran, steps, ran_prompts, prompts, alone = _run(FAMILIES[family], "int8")
    assert ran == steps == 9
    assert ran_prompts == prompts == 5
    assert alone == 1


def test_each_instruction_set_steps_to_the_same_bits() -> None:
    """``ZOO_NATIVE_ISA`` forces the kernels' variant (AVX2's 4 x 2 tiles, AVX-512's 4 x 4),
    each in a child: the slot step's logits are the same bits under each."""
    runs = {isa: _drive(FAMILIES["llama"], None, ZOO_NATIVE_ISA=isa) for isa in ("avx2", "avx512")}
    if runs["avx512"][6] != "avx512":
        pytest.skip("needs zoo's native kernels on AVX-512: only AVX2's variant runs here")
    assert runs["avx2"][6] == "avx2"
    assert runs["avx2"][7] == runs["avx512"][7]


MIXED = """
import torch, zoo
from zoo.runtime import slots
from zoo.testing.reference import randomize_parameters
from zoo.testing.small import reference_overrides
torch.manual_seed(0)
model = zoo.build(NAMED, **reference_overrides(NAMED))
randomize_parameters(model)
model = model.eval()

def started():
    batch = slots.SlotBatch(model, max_rows=3, max_len=32)
    with torch.inference_mode():
        batch.add("a", [5, 6, 7])
        batch.add("b", [8, 9])
        batch.open("c")
    return batch

chunk = [3, 1, 4, 1, 5]
with torch.inference_mode():
    mixed = started()
    both = mixed.step_and_extend(torch.tensor([11, 12]), ["a", "b"], [("c", chunk)])
    apart = started()
    stepped = apart.step(torch.tensor([11, 12]), ["a", "b"])
    prefilled = apart.extend([("c", chunk)])
    again = [b.step(torch.tensor([1, 2, 3])) for b in (mixed, apart)]
assert both is not None
assert torch.equal(both[0], stepped) and torch.equal(both[1], prefilled)
assert torch.equal(again[0], again[1])  # the caches hold the same keys and values
slots.ONE_CALL_PROMPT_ROWS = len(chunk) - 1  # (one chunk: nothing padded)
late = started()
assert late.step_and_extend(torch.tensor([1, 2]), ["a", "b"], [("c", chunk)]) is None
assert [late.length(key) for key in "abc"] == [3, 2, 0]  # more prompt than one call takes: none ran
print("ok")
"""


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_step_and_a_prompt_chunk_in_one_call_equal_the_two_calls(family: str) -> None:
    assert run_native(MIXED.replace("NAMED", repr(FAMILIES[family])), timeout=300) == ["ok"]
