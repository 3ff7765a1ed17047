"""A training run that cannot fit is refused before its first step, with the figure and
settings that fit (the README quickstart once grew to 19 GB and was OOM-killed)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import zoo
import zoo.train.memory
from zoo.errors import InsufficientMemoryError
from zoo.tokenizers import SubwordBPE
from zoo.train import TrainConfig, train
from zoo.train.memory import check_training_memory, estimate_training_memory

CPU = torch.device("cpu")
GiB = 1024**3


def test_the_readme_quickstart_is_refused_on_a_24_gb_machine():
    """`zoo train gpt2-124m --data texts/ --out runs/mine --set n_layers=4`: batch 16 of 1024
    tokens, attention dropout on the CPU (score matrices), a 50,257-id vocabulary."""
    model = zoo.build("gpt2-124m", device="meta", n_layers=4)
    with pytest.raises(InsufficientMemoryError) as caught:
        check_training_memory(model, TrainConfig(), CPU, available=24 * GiB)
    message = str(caught.value)
    assert "needs about 24.3 GB" in message and "25.8 GB is available on cpu" in message
    assert "logits 6.6 GB" in message and "attention scores 12.9 GB" in message
    assert "--batch-size 16 --grad-accum 2" in message
    assert "--set context_length=512" in message and "ZOO_ALLOW_LARGE=1" in message


def test_settings_that_fit_are_suggested_and_do_fit():
    model = zoo.build("gpt2-124m", device="meta", n_layers=4)
    check_training_memory(model, TrainConfig(batch_size=16, grad_accum=2), CPU, available=24 * GiB)
    check_training_memory(model, TrainConfig(batch_size=8), CPU, available=24 * GiB)


def test_a_small_config_passes_and_the_override_skips(monkeypatch):
    small = zoo.build(
        "gpt2-124m", device="meta", n_layers=4, n_heads=4, d_model=128, d_ff=512, context_length=64
    )
    estimate = check_training_memory(small, TrainConfig(batch_size=12), CPU, available=24 * GiB)
    assert estimate.total < 1 * GiB
    huge = zoo.build("gpt2-124m", device="meta", n_layers=4)
    with pytest.raises(InsufficientMemoryError, match="too large for this machine"):
        check_training_memory(huge, TrainConfig(), CPU, available=10**6)
    monkeypatch.setenv("ZOO_ALLOW_LARGE", "1")
    check_training_memory(huge, TrainConfig(), CPU, available=10**6)


def test_fsdp_shards_and_processes_share_the_batch():
    model = zoo.build("gpt2-124m", device="meta", n_layers=4)
    alone = estimate_training_memory(model, micro_batch=16, device=CPU)
    shard = estimate_training_memory(model, micro_batch=4, device=CPU, shards=4)
    assert shard.weights * 4 == alone.weights and shard.logits * 4 == alone.logits
    cuda = estimate_training_memory(model, micro_batch=16, device=torch.device("cuda"))
    assert cuda.attention == 0  # flash / memory-efficient kernels keep no score matrix


def test_train_checks_before_the_first_step(monkeypatch, tmp_path):
    data = tmp_path / "text.txt"
    data.write_text("to be or not to be, that is the question. " * 200)
    model = zoo.build("gpt2-124m", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=300)
    monkeypatch.setattr(zoo.train.memory, "available_memory", lambda device: 10**6)
    with pytest.raises(InsufficientMemoryError, match="training gpt2-124m"):
        train(
            model,
            data,
            tmp_path / "run",
            config=TrainConfig(steps=2),
            tokenizer=SubwordBPE.train([data.read_text()], 300),
            log=None,
        )
    assert not (tmp_path / "run" / "data").exists()  # refused before the data was prepared


MEASURE = textwrap.dedent(
    """
    import json, sys, torch, zoo
    from zoo.train import TrainConfig
    from zoo.train.start import optimizer as _optimizer
    from zoo.train.steps import loss_of as _loss

    def status(field):  # this process's own figures (ru_maxrss includes the parent's
        for line in open("/proc/self/status"):  # high-water mark from before the exec)
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    overrides, batch = json.loads(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    base = status("VmRSS:")
    model = zoo.build("gpt2-124m", **overrides).train()
    optimizer = _optimizer(model, TrainConfig())
    for _ in range(2):
        ids = torch.randint(model.config.vocab_size, (batch, model.config.context_length))
        loss = _loss(model, {"input_ids": ids}, torch.roll(ids, -1, 1), torch.device("cpu"))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print(status("VmHWM:") - base)
    """
)


@pytest.mark.slow  # a child process imports torch and trains two steps: 5-15 s
def test_the_estimate_is_within_half_again_of_a_measured_peak():
    overrides = {"n_layers": 2, "d_model": 256, "n_heads": 4, "d_ff": 1024, "context_length": 256}
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(overrides), "4"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    measured = int(run.stdout.split()[-1])
    model = zoo.build("gpt2-124m", device="meta", **overrides)
    estimated = estimate_training_memory(model, micro_batch=4, device=CPU).total
    assert measured / 1.5 <= estimated <= measured * 1.5, (estimated, measured)
