"""Reading GGUF: what zoo refuses by name (a key it does not read, a tensor it has no place
for, an architecture it does not know), the sha256 of a Hub file, and ``quantize=`` keeping
q4_0's blocks as zoo's int4 exactly and saying so where it quantizes again."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import zoo
from zoo.errors import CheckpointError, StateDictMismatchError
from zoo.testing.reference import randomize_parameters
from zoo.testing.small import reference_overrides

gguf = pytest.importorskip("gguf")

NAMED = "smollm2-135m-instruct"
#: Shapes the int4 kernels take (128 input features, rows by 16).
SIZES = {"d_model": 128, "d_ff": 256, "vocab_size": 1024}


@pytest.fixture(scope="module")
def model() -> Any:
    torch.manual_seed(0)
    built = zoo.build(NAMED, **(reference_overrides(NAMED) | SIZES))
    randomize_parameters(built)
    return built.eval()


@pytest.fixture(scope="module")
def f32(model: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.export(model, tmp_path_factory.mktemp("f32") / "m.gguf", layout="gguf")


def rewrite(
    source: Path,
    target: Path,
    *,
    add: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    arch: str | None = None,
) -> Path:
    """``source`` copied to ``target`` with metadata added (``add``), tensors left out
    (``drop``) or another ``general.architecture`` (a trusted file: gguf's own reader)."""
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), arch or reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture",):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), field.types[0])
    for key, value in (add or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, value)
    for tensor in reader.tensors:
        if tensor.name in drop:
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape))
        writer.add_tensor(tensor.name, tensor.data, raw_shape=shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


#: Each k-quant's block: (bytes, the offsets of its float16 scales). Random bytes elsewhere are
#: valid codes; the scales are set small so that the weights stay of order one.
K_QUANTS = {
    "Q2_K": (84, (80, 82)),
    "Q3_K": (110, (108,)),
    "Q4_K": (144, (0, 2)),
    "Q5_K": (176, (0, 2)),
    "Q6_K": (210, (208,)),
}


def _blocks(kind: str, rows: int, columns: int, rng: Any) -> Any:
    """``rows`` rows of random ``kind`` blocks, ``(rows, bytes per row)`` uint8."""
    import numpy as np

    size, scales = K_QUANTS[kind]
    blocks = rng.integers(0, 256, (rows * columns // 256, size), dtype=np.uint8)
    for offset in scales:
        blocks[:, offset : offset + 2] = np.frombuffer(np.float16(0.0002).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("kind", ["Q4_1", "Q5_0", "Q5_1", *K_QUANTS])
def test_every_block_type_reads_as_transformers_reads_it(tmp_path: Path, kind: str) -> None:
    """A Llama file whose matrices are ``kind`` blocks (the legacy types quantized by the
    ``gguf`` package, the k-quants random blocks: it has no quantizer for them) gives
    transformers' GGUF reader's logits within 1e-4."""
    import numpy as np

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    sizes = reference_overrides(NAMED) | {"d_model": 256, "d_ff": 512, "vocab_size": 1024}
    built = zoo.build(NAMED, **sizes)
    randomize_parameters(built)
    f32 = zoo.export(built.eval(), tmp_path / "f32.gguf", layout="gguf")
    reader = gguf.GGUFReader(str(f32))
    path = tmp_path / f"{kind}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            writer.add_key_value(key, field.contents(), field.types[0])
    qtype, rng = getattr(gguf.GGMLQuantizationType, kind), np.random.default_rng(0)
    for tensor in reader.tensors:
        values = np.array(tensor.data)
        if values.ndim != 2:
            writer.add_tensor(tensor.name, values)
        elif kind in K_QUANTS:
            blocks = _blocks(kind, *values.shape, rng)
            writer.add_tensor(tensor.name, blocks, raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ids = torch.tensor([[5, 9, 2, 7, 1, 3, 8]])
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        want = theirs(ids).logits
        got = zoo.load(path, tokenizer=False)(ids)
    assert zoo.checkpoint.gguf.read.read_gguf(path).types["blk.0.ffn_up.weight"] == kind.lower()
    assert float(want.abs().max()) > 0.3  # logits of order one: the blocks count
    assert float((got - want).abs().max()) <= 1e-4


def test_the_rewrite_helper_changes_nothing_by_itself(f32: Path, tmp_path: Path) -> None:
    copy = rewrite(f32, tmp_path / "copy.gguf")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(
            zoo.load(copy, tokenizer=False)(ids), zoo.load(f32, tokenizer=False)(ids)
        )


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"add": {"llama.rope.scaling.factor": 8}}, r"llama\.rope\.scaling\.factor, which zoo"),
        ({"add": {"split.count": 3}}, r"split\.count, which zoo does not read"),
        ({"add": {"llama.rope.scaling.type": "linear"}}, r"rope\.scaling\.type is 'linear'"),
        ({"add": {"llama.rope.dimension_count": 16}}, r"rope\.dimension_count is 16, but the"),
        ({"arch": "bert"}, r"architecture 'bert' is not one zoo reads \(it reads gemma2, "),
    ],
)
def test_what_zoo_does_not_read_is_refused_by_name(
    f32: Path, tmp_path: Path, change: dict[str, Any], says: str
) -> None:
    bad = rewrite(f32, tmp_path / "bad.gguf", **change)
    with pytest.raises(CheckpointError, match=says):
        zoo.load(bad, tokenizer=False)


def test_a_tensor_zoo_has_no_place_for_is_named(f32: Path, tmp_path: Path) -> None:
    import numpy as np

    reader = gguf.GGUFReader(str(f32))
    bad = tmp_path / "extra.gguf"
    writer = gguf.GGUFWriter(str(bad), "llama")
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            writer.add_key_value(key, field.contents(), field.types[0])
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data))
    writer.add_tensor("blk.0.attn_sinks.weight", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError, match=r"no place for: blk\.0\.attn_sinks\.weight"):
        zoo.load(bad, tokenizer=False)


def test_a_missing_tensor_is_a_mismatch_naming_it(f32: Path, tmp_path: Path) -> None:
    bad = rewrite(f32, tmp_path / "short.gguf", drop=("blk.1.ffn_down.weight",))
    with pytest.raises(StateDictMismatchError, match=r"blocks\.1\.ffn\.proj\.weight"):
        zoo.load(bad, tokenizer=False)


def test_q4_0_loads_as_int4_exactly(model: Any, tmp_path: Path) -> None:
    """zoo's int4 groups are q4_0's blocks: quantize='int4' keeps the file's values (the
    kernel's own float32 rounding apart), where a float weight quantized to int4 is far off.
    A head tied to the embedding is int8 in every mode, so the warning names it."""
    from zoo.quant.layers import Int4Linear

    untied = zoo.build(NAMED, **(reference_overrides(NAMED) | SIZES))
    untied.load_state_dict(model.state_dict(), strict=False)
    untied.head.weight = torch.nn.Parameter(model.tok_emb.weight.detach().flip(0).clone())
    ids = torch.tensor([[5, 9, 2, 7, 1, 3]])
    for tied, source in ((False, untied), (True, model)):
        path = zoo.export(source, tmp_path / f"q4-{tied}.gguf", layout="gguf", type="q4_0")
        floats = zoo.load(path, tokenizer=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            int4 = zoo.load(path, tokenizer=False, quantize="int4")
        said = [str(w.message) for w in caught if "quantized again" in str(w.message)]
        layers = [m for m in int4.modules() if isinstance(m, Int4Linear)]
        assert len(layers) == (8 if tied else 9) and all(layer.lossless for layer in layers)
        with torch.no_grad():
            worst = float((int4(ids) - floats(ids)).abs().max())
        if tied:
            assert len(said) == 1 and "2 layer(s)" in said[0] and "tok_emb, head" in said[0]
        else:
            assert not said and worst <= 1e-4, worst
    f32 = zoo.export(untied, tmp_path / "f.gguf", layout="gguf")
    again = zoo.load(f32, tokenizer=False, quantize="int4")
    with torch.no_grad():
        requantized = float((again(ids) - zoo.load(f32, tokenizer=False)(ids)).abs().max())
    assert requantized > 100 * 1e-4


def test_a_q8_0_file_quantized_to_int8_says_it_was_quantized_again(
    model: Any, tmp_path: Path
) -> None:
    path = zoo.export(model, tmp_path / "q8.gguf", layout="gguf", type="q8_0")
    with pytest.warns(
        RuntimeWarning, match=r"holds q8_0 blocks, but \d+ layer\(s\) of zoo's 'int8'"
    ):
        zoo.load(path, tokenizer=False, quantize="int8")


# -- a GGUF file of a Hub repo ----------------------------------------------------------------
def test_a_hub_gguf_file_loads_pinned_and_checked(f32: Path, local_hub: Any) -> None:
    """``zoo.load("hf:org/name", gguf="file.gguf")``: that file alone, checked against the
    Hub's LFS sha256; one flipped byte is refused, the file deleted from the cache, and the
    next load fetches it whole."""
    data = f32.read_bytes()
    local_hub.add_files("org/gguf-only", {"model-f32.gguf": data, "README.md": b"# a model"})
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        want = zoo.load(f32, tokenizer=False)(ids)
        got = zoo.load("hf:org/gguf-only", gguf="model-f32.gguf", tokenizer=False)(ids)
    assert torch.equal(got, want)
    local_hub.corrupt_file("org/gguf-only", "model-f32.gguf", times=1)
    from zoo.checkpoint.files import forget_verified

    forget_verified()
    _evict_cached(local_hub)
    with pytest.raises(zoo.errors.ChecksumMismatchError, match=r"deleted from the Hugging Face"):
        zoo.load("hf:org/gguf-only", gguf="model-f32.gguf", tokenizer=False)
    with torch.no_grad():
        again = zoo.load("hf:org/gguf-only", gguf="model-f32.gguf", tokenizer=False)(ids)
    assert torch.equal(again, want)


def _evict_cached(local_hub: Any) -> None:
    """Forget the download the first load made, so the next one fetches the file again."""
    import shutil

    import huggingface_hub

    shutil.rmtree(huggingface_hub.constants.HF_HUB_CACHE, ignore_errors=True)


@pytest.mark.parametrize(
    ("source", "gguf_name", "says"),
    [
        ("hf:org/gguf-only", "../../etc/passwd.gguf", "plain names separated by '/'"),
        ("hf:org/gguf-only", "/abs/model.gguf", "plain names separated by '/'"),
        ("hf:org/gguf-only", "model.safetensors", "ending .gguf"),
        ("hf:org/gguf-only", "missing.gguf", r"has no missing\.gguf \(its GGUF files: m"),
        ("org/gguf-only", "model-f32.gguf", "names a file of a Hub repo"),
    ],
)
def test_a_hub_gguf_name_is_checked(
    f32: Path, local_hub: Any, source: str, gguf_name: str, says: str
) -> None:
    local_hub.add_files("org/gguf-only", {"model-f32.gguf": f32.read_bytes()})
    with pytest.raises((ValueError, zoo.errors.ZooError), match=says):
        zoo.load(source, gguf=gguf_name, tokenizer=False)


# -- writing: all or nothing --------------------------------------------------------------------
KILLED = """
import sys, torch, zoo
model = zoo.build("gpt2-124m", n_layers=12, dropout=0.0)
print("writing", flush=True)
zoo.export(model, sys.argv[1], layout="gguf")
"""


def test_a_killed_write_leaves_the_file_as_it_was(model: Any, tmp_path: Path) -> None:
    """kill -9 in the middle of writing: the destination is the earlier file, whole, and the
    next write removes the partial file left beside it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    target = zoo.export(model, tmp_path / "m.gguf", layout="gguf")
    before = target.read_bytes()
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(target)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "writing"
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".m.gguf.*.partial")) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert target.read_bytes() == before and list(tmp_path.glob(".m.gguf.*.partial"))
    zoo.export(model, target, layout="gguf", type="q8_0")
    assert not list(tmp_path.glob(".m.gguf.*.partial"))
    assert zoo.load(target, tokenizer=False).config == zoo.load(f32_copy(before, tmp_path)).config


def f32_copy(data: bytes, tmp_path: Path) -> Path:
    path = tmp_path / "copy.gguf"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_file_honours_the_umask(model: Any, tmp_path: Path, umask: int) -> None:
    import os
    import stat

    old = os.umask(umask)
    try:
        path = zoo.export(model, tmp_path / "m.gguf", layout="gguf")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


@pytest.mark.parametrize(
    ("named", "change", "says"),
    [
        ("mistral-7b-v0.3", {"sliding_window": 16},
         r"sliding_window is 16: llama\.cpp's 'llama' holds none"),
        ("gemma-2-2b-it", {"head_dim": 32}, r"query_pre_attn_scalar is 256, not the head width 32"),
        ("gemma-3-1b-it", {"head_dim": 32, "attn_scale": 32**-0.5, "layer_types": None,
                           "layer_pattern": ("sliding_attention", "full_attention")},
         r"llama\.cpp's 'gemma3' slides all layers but one in every 6"),
    ],
)  # fmt: skip
def test_what_llama_cpp_cannot_compute_is_not_written(
    tmp_path: Path, named: str, change: dict[str, Any], says: str
) -> None:
    model = zoo.build(named, **(reference_overrides(named) | change))
    with pytest.raises(CheckpointError, match=says):
        zoo.export(model, tmp_path / "m.gguf", layout="gguf")
    assert not list(tmp_path.iterdir())  # nothing written, no partial file


def test_a_tokenizer_zoo_cannot_build_leaves_the_model_loadable(f32: Path, tmp_path: Path) -> None:
    """llama.cpp's T5 files carry a unigram vocabulary (``tokenizer.ggml.model = "t5"``) zoo
    does not build: the weights load, with a warning and the reason in tokenizer_error."""
    path = rewrite(f32, tmp_path / "t5-vocab.gguf", add={"tokenizer.ggml.model": "t5"})
    with pytest.warns(UserWarning, match=r"tokenizer\.ggml\.model.*'t5'.*without a tokenizer"):
        model = zoo.load(path)
    assert model.tokenizer is None and "t5" in str(model.tokenizer_error)
