"""The static decoding step (the one CUDA graphs record and replay, and ``compile=True``
compiles on CPU) against the dynamic cache: same logits at every step, with left padding,
grouped-query attention, rotary positions and a sliding window; on CUDA, a graph is really
recorded and replayed; compiled, one graph serves every session of a cache size."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.quant.layers import quantize_
from zoo.runtime.decoding import (
    DecoderSession,
    StaticDecoderSession,
    check_compilable,
    check_cpp_compiler,
    start_decoding,
)
from zoo.testing import available_devices, small_overrides

CASES = {
    "learned positions": ("gpt2-124m", {}),
    "rotary, grouped-query": ("llama-tiny", {}),
    "sliding window": ("gpt2-124m", {"sliding_window": 5}),
}


def lively(name: str, device: str, **overrides) -> torch.nn.Module:
    """A small model with large weights, so greedy tokens vary (a broken step shows)."""
    torch.manual_seed(0)
    model = zoo.build(name, **{**small_overrides(name), **overrides}).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0, 1.0)
    return model.to(device)


def left_padded(vocab: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts of 7, 4 and 2 tokens, left-padded: ``(3, 7)`` ids and mask."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (3, 7), generator=g)
    keep = torch.ones(3, 7, dtype=torch.bool)
    keep[1, :3] = False
    keep[2, :5] = False
    return ids.to(device), keep.to(device)


@pytest.mark.parametrize("device", available_devices())
@pytest.mark.parametrize("case", CASES)
def test_the_static_step_gives_the_logits_of_the_dynamic_cache(case, device):
    name, overrides = CASES[case]
    model = lively(name, device, **overrides)
    ids, keep = left_padded(model.config.vocab_size, device)
    steps = 12
    with torch.inference_mode():
        dynamic = DecoderSession(model, ids, keep, ids.shape[1] + steps)
        static = StaticDecoderSession(model, ids, keep, ids.shape[1] + steps)
        expected, actual = dynamic.prefill(), static.prefill()
        tokens = []
        for i in range(steps):
            torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4, msg=f"step {i}")
            token = expected.argmax(-1)
            tokens.append(token)
            expected, actual = dynamic.step(token), static.step(token)
    assert len({int(t[0]) for t in tokens}) > 2, "degenerate model: the test would prove little"
    assert (static._graph is not None) == (device == "cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generate_on_cuda_replays_a_graph_and_matches_eager_decoding(monkeypatch):
    model = lively("gpt2-124m", "cuda")
    ids, keep = left_padded(model.config.vocab_size, "cuda")
    rows = [row[k].tolist() for row, k in zip(ids, keep, strict=True)]
    assert StaticDecoderSession.records(model, torch.device("cuda"))
    graphed = zoo.generate(model, rows, max_new_tokens=20, temperature=0)
    assert type(start_decoding(model, ids, keep, 4, cuda_graphs=False)) is DecoderSession
    monkeypatch.setenv("ZOO_CUDA_GRAPHS", "0")  # read by zoo.generate, passed down
    assert zoo.generate(model, rows, max_new_tokens=20, temperature=0) == graphed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_component_that_waits_for_the_host_gets_a_clear_error():
    """A sync inside the step cannot be recorded: the error says why and how to opt out (run
    in its own process, a failed capture may leave CUDA unusable)."""
    code = textwrap.dedent(
        """
        import torch, zoo
        model = zoo.build("gpt2-124m", n_layers=2, d_model=64, n_heads=4, d_ff=128).cuda()
        norm = model.final_norm
        forward = norm.forward
        norm.forward = lambda x: forward(x) * (x.sum().item() != 0)  # waits for the GPU
        try:
            zoo.generate(model, [[1, 2, 3]], max_new_tokens=4, temperature=0)
        except RuntimeError as exc:
            print(exc)
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "ZOO_CUDA_GRAPHS=0" in run.stdout and "wait for the host" in run.stdout, run.stderr


def test_a_score_bias_scheme_is_decoded_eagerly():
    """ALiBi's bias depends on the query position: no recorded step, a clear error if asked."""
    model = zoo.build("toy-alibi").eval()
    assert not StaticDecoderSession.records(model, torch.device("cuda"))
    ids = torch.randint(0, 257, (1, 4))
    with pytest.raises(ValueError, match="score biases"):
        StaticDecoderSession(model, ids, None, 8)


def test_stepping_past_the_cache_is_a_clear_error():
    model = lively("gpt2-124m", "cpu")
    ids = torch.randint(0, 100, (1, 3))
    with torch.inference_mode():
        session = StaticDecoderSession(model, ids, None, 4)
        session.prefill()
        session.step(torch.tensor([1]))
        with pytest.raises(ValueError, match="holds 4 positions"):
            session.step(torch.tensor([1]))


# -- compile=True (CPU) ------------------------------------------------------------------------
def _has_cpp_compiler() -> bool:
    try:
        check_cpp_compiler()
    except zoo.CompileUnavailableError:
        return False
    return True


needs_cpp_compiler = pytest.mark.skipif(
    not _has_cpp_compiler(), reason="needs a C++ compiler (for torch.compile on CPU)"
)


@needs_cpp_compiler
@pytest.mark.parametrize(
    ("case", "quantize"),
    [
        # the inner loop (-m "not slow") keeps one compiled case, the fastest (~9 s);
        # the other two (~30 s each, a cold compile) run in the default run
        pytest.param("rotary, grouped-query", None, marks=pytest.mark.slow),
        ("sliding window", None),
        pytest.param("learned positions", "int8", marks=pytest.mark.slow),
    ],
)
def test_the_compiled_step_gives_the_logits_of_the_dynamic_cache(case, quantize, fresh_dynamo):
    """Float32 steps compile to one graph: nothing breaks dynamo's trace (zoo's ctypes
    kernels would); torch.ao's int8 linears break it, as they always have, and run their
    own kernels between the graphs."""
    name, overrides = CASES[case]
    model = lively(name, "cpu", **overrides)
    if quantize is not None:
        quantize_(model, quantize)
    ids, keep = left_padded(model.config.vocab_size, "cpu")
    steps = 12
    with torch.inference_mode():
        dynamic = DecoderSession(model, ids, keep, ids.shape[1] + steps)
        compiled = StaticDecoderSession(model, ids, keep, ids.shape[1] + steps, compile=True)
        expected, actual = dynamic.prefill(), compiled.prefill()
        tokens = []
        for i in range(steps):
            # fused kernels round differently: compare at the scale of the logits
            scale = float(expected.abs().max())
            torch.testing.assert_close(actual, expected, rtol=0, atol=1e-4 * scale, msg=f"step {i}")
            token = expected.argmax(-1)
            tokens.append(token)
            expected, actual = dynamic.step(token), compiled.step(token)
    assert len({int(t[0]) for t in tokens}) > 2, "degenerate model: the test would prove little"
    assert compiled._logits is not model.logits  # the step really went through torch.compile
    assert fresh_dynamo["stats"]["unique_graphs"] >= 1, "the step was not compiled"
    if quantize is None:
        assert not fresh_dynamo["graph_break"], dict(fresh_dynamo["graph_break"])


@needs_cpp_compiler
def test_generate_with_compile_gives_the_eager_tokens_and_compiles_once_per_cache_size(
    fresh_dynamo,
):
    counters = fresh_dynamo
    model = lively("gpt2-124m", "cpu")
    ids, keep = left_padded(model.config.vocab_size, "cpu")
    rows = [row[k].tolist() for row, k in zip(ids, keep, strict=True)]
    eager = zoo.generate(model, rows, max_new_tokens=20, temperature=0)
    assert zoo.generate(model, rows, max_new_tokens=20, temperature=0, compile=True) == eager
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1, "the step was not compiled"
    # another length in the same cache bucket (7 + 30 <= 64), another session: no new graph
    longer = zoo.generate(model, rows, max_new_tokens=30, temperature=0, compile=True)
    assert counters["stats"]["unique_graphs"] == graphs
    assert [row[: len(r)] for row, r in zip(longer, eager, strict=True)] == eager


def test_compile_without_a_cpp_compiler_is_a_clear_error(capsys):
    import torch._inductor.config as inductor

    model = lively("gpt2-124m", "cpu")
    message = r"needs a C\+\+ compiler.*apt install g\+\+"
    with inductor.patch({"cpp.cxx": (None, "/nonexistent/g++")}):
        with pytest.raises(zoo.CompileUnavailableError, match=message):
            zoo.generate(model, [[1, 2, 3]], max_new_tokens=2, temperature=0, compile=True)
        with pytest.raises(zoo.CompileUnavailableError, match=message):
            start_decoding(model, torch.tensor([[1, 2, 3]]), None, 2, compile=True)
        code = main(["generate", "shakespeare-byte", "ROMEO:", "--compile"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.startswith("zoo: error: compile=True builds")
    assert err.count("\n") == 1  # one line, no traceback, and no prompt echoed before it


def test_what_compile_cannot_serve_is_a_clear_error():
    model = lively("gpt2-124m", "cpu")
    with pytest.raises(ValueError, match="on cuda decode without it"):
        check_compilable(model, torch.device("cuda"))
    with pytest.raises(ValueError, match=r"score biases.*without compile=True"):
        zoo.generate(zoo.build("toy-alibi"), [[1, 2]], max_new_tokens=2, compile=True)
    encdec = zoo.build("transformer-encdec-tiny")
    with pytest.raises(ValueError, match="cannot compile its decoding step"):
        zoo.generate(encdec, [[1, 2]], max_new_tokens=2, start_id=1, compile=True)


@needs_cpp_compiler
@pytest.mark.slow  # compiles shakespeare-byte's step (~18 s): in the default run
def test_zoo_generate_compile_prints_the_eager_text(capsys, fresh_dynamo):
    argv = ["generate", "shakespeare-byte", "ROMEO:", "--temperature", "0", "--max-new-tokens"]
    outputs = []
    for extra in ([], ["--compile"]):
        assert main([*argv, "12", *extra]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and len(outputs[0]) > len("ROMEO:") + 6
    assert fresh_dynamo["stats"]["unique_graphs"] >= 1, "the step was not compiled"
