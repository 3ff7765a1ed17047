"""A LoRA run's memory: the estimate counts the adapters from their plan,
with their gradients, AdamW's two moments and their step tensors, and a run that cannot hold
them is refused before one is allocated (``--lora 2000000`` once grew to 19.8 GB and was killed);
an allocation that fails anyway is one line, not a traceback."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest
import test_train
import torch

import zoo
from zoo.adapters import per_part
from zoo.adapters.lora import LoRA, attach_lora, plan_lora
from zoo.errors import InsufficientMemoryError
from zoo.train import TrainConfig
from zoo.train.lora_memory import check_lora_plan, lora_shape
from zoo.train.memory import estimate_training_memory, out_of_memory_refused
from zoo.train.start import optimizer

corpus = test_train.corpus
CPU = torch.device("cpu")
LLAMA = {"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 300,
         "context_length": 32, "d_ff": 48}  # fmt: skip
GPT2 = {"d_model": 32, "n_layers": 2, "n_heads": 4, "vocab_size": 300, "context_length": 32,
        "d_ff": 64, "dropout": 0.0}  # fmt: skip


def _capped(gib: float) -> None:  # the child's address space: a refusal must come first
    limit = int(gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _zoo_train(tmp_path, corpus, *flags: str, env: dict[str, str] | None = None):
    argv = ["train", "shakespeare-byte", "--data", str(corpus), "--out", str(tmp_path / "o"),
            "--steps", "1", "--eval-batches", "1", *flags]  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "zoo.cli", *argv],
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=lambda: _capped(3),
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def test_a_huge_rank_is_refused_before_its_adapters_are_allocated(corpus, tmp_path):
    """zoo train shakespeare-byte --lora 65536 (the largest rank the command line takes)
    under a 3 GiB address space: exit 2, the figures and a rank that fits, nothing allocated
    (before: a RuntimeError traceback there; --lora 2000000 grew to 19.8 GB and was killed by
    the kernel on a 23 GB machine)."""
    done = _zoo_train(tmp_path, corpus, "--lora", "65536")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "The LoRA of rank 65536 on 24 part(s) trains 1,207,959,552 parameters" in done.stderr
    assert "AdamW state" in done.stderr and "fits (--lora " in done.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # a child process loads torch and allocates until its cap: 5-10 s
def test_an_allocation_that_fails_is_one_line(corpus, tmp_path):
    """With the check skipped (ZOO_ALLOW_LARGE=1) the adapters' allocation fails under the
    cap: one line naming what failed and what to do, exit 2 (before: a traceback, exit 1)."""
    done = _zoo_train(tmp_path, corpus, "--lora", "65536", env={"ZOO_ALLOW_LARGE": "1"})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "zoo: error: training ran out of memory" in done.stderr
    assert "a smaller --lora rank" in done.stderr


def test_out_of_memory_from_torch_becomes_the_error_and_others_pass_through():
    message = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes."
    refused = pytest.raises(InsufficientMemoryError, match=r"ran out of memory.*you tried")
    with refused, out_of_memory_refused():
        raise RuntimeError(message)
    with pytest.raises(InsufficientMemoryError, match=r"\(MemoryError\)"), out_of_memory_refused():
        raise MemoryError
    with pytest.raises(RuntimeError, match="shapes"), out_of_memory_refused():
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")


def _held_after_one_step(model: torch.nn.Module) -> int:
    """Bytes of the trainable parameters, their gradients and AdamW's state after a step."""
    adamw = optimizer(model, TrainConfig())
    ids = torch.randint(300, (2, 16))
    model(ids).float().square().mean().backward()
    adamw.step()
    trainable = [p for p in model.parameters() if p.requires_grad]
    state = [t for s in adamw.state.values() for t in s.values() if torch.is_tensor(t)]
    tensors = [*trainable, *(p.grad for p in trainable if p.grad is not None), *state]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("name", ["gpt2-124m", "llama-tiny"])
@pytest.mark.parametrize("rank", [1, 8, 40])
@pytest.mark.parametrize("targets", [None, ("attn.qkv",), ("attn.q", "ffn.proj"), ("head",)])
def test_the_planned_estimate_covers_what_the_run_allocates(name, rank, targets):
    """Over ranks (one above the width), targets and a fused or split qkv: the estimate made
    from the plan, before any adapter exists, is at least the trainable parameters, their
    gradients and AdamW's state allocated after a step, and the same once attached."""
    overrides = GPT2 if name == "gpt2-124m" else LLAMA
    if targets == ("attn.q", "ffn.proj") and name == "gpt2-124m":
        targets = ("attn.qkv", "ffn.proj")  # gpt2 adapts its qkv whole
    torch.manual_seed(0)
    model = zoo.build(name, **overrides)
    lora = LoRA(rank=rank, targets=targets)
    plans = plan_lora(model, lora, per_part=per_part(model))
    planned = estimate_training_memory(
        model, micro_batch=2, device=CPU, lora=lora_shape(model, plans)
    )
    attach_lora(model, plans)
    held = _held_after_one_step(model)
    adapter_shape = lora_shape(model, plans, attached=True)
    attached = estimate_training_memory(model, micro_batch=2, device=CPU, lora=adapter_shape)
    counted = planned.weights + planned.gradients + planned.optimizer
    assert counted >= held > 0
    assert (attached.weights, attached.activations) == (planned.weights, planned.activations)
    assert planned.frozen == attached.frozen


def test_a_plan_that_cannot_fit_is_refused_and_names_a_rank_that_does():
    model = zoo.build("llama-tiny", **LLAMA)
    plans = plan_lora(model, LoRA(rank=100_000))
    config = TrainConfig(batch_size=2)
    with pytest.raises(InsufficientMemoryError, match=r"rank 100000 on 14 part\(s\)") as refused:
        check_lora_plan(model, plans, config, CPU, available=2 * 10**9)
    fitting = int(str(refused.value).split("(--lora ")[1].split(")")[0])
    assert fitting & (fitting - 1) == 0  # a power of two
    check_lora_plan(model, plan_lora(model, LoRA(rank=fitting)), config, CPU, available=2 * 10**9)
    assert not any(p.requires_grad is False for p in model.parameters())  # nothing attached


def test_a_quantized_plan_counts_the_base_as_it_will_be_held():
    model = zoo.build("llama-tiny", **LLAMA)
    plans = plan_lora(model, LoRA(rank=4))
    float_base = lora_shape(model, plans).frozen or 0
    int8 = lora_shape(model, plans, quantize="int8").frozen or 0
    int4 = lora_shape(model, plans, quantize="int4").frozen or 0
    assert int4 < int8 < float_base / 2
