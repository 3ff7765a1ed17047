"""LoRA training (zoo.train.train(..., adapter=zoo.LoRA(...)), zoo train BASE --lora RANK):
losses fall while the base stays bit for bit; only the adapters reach the optimizer, the
checkpoint and the run's result (<out>/adapter/, which peft loads for a family with a Hugging
Face layout); a resumed run equals an uninterrupted one; another adapter shape or another base
is refused on resume; the command line refuses what cannot work; QLoRA on an int8 base (in a
child process: quantized kernels)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import test_train
import torch

import zoo
from zoo.adapters import base_fingerprint, read_adapter
from zoo.adapters.lora import LoRA, adapter_parameters
from zoo.train import ResumeError, TrainConfig, train
from zoo.train.memory import estimate_training_memory

#: The full-training tests' small corpus, its tokenizer (fixtures) and model.
corpus, tokenizer, tiny = test_train.corpus, test_train.tokenizer, test_train.tiny

LLAMA = {"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 300,
         "context_length": 32, "d_ff": 48}  # fmt: skip
CONFIG = TrainConfig(
    steps=12, batch_size=8, lr=1e-2, min_lr=1e-3, warmup=2, eval_every=6, eval_batches=2
)


def _base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if ".lora." not in k}


def test_only_the_adapters_train_and_the_run_writes_the_adapter(corpus, tokenizer, tmp_path):
    model = tiny()
    before = _base_state(model)
    sha = base_fingerprint(model)
    out = tmp_path / "run"
    result = train(
        model, corpus, out, config=CONFIG, tokenizer=tokenizer, log=None, adapter=LoRA(rank=4)
    )
    assert result.losses[-1] < result.losses[0] - 0.1  # a random base: the adapters alone
    after = _base_state(result.model)
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # the base, bit for bit
    trainable = {n for n, p in result.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora.low." in n for n in trainable)
    assert len(dict(adapter_parameters(result.model))) == len(trainable)
    # the resumable checkpoint holds the adapters and their optimizer state, not the base
    ckpt = out / "checkpoint"
    assert not (ckpt / "model").exists() and (ckpt / "adapter.safetensors").is_file()
    import safetensors.torch

    saved = safetensors.torch.load_file(str(ckpt / "adapter.safetensors"))
    assert set(saved) == trainable
    state = safetensors.torch.load_file(str(ckpt / "state.safetensors"))
    assert {k.split("/")[1] for k in state if k.startswith("optimizer/")} == trainable
    # the result: <out>/adapter/, not a model; it records the base and fits it again
    assert result.checkpoint == out / "adapter" and not (out / "model").exists()
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in result.checkpoint.iterdir()
    }
    adapter = read_adapter(result.checkpoint, model=tiny())
    assert adapter.base.sha256 == sha and adapter.base.name == "gpt2-124m"
    assert adapter.lora.rank == 4
    trained = dict(adapter_parameters(result.model))
    for name, value in adapter.state.items():
        assert torch.equal(value, trained[name].detach()), name
    record = json.loads((out / "run.json").read_text())
    assert record["adapter"]["rank"] == 4 and record["adapter"]["base"] == "gpt2-124m"


def test_a_resumed_lora_run_equals_an_uninterrupted_one(corpus, tokenizer, tmp_path):
    config = TrainConfig(**{**CONFIG.__dict__, "checkpoint_every": 0})
    lora = LoRA(rank=2, alpha=4.0, dropout=0.1)
    whole = train(
        tiny(), corpus, tmp_path / "a", config=config, tokenizer=tokenizer, log=None, adapter=lora
    )

    def interrupt_at_6(line: str) -> None:  # SIGINT arrives at step 6's evaluation
        if line.startswith("step 6:"):
            os.kill(os.getpid(), signal.SIGINT)

    b = tmp_path / "b"
    first = train(tiny(), corpus, b, config=config, tokenizer=tokenizer, log=interrupt_at_6,
                  adapter=lora)  # fmt: skip
    assert first.interrupted and first.steps == 7
    rest = train(tiny(), corpus, b, config=config, tokenizer=tokenizer, log=None, adapter=lora)
    assert first.losses + rest.losses == whole.losses  # bit for bit
    a, c = dict(adapter_parameters(whole.model)), dict(adapter_parameters(rest.model))
    assert all(torch.equal(c[k], v) for k, v in a.items())

    # another shape, another base, or the whole model: refused, nothing trained
    refusals = [
        ({"adapter": LoRA(rank=3, alpha=4.0, dropout=0.1)}, "another shape: rank 2"),
        ({"adapter": lora, "model": tiny(seed=5)}, "another base"),
        ({}, "holds a LoRA run (rank 2)"),
    ]
    for kwargs, message in refusals:
        model = kwargs.pop("model", tiny())
        with pytest.raises(ResumeError, match=message.replace("(", r"\(").replace(")", r"\)")):
            train(model, corpus, b, config=config, tokenizer=tokenizer, log=None, **kwargs)


def test_peft_loads_the_run_adapter_of_a_hugging_face_family(corpus, tokenizer, tmp_path):
    """The run's <out>/adapter/ on a llama base: peft's PeftModel on the exported base gives
    zoo's logits."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = zoo.build("llama-tiny", **LLAMA)
    zoo.export(model, tmp_path / "hf")
    config = TrainConfig(steps=3, batch_size=4, lr=1e-2, warmup=1, eval_every=0, eval_batches=1)
    result = train(model, corpus, tmp_path / "run", config=config, tokenizer=tokenizer,
                   log=None, adapter=LoRA(rank=4, alpha=8.0))  # fmt: skip
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tuned = peft.PeftModel.from_pretrained(base, result.checkpoint).eval()
    ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = result.model.eval()(ids)
        got = tuned(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_the_memory_estimate_knows_a_frozen_base(corpus, tokenizer, tmp_path):
    from zoo.adapters.lora import attach_lora, plan_lora

    model = tiny()
    full = estimate_training_memory(model, micro_batch=2, device=torch.device("cpu"))
    attach_lora(model, plan_lora(model, LoRA(rank=4)))
    lora = estimate_training_memory(model, micro_batch=2, device=torch.device("cpu"))
    adapters = sum(p.numel() * 4 for _, p in adapter_parameters(model))
    base = sum(p.numel() * 4 for p in model.parameters()) - adapters
    tensors = len(dict(adapter_parameters(model)))  # AdamW's step count: 8 bytes a tensor
    assert (lora.weights, lora.gradients) == (adapters, adapters)
    assert lora.optimizer == 2 * adapters + 8 * tensors
    assert lora.frozen == base and full.frozen == 0
    assert lora.total < full.total and "frozen base" in lora.describe()


@pytest.mark.parametrize("mode", ["int8", "int8-weight"])
def test_the_memory_estimate_knows_a_quantized_base(mode):
    """A quantized base counts its int8 weights (buffers, or torch's packed ones at a byte
    each), about a quarter of the float ones."""
    from zoo.adapters.lora import attach_lora, plan_lora
    from zoo.quant.layers import quantize_

    cpu = torch.device("cpu")
    runs = []
    for quantize in (False, True):
        model = tiny()
        if quantize:
            quantize_(model, mode)
        attach_lora(model, plan_lora(model, LoRA(rank=4)))
        runs.append(estimate_training_memory(model, micro_batch=2, device=cpu))
    float_base, quantized = runs[0].frozen, runs[1]
    assert quantized.weights == runs[0].weights  # the adapters, float32 either way
    assert float_base / 5 < quantized.frozen < float_base / 2


def _cli(*argv: str) -> tuple[int, str]:
    from zoo.cli import main

    try:
        return main(list(argv)), ""
    except SystemExit as exc:  # argparse
        return int(exc.code or 0), ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["shakespeare-byte", "--quantize", "int8"], "--quantize go(es) with --lora"),
        (["shakespeare-byte", "--lora-targets", "attn.q"], "--lora-targets go(es) with --lora"),
        (["llama-tiny", "--lora", "4"], "llama-tiny has none"),
        (["shakespeare-byte", "--from", "shakespeare-byte", "--lora", "4"], "once"),
        (["shakespeare-byte", "--lora", "4", "--set", "n_layers=2"], "--set makes a new model"),
        (["shakespeare-byte", "--lora", "4", "--task", "classify"], "cannot go with --lora"),
        (["shakespeare-byte", "--lora", "4", "--lora-alpha", "-1"], "alpha must be positive"),
    ],
)
def test_the_command_line_refuses_what_a_lora_cannot_do(corpus, tmp_path, capsys, argv, message):
    code, _ = _cli("train", *argv, "--data", str(corpus), "--out", str(tmp_path / "o"))
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_wrong_target_lists_the_model_s_names(corpus, tmp_path, capsys):
    argv = ["shakespeare-byte", "--lora", "4", "--lora-targets", "attn.wq", "--steps", "1"]
    code, _ = _cli("train", *argv, "--data", str(corpus), "--out", str(tmp_path / "o"))
    assert code == 2
    err = capsys.readouterr().err
    assert "['attn.wq'] name no linear layer" in err and "attn.qkv" in err and "ffn.fc" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # a child process loads torch, the shipped model, and quantizes it
def test_qlora_from_the_command_line_on_an_int8_base(corpus, tmp_path):
    """zoo train shakespeare-byte --lora 4 --quantize int8 (a child process: int8 kernels):
    the adapter records the float base's fingerprint, and the loss falls."""
    out = tmp_path / "run"
    argv = ["train", "shakespeare-byte", "--lora", "4", "--quantize", "int8",
            "--data", str(corpus), "--out", str(out), "--steps", "6", "--batch-size", "2",
            "--warmup", "1", "--lr", "1e-2", "--eval-every", "0",
            "--eval-batches", "1"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "zoo.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"adapter: {out / 'adapter'}" in done.stdout
    base = zoo.load("shakespeare-byte")
    adapter = read_adapter(out / "adapter", model=base)
    assert adapter.base.sha256 == base_fingerprint(base)
    assert adapter.base.name == "shakespeare-byte"
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").open()]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert json.loads((out / "run.json").read_text())["adapter"]["quantize"] == "int8"


@pytest.mark.slow  # three processes start torch; two train under torchrun
def test_two_gloo_processes_train_the_same_lora_as_one(corpus, tokenizer, tmp_path):
    """DDP with a frozen base: the base stays out of the reducer, the adapters start from the
    run's seed on every rank, and 2 processes x 2 sequences take one process's steps."""
    zoo.save(tiny(), tmp_path / "base", tokenizer=tokenizer)
    argv = ["-m", "zoo.cli", "train", str(tmp_path / "base"), "--lora", "4",
            "--data", str(corpus), "--steps", "4", "--batch-size", "4", "--warmup", "1",
            "--lr", "1e-2", "--eval-every", "0", "--eval-batches", "1"]  # fmt: skip
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = [
        subprocess.Popen(
            [sys.executable, *prefix, *argv, "--out", str(tmp_path / name)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name, prefix in (("one", []), ("two", torchrun))
    ]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]
    one, two = (
        [json.loads(line)["loss"] for line in (tmp_path / name / "metrics.jsonl").open()]
        for name in ("one", "two")
    )
    assert one == pytest.approx(two, abs=1e-5)
    a, b = (read_adapter(tmp_path / name / "adapter", model=tiny()) for name in ("one", "two"))
    for key, value in a.state.items():
        torch.testing.assert_close(b.state[key], value, atol=1e-5, rtol=0)


def test_fsdp_with_a_lora_is_refused_on_several_processes_only():
    from zoo.train.loop import _check_strategy
    from zoo.train.world import World

    cpu = torch.device("cpu")
    _check_strategy(LoRA(), "fsdp", World(0, 1, cpu))  # one process: nothing to shard
    _check_strategy(LoRA(), "ddp", World(0, 2, cpu))
    _check_strategy(None, "fsdp", World(0, 2, cpu))
    with pytest.raises(ValueError, match="does not shard with --strategy fsdp"):
        _check_strategy(LoRA(), "fsdp", World(0, 2, cpu))


def test_a_family_declares_its_default_targets():
    from zoo.plugin.current import get_registry
    from zoo.plugin.specs import ArchitectureSpec
    from zoo.train.adapter import default_targets

    assert get_registry().architecture("mixtral").lora_targets == ("attn.qkv", "attn.proj")
    assert default_targets(tiny()) == ("attn.qkv", "attn.proj", "ffn.fc", "ffn.proj")
    for bad in ("attn.qkv", (), ("attn.qkv", "")):
        with pytest.raises(ValueError, match="lora_targets must be a non-empty sequence"):
            ArchitectureSpec(name="x", config="m:C", model="m:M", lora_targets=bad)


def test_a_model_that_already_carries_an_adapter_is_refused_pointing_to_merge():
    from zoo.train.adapter import adapt

    model = tiny()
    adapt(model, LoRA(rank=2))
    with pytest.raises(ValueError, match=r"already carries a LoRA adapter.*zoo merge"):
        adapt(model, LoRA(rank=2))
