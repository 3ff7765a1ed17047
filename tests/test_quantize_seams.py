"""A quantized load through every checkpoint layout, in every mode, in a child process: a
layout whose transform concatenates tensors (q/k/v fused from three) hands the quantizer heap
memory, not the memory-mapped file, and giving those pages back to the OS corrupted the
allocator (``malloc(): unaligned tcache chunk``, segfaults). A crash is a failed case here."""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from forkserver import ForkServer

import zoo
from zoo._lazy import resolve
from zoo.quant.layers import QUANTIZE_MODES

#: Architectures whose zoo-layout load is covered here too (the newer decoders' zoo layout is
#: the same code path as llama's; their own layouts are what differ).
ZOO_LAYOUT = {"gpt2", "gpt1", "llama"}

_FAMILY = {"n_layers": 2, "d_model": 128, "n_heads": 4, "n_kv_heads": 2, "d_ff": 256,
           "vocab_size": 512, "context_length": 64}  # fmt: skip

#: Architectures whose quantized error on these random weights is twice the others': norms
#: after each branch (OLMo-2, Gemma) bring every branch to full scale, so a per-tensor
#: activation scale (int8) or a group scale (int4) leaves the small values fewer steps;
#: transformers' own classes under torch.ao's dynamic int8 have the same error (OLMo-2:
#: 0.089 against zoo's 0.088).
BRANCH_NORMED = {"olmo2", "gemma2", "gemma3"}

_ENCDEC = {"n_encoder_layers": 2, "n_decoder_layers": 2, "d_model": 128, "n_heads": 4,
           "d_ff": 256, "vocab_size": 512, "context_length": 64}  # fmt: skip

_ALTERNATING = {"layer_pattern": ("sliding_attention", "full_attention"), "sliding_window": 4}

#: A small model of each architecture that declares a layout (width 128: int4's kernels take it).
SMALL = {
    "gpt2": ("gpt2-124m", {"n_layers": 2, "d_model": 128, "n_heads": 4, "d_ff": 256}),
    "gpt1": ("gpt1", {"n_layers": 2, "d_model": 128, "n_heads": 4, "d_ff": 512}),
    "llama": ("llama-tiny", {"d_model": 128, "d_ff": 256}),
    "qwen2": ("qwen2.5-0.5b-instruct", _FAMILY),
    "qwen3": ("qwen3-0.6b", {**_FAMILY, "head_dim": 64}),
    "mistral": ("mistral-7b-v0.3", _FAMILY),
    "mixtral": ("mixtral-tiny", {"d_model": 128, "d_ff": 256, "n_experts": 2}),
    "gpt-neox": (
        "pythia-160m",
        {"n_layers": 2, "d_model": 128, "n_heads": 4, "d_ff": 256, "vocab_size": 512},
    ),
    "phi3": ("phi-3-mini-4k-instruct", _FAMILY),
    "olmo2": ("olmo-2-1b-instruct", _FAMILY),
    "gemma2": ("gemma-2-2b-it", {**_FAMILY, "head_dim": 32, **_ALTERNATING}),
    "gemma3": ("gemma-3-1b-it", {**_FAMILY, "head_dim": 32, **_ALTERNATING}),
    # encoder-decoders (no named model: their configs, at these sizes)
    **{
        arch: (f"zoo_plugins.{module}.config:{cls}", _ENCDEC)
        for arch, module, cls in (
            ("marian", "marian", "MarianConfig"),
            ("bart", "bart", "BartConfig"),
            ("mbart", "mbart", "MBartConfig"),
            ("t5", "t5", "T5Config"),
        )
    },
}

CHILD = textwrap.dedent(
    """
    import json, sys, warnings, torch, zoo
    warnings.simplefilter("error", RuntimeWarning)  # ordinary weights: no "saturate" warning
    folder, modes = sys.argv[1], sys.argv[2:]
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])

    def logits(model):  # an encoder-decoder reads the ids as source and target
        return model(ids, ids) if model.is_encoder_decoder else model(ids)

    with torch.no_grad():
        want = logits(zoo.load(folder, tokenizer=False))
        for mode in modes:
            print("case", mode, flush=True)
            got = logits(zoo.load(folder, tokenizer=False, quantize=mode))
            error = float((got - want).norm() / want.norm())
            print(json.dumps({"mode": mode, "error": error}), flush=True)
    """
)


@pytest.fixture(scope="module")
def children() -> Iterator[ForkServer]:
    """One interpreter that has imported torch and zoo; each case runs in a child forked from
    it: a process of its own (a crash still fails only its case), without paying those imports
    again (2 s or more each on 2 cores)."""
    server = ForkServer("import json, sys, warnings, torch, zoo\n")
    yield server
    server.close()


def _run_child(
    server: ForkServer, code: str, args: list[str], folder: Path
) -> subprocess.CompletedProcess[str]:
    """``code`` in a child of ``server`` with ``sys.argv[1:]`` = ``args``, as ``subprocess.run``
    would run it: its stdout and stderr (kept in ``folder``, whatever the child wrote before
    it ended or crashed) and exit code (``-N`` for signal N)."""
    folder.mkdir()
    out, err = folder / "stdout", folder / "stderr"
    redirect = "os.dup2(os.open({!r}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), {})\n"
    prologue = (
        f"import os, sys\nsys.argv = {['-c', *args]!r}\n"
        + redirect.format(str(out), 1)
        + redirect.format(str(err), 2)
    )
    child = server.start(prologue + code)
    try:
        returncode = child.wait(timeout=300)
    finally:
        child.kill()
    return subprocess.CompletedProcess(args, returncode, out.read_text(), err.read_text())


def _layouts() -> list[tuple[str, str]]:
    """(architecture, layout) for every layout of every installed architecture, plus zoo's."""
    registry = zoo.get_registry()
    return [
        (arch, layout)
        for arch in sorted(SMALL)
        for layout in [
            *(["zoo"] if arch in ZOO_LAYOUT else []),
            *sorted(registry.architecture(arch).checkpoint_layouts),
        ]
    ]


def test_every_declared_layout_is_covered():
    """A new architecture with a layout zoo loads a folder of (one that reads and writes a
    config.json) must join SMALL, so its layout is tested here; a layout of keys alone (the
    toy plugin's) is no load path."""
    registry = zoo.get_registry()
    declaring = {
        name
        for name in registry.architectures()
        for layout in registry.architecture(name).checkpoint_layouts
        if registry.architecture(name).checkpoint_layout(layout).config_to_foreign is not None
    }
    assert declaring <= set(SMALL), declaring - set(SMALL)


@pytest.mark.parametrize(("arch", "layout"), _layouts())
def test_quantized_load_through_a_layout(arch, layout, tmp_path, children):
    name, sizes = SMALL[arch]
    torch.manual_seed(0)
    if ":" in name:  # a config class, for the families without a named model
        name, sizes = resolve(name)(**sizes), {}
    model = zoo.build(name, **sizes).eval()
    folder = tmp_path / "ckpt"
    if layout == "zoo":
        zoo.save(model, folder)
    else:
        zoo.export(model, folder, layout=layout)
    run = _run_child(children, CHILD, [str(folder), *QUANTIZE_MODES], tmp_path / "child")
    lines = run.stdout.splitlines()
    started = [line.split()[1] for line in lines if line.startswith("case ")]
    assert run.returncode == 0, (
        f"{layout} crashed or failed (exit {run.returncode}) in quantize={started[-1:]}:\n"
        f"{run.stderr[-2000:]}"
    )
    results = [json.loads(line) for line in lines if line.startswith("{")]
    assert [r["mode"] for r in results] == list(QUANTIZE_MODES)
    for r in results:  # close to the float model (int4: groups of 32 with 4 bits)
        bound = (0.2 if r["mode"] == "int4" else 0.05) * (2 if arch in BRANCH_NORMED else 1)
        assert r["error"] < bound, (layout, r)


def test_release_pages_leaves_heap_memory_alone():
    """Heap memory (what a layout's torch.cat gives) is never handed to madvise: its values
    survive, and so does the allocator."""
    from zoo.kernels.pages import release_pages

    tensor = torch.arange(1 << 20, dtype=torch.float32)
    release_pages(tensor)
    assert torch.equal(tensor, torch.arange(1 << 20, dtype=torch.float32))


def test_release_pages_gives_back_a_file_mapping(tmp_path: Path):
    """A tensor memory-mapped from a weights file (as zoo reads them) is recognised as a file
    mapping and its pages are given back (its values, read again from the file, unchanged);
    the same bytes copied to the heap are not."""
    from safetensors.torch import save_file

    from zoo.checkpoint.files import read_safetensors
    from zoo.kernels.pages import in_file_mapping, release_pages

    want = torch.arange(1 << 20, dtype=torch.float32)
    save_file({"w": want}, tmp_path / "w.safetensors")
    tensor = read_safetensors(tmp_path / "w.safetensors")[0]["w"]
    size = tensor.numel() * tensor.element_size()
    assert in_file_mapping(tensor.data_ptr(), tensor.data_ptr() + size)
    copy = tensor.clone()
    assert not in_file_mapping(copy.data_ptr(), copy.data_ptr() + size)
    release_pages(tensor)
    assert torch.equal(tensor, want)


EXTREME = textwrap.dedent(
    """
    import sys, warnings, torch, zoo
    from zoo.quant.layers import QUANTIZE_MODES
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
    folder, names = sys.argv[1], sys.argv[2:]
    with torch.no_grad():
        want = zoo.load(folder, tokenizer=False)(ids)
        for mode in QUANTIZE_MODES:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = zoo.load(folder, tokenizer=False, quantize=mode)(ids)
            # where the float model's outputs are not finite, neither are the quantized ones
            assert got.shape == want.shape, mode
            assert bool(torch.isfinite(got).all()) <= bool(torch.isfinite(want).all()), mode
            said = " ".join(str(w.message) for w in caught if w.category is RuntimeWarning)
            named = "saturate" in said and all(name in said for name in names)
            print("ok", mode, "named" if named else "silent", flush=True)
    """
)


def test_weights_of_3e38_quantize_run_and_warn_in_every_mode(tmp_path, children):
    """Weights at float32's edge overflow the float model to NaN; the quantized model gives
    NaN too rather than FBGEMM's raw ``RuntimeError: In ChooseQuantizationParams``, and
    quantizing warns, naming the weights, in every mode: a whole matrix of ±3e38 (its
    dequantized products overflow float32) and a single 3e38 among ordinary weights (its
    row overflows for inputs past 1.1)."""
    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", n_layers=2, d_model=128, n_heads=4, d_ff=256)
    with torch.no_grad():
        model.blocks[0].ffn.fc.weight.fill_(3e38)
        model.blocks[0].ffn.fc.weight[::2] = -3e38
        model.blocks[1].attn.proj.weight[3, 5] = 3e38
    zoo.save(model, tmp_path / "ckpt")
    names = ["blocks.0.ffn.fc.weight", "blocks.1.attn.proj.weight"]
    run = _run_child(children, EXTREME, [str(tmp_path / "ckpt"), *names], tmp_path / "child")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [w for m in QUANTIZE_MODES for w in ("ok", m, "named")]


def test_nan_activations_give_nan_from_the_dynamic_int8_layer():
    from zoo.nn import Linear
    from zoo.quant.layers import dynamic_int8

    layer = dynamic_int8(Linear(64, 32))
    out = layer(torch.full((2, 64), float("nan")))
    assert out.shape == (2, 32) and bool(out.isnan().all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_ordinary_weights_quantize_without_a_warning(dtype):
    """No false alarm: a random model in each dtype (in float16 the check leaves inputs a
    headroom of 4: a row's absolute sum may reach 1.6e4) and the trained shakespeare-byte
    quantize in every mode without a warning."""
    import copy
    import warnings

    from zoo.quant.layers import quantize_

    models = [zoo.build("gpt2-124m", n_layers=1, d_model=128, n_heads=4, d_ff=256)]
    if dtype == torch.float32:
        models.append(zoo.load("shakespeare-byte", tokenizer=False))
    for model in models:
        for mode in QUANTIZE_MODES:
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                quantize_(copy.deepcopy(model).to(dtype), mode)


@pytest.mark.parametrize("mode", QUANTIZE_MODES)
def test_saturating_weights_are_named_apart_from_nan_ones(mode):
    """On a built model (zoo.quantize_, as ``--quantize --random`` and the loads use it): a
    NaN weight and a ±3e38 one get one warning each, each naming its own tensor."""
    from zoo.quant.layers import quantize_

    model = zoo.build("gpt2-124m", n_layers=1, d_model=128, n_heads=4, d_ff=256).eval()
    with torch.no_grad():
        model.blocks[0].ffn.proj.weight[0, 0] = float("nan")
        model.blocks[0].attn.qkv.weight[7] = -3e38
    with pytest.warns(RuntimeWarning) as caught:
        quantize_(model, mode)
    said = sorted(str(w.message) for w in caught)
    assert len(said) == 2, said
    assert "NaN" in said[0] and "(blocks.0.ffn.proj.weight)" in said[0]
    assert f"saturate when quantized to {mode} (blocks.0.attn.qkv.weight)" in said[1]


@pytest.mark.parametrize("mode", QUANTIZE_MODES)
def test_non_finite_weights_are_named_in_every_mode(mode):
    from zoo.quant.layers import quantize_

    model = zoo.build("gpt2-124m", n_layers=1, d_model=128, n_heads=4, d_ff=256).eval()
    with torch.no_grad():
        model.blocks[0].ffn.proj.weight[0, 0] = float("nan")
    with pytest.warns(RuntimeWarning, match=r"blocks\.0\.ffn\.proj\.weight"):
        quantize_(model, mode)


@pytest.mark.parametrize("mode", QUANTIZE_MODES)
def test_a_plugins_torch_linear_layers_are_quantized_and_swapped_too(mode):
    """A plugin's model built of plain ``torch.nn.Linear`` (the same parameters and forward as
    ``zoo.nn.Linear``) is quantized layer for layer as the zoo-built one, and the oneDNN swap
    takes its layers too; a subclass zoo does not know stays float and is named."""
    import copy

    from torch import nn

    from zoo.nn import Linear
    from zoo.nn.linear import use_onednn
    from zoo.quant.layers import quantize_

    ours = zoo.build("gpt2-124m", n_layers=1, d_model=128, n_heads=4, d_ff=256).eval()
    theirs = copy.deepcopy(ours)
    layers = [m for m in theirs.modules() if type(m) is Linear]
    for layer in layers:
        layer.__class__ = nn.Linear
    assert use_onednn(copy.deepcopy(theirs)) in (0, len(layers))  # 0: a torch without oneDNN
    ids = torch.tensor([[5, 17, 3, 99]])
    quantize_(ours, mode)
    quantize_(theirs, mode)
    assert not any(isinstance(m, nn.Linear) for m in theirs.modules())
    with torch.no_grad():
        assert torch.equal(theirs(ids), ours(ids))

    class Doubled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    other = zoo.build("gpt2-124m", n_layers=1, d_model=128, n_heads=4, d_ff=256).eval()
    other.blocks[0].ffn.fc.__class__ = Doubled
    with pytest.warns(RuntimeWarning, match=r"1 linear layer\(s\) of a torch\.nn\.Linear "
                      r"subclass zoo does not know stay torch\.float32 \(blocks\.0\.ffn\.fc "
                      r"\(Doubled\)\)"):  # fmt: skip
        quantize_(other, mode)
    assert type(other.blocks[0].ffn.fc) is Doubled
