"""Quantization on PyTorch's kernels (dynamic int8, weight-only int8 and int4): layers close
to float, a tied head stored once, accuracy measured on the trained shakespeare-byte, and a
quantized load that never makes the float weights resident."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import resources
from pathlib import Path

import pytest
import torch

import zoo
from zoo.nn import Linear
from zoo.quant.layers import Int4Linear, Int8Embedding, Int8Linear, dynamic_int8, quantize_


@pytest.mark.parametrize(
    ("cls", "tolerance"),
    [(dynamic_int8, 0.03), (Int8Linear.from_linear, 0.01), (Int4Linear, 0.15)],
)
def test_a_quantized_layer_stays_close_to_the_float_one(cls, tolerance):
    torch.manual_seed(0)
    layer = Linear(256, 384)
    x = torch.randn(2, 5, 256)
    with torch.no_grad():
        want, got = layer(x), cls(layer)(x)
    assert got.shape == want.shape == (2, 5, 384)
    error = float((got - want).norm() / want.norm())
    assert error < tolerance, error


@pytest.mark.parametrize("mode", ["int8", "int8-weight"])
def test_no_float_matrix_is_left_and_a_tied_embedding_is_int8_too(mode):
    model = zoo.build("gpt2-124m", n_layers=2, d_model=64, n_heads=2, d_ff=256).eval()
    ids = torch.randint(0, 50257, (1, 12))
    with torch.no_grad():
        want = model(ids)
        quantize_(model, mode)
        got = model(ids)
    assert isinstance(model.tok_emb, Int8Embedding)
    assert not any(isinstance(m, (Linear, torch.nn.Embedding)) for m in model.modules())
    if mode == "int8-weight":  # the head reads the embedding's int8 rows: one copy
        assert isinstance(model.head, Int8Linear) and model.tok_emb.qweight is model.head.qweight
    assert float((got - want).norm() / want.norm()) < 0.05


def test_a_bad_mode_is_a_clear_error():
    with pytest.raises(
        ValueError, match="quantize must be one of int8, int8-weight, int4, got 'int3'"
    ):
        zoo.load("shakespeare-byte", quantize="int3")


@pytest.fixture(scope="module")
def validation() -> torch.Tensor:
    data = resources.files("zoo_plugins.shakespeare").joinpath("data/tinyshakespeare.txt")
    text = Path(str(data)).read_bytes()
    held_out = torch.tensor(list(text[int(len(text) * 0.9) :][: 32 * 129]))
    return held_out.view(32, 129)  # 32 windows of context + 1 bytes


@pytest.mark.parametrize(
    ("mode", "agreement", "loss_change"),
    [
        ("int8", 0.97, 0.02),
        ("int8-weight", 0.98, 0.01),
        pytest.param("int4", 0.9, 0.06, marks=pytest.mark.slow),  # ~14 s of int4 matmuls
    ],
)
def test_quantized_shakespeare_agrees_with_float32(validation, mode, agreement, loss_change):
    """Measured, not assumed: top-1 agreement with the float32 model and the held-out loss
    change on the trained model (benchmarks/eval_quantize.py does the whole split)."""
    inputs, targets = validation[:, :-1], validation[:, 1:]

    def run(model):
        with torch.no_grad():
            logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits.argmax(-1), float(loss)

    top, loss = run(zoo.load("shakespeare-byte"))
    q_top, q_loss = run(zoo.load("shakespeare-byte", quantize=mode))
    assert float((q_top == top).float().mean()) >= agreement
    assert abs(q_loss - loss) <= loss_change, (loss, q_loss)


# int8-weight grows by 0.37-0.40x here and once 0.57x in CI (file pages the kernel read ahead
# count until they are released): 0.65 leaves that room and still fails at the float model's 1x
@pytest.mark.parametrize(
    ("mode", "bound"),
    [("int8", 0.85), pytest.param("int8-weight", 0.65, marks=pytest.mark.slow)],  # ~11 s each
)
def test_a_quantized_load_never_holds_the_float_weights(tmp_path, mode, bound):
    """The float32 checkpoint is memory-mapped and each weight's pages are given back once it
    is quantized: the process's peak memory grows by about the int8 model (PyTorch's dynamic
    int8 layers keep two int8 copies, packed and plain), never by the float one."""
    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", n_layers=6, d_model=768, n_heads=12, d_ff=3072)
    zoo.save(model, tmp_path / "ckpt")
    float_mb = sum(p.numel() * 4 for p in {id(p): p for p in model.parameters()}.values()) / 2**20
    code = textwrap.dedent(
        f"""
        import json, resource, torch, zoo

        def peak():  # this process's own high-water mark (ru_maxrss includes the parent's)
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        torch.ones(1)
        base = peak()
        model = zoo.load({str(tmp_path / "ckpt")!r}, quantize={mode!r}, tokenizer=False)
        zoo.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=4, temperature=0)
        peak = peak()
        print(json.dumps({{"grew": peak - base}}))
        """
    )
    # zoo's one-row int8 kernel reads a plain copy of the int8 weights beside FBGEMM's packed
    # one (zoo.kernels.native_int8): off here, so the bound measures the float pages alone
    env = {**os.environ, "ZOO_NATIVE_KERNELS": "0"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    grew = json.loads(run.stdout.strip().splitlines()[-1])["grew"]
    assert grew < bound * float_mb, (grew, float_mb)  # the float weights alone would be 1x


def test_zoo_generate_quantize(capsys):
    from zoo.cli import main

    argv = ["generate", "shakespeare-byte", "ROMEO:", "--max-new-tokens", "20", "--temperature",
            "0", "--quantize", "int8"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")
