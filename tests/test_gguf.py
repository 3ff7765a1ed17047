"""GGUF both ways, on a small random model of every family llama.cpp has.

For each family and type, zoo writes the model as llama.cpp's converter would, and then:

- **the reference**: ``transformers`` on the same weights exported to their Hugging Face
  layout, each weight the GGUF file quantizes first quantized and dequantized by the ``gguf``
  package along its GGUF rows (llama.cpp's own quantizers; float32 files compare as they
  are). zoo loading the file must give its logits within 1e-4;
- **transformers' GGUF reader** (``from_pretrained(..., gguf_file=...)``, an implementation
  of llama.cpp's layout independent of zoo's), for the families it reads: the same file must
  give it the same logits within 1e-4, so the file is what llama.cpp writes and reads.

The q8_0 and q4_0 blocks are also compared byte for byte with ggml's reference quantizers,
written out here from their definition.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

import zoo
from zoo.testing.reference import randomize_parameters
from zoo.testing.small import reference_overrides

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

#: family -> (named model, values beyond the kit's small geometry). Where transformers' GGUF
#: reader does not read a key llama.cpp writes, the value is its default: Gemma's heads 256
#: wide (query_pre_attn_scalar, which llama.cpp takes as the head width), Qwen3's 128 (it reads
#: no key_length), GPT-2's 1024 positions and 50257 tokens (it reads neither key), Phi-3's
#: vocabulary holding its default pad id 32000. Gemma 3's layers slide as llama.cpp's fixed
#: pattern says.
_GEMMA = {"head_dim": 256, "attn_scale": 256**-0.5}
_SIX = ("sliding_attention",) * 5 + ("full_attention",)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("smollm2-135m-instruct", {}),
    "mistral": ("mistral-7b-v0.3", {}),
    "mixtral": ("mixtral-tiny", {}),
    "qwen2": ("qwen2.5-0.5b-instruct", {}),
    "qwen3": ("qwen3-0.6b", {"head_dim": 128}),
    "phi3": ("phi-3-mini-4k-instruct", {"vocab_size": 32064}),
    "gemma2": ("gemma-2-2b-it", _GEMMA),
    "gemma3": ("gemma-3-1b-it", _GEMMA | {"layer_types": None, "layer_pattern": _SIX}),
    "olmo2": ("olmo-2-1b-instruct", {}),
    "gpt2": ("gpt2-124m", {"context_length": 1024, "vocab_size": 50257}),
    "gpt-neox": ("pythia-160m", {}),
}
#: The families transformers' GGUF reader reads, and the positions it is compared on: it reads
#: no phi3.attention.sliding_window, so Phi-3 is compared within its window of 5.
TRANSFORMERS_READS = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "gpt2"}
WITHIN = {"phi3": 5}
TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")
ATOL = 1e-4


@dataclasses.dataclass
class Family:
    model: Any
    hf_folder: Path
    ids: torch.Tensor


class Families:
    """Each family's small random model and its Hugging Face export, made once per module."""

    def __init__(self, root: Path) -> None:
        self.root, self.made = root, {}

    def __getitem__(self, name: str) -> Family:
        if name not in self.made:
            named, extra = CASES[name]
            torch.manual_seed(0)
            model = zoo.build(named, **(reference_overrides(named) | extra))
            randomize_parameters(model)
            model.eval()
            folder = zoo.export(model, self.root / name)
            ids = torch.randint(0, model.config.vocab_size, (2, 11), generator=_seeded(1))
            self.made[name] = Family(model, folder, ids)
        return self.made[name]


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Families:
    return Families(tmp_path_factory.mktemp("families"))


_ROUTERS = ("mlp.gate.weight", "block_sparse_moe.gate.weight")


def _quantize_like_the_file(hf_model: Any, kind: str, conv1d: bool) -> None:
    """Each weight the GGUF writer quantizes (every tensor of two or more dimensions but the
    position table and a mixture's router), quantized and dequantized by the ``gguf`` package
    along its GGUF rows, in place (a row its blocks do not divide: float16, as llama.cpp)."""
    import numpy as np

    qtype = getattr(gguf.GGMLQuantizationType, kind.upper())
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if param.ndim < 2 or "wpe" in name or name.endswith(_ROUTERS):
                continue  # (a mixture's experts: (E, out, in) tensors, quantized by rows)
            transposed = conv1d and any(k in name for k in ("c_attn", "c_proj", "c_fc"))
            data = (param.T if transposed else param).detach().float().contiguous().numpy()
            kind_used = qtype if data.shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16
            back = gguf.quants.dequantize(gguf.quants.quantize(data, kind_used), kind_used)
            tensor = torch.from_numpy(np.ascontiguousarray(back, dtype=np.float32))
            param.copy_(tensor.T if transposed else tensor)


def _hf_logits(family: Family, kind: str, name: str) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        family.hf_folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    if kind != "f32":
        _quantize_like_the_file(model, kind, conv1d=name == "gpt2")
    with torch.no_grad():
        return model(family.ids).logits


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_zoo_reads_what_it_writes_as_llama_cpp_lays_it_out(
    families: Families, tmp_path: Path, name: str, kind: str
) -> None:
    family = families[name]
    path = zoo.export(family.model, tmp_path / f"{name}-{kind}.gguf", layout="gguf", type=kind)
    loaded = zoo.load(path, tokenizer=False)
    with torch.no_grad():
        got = loaded(family.ids)
    reference = _hf_logits(family, kind, name)
    worst = float((got - reference).abs().max())
    assert worst <= ATOL, f"{name} {kind}: zoo's load of its GGUF is {worst:.3g} off"
    if name not in TRANSFORMERS_READS:
        return
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    positions = WITHIN.get(name, family.ids.shape[1])
    with torch.no_grad():
        other = theirs(family.ids[:, :positions]).logits
    worst = float((got[:, :positions] - other).abs().max())
    assert worst <= ATOL, f"{name} {kind}: transformers' GGUF reader is {worst:.3g} off"


# -- q8_0 and q4_0 blocks, byte for byte ------------------------------------------------------
def _ggml_q8_0(rows: Any) -> bytes:
    """ggml's ``quantize_row_q8_0_ref``: per 32 weights, ``d = max|x| / 127`` (float16) and
    ``round(x / d)`` (C's roundf: halves away from zero), computed in float32."""
    import numpy as np

    x = rows.reshape(-1, 32).astype(np.float32)
    d = np.abs(x).max(axis=1) / np.float32(127)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    scaled = (x * inverse[:, None]).astype(np.float64)  # the float32 product, rounded as C does
    q = np.trunc(scaled + np.copysign(0.5, scaled)).astype(np.int8)
    return b"".join(
        d16.tobytes() + qs.tobytes() for d16, qs in zip(d.astype(np.float16), q, strict=True)
    )


def _ggml_q4_0(rows: Any) -> bytes:
    """ggml's ``quantize_row_q4_0_ref``: per 32 weights, ``d = -max / 8`` where ``max`` is the
    first weight of largest magnitude (float16), codes ``min(15, int8(x / d + 8.5))``, two per
    byte (weight ``j`` low, ``j + 16`` high)."""
    import numpy as np

    x = rows.reshape(-1, 32).astype(np.float32)
    first = np.abs(x).argmax(axis=1)
    d = x[np.arange(len(x)), first] / np.float32(-8)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    codes = np.minimum(15, np.trunc(x * inverse[:, None] + np.float32(8.5))).astype(np.uint8)
    packed = codes[:, :16] | (codes[:, 16:] << 4)
    return b"".join(
        d16.tobytes() + qs.tobytes() for d16, qs in zip(d.astype(np.float16), packed, strict=True)
    )


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_blocks_are_byte_equal_to_ggml_reference_quantizers(
    families: Families, tmp_path: Path, kind: str
) -> None:
    """Every quantized tensor of the file, against ggml's reference quantizer on the same
    float32 weights as llama.cpp lays them out (Llama's permuted q and k rows included)."""
    from zoo.checkpoint.gguf.header import read_header
    from zoo.checkpoint.gguf.read import read_gguf

    family = families["llama"]
    path = zoo.export(family.model, tmp_path / "m.gguf", layout="gguf", type=kind)
    f32 = zoo.export(family.model, tmp_path / "f.gguf", layout="gguf", type="f32")
    floats = {t.name: t for t in read_header(f32).tensors}
    reference = {"q8_0": _ggml_q8_0, "q4_0": _ggml_q4_0}[kind]
    raw, data = path.read_bytes(), f32.read_bytes()
    checked = 0
    for info in read_header(path).tensors:
        if info.ggml_type == 0:
            continue
        source = floats[info.name]
        import numpy as np

        weights = np.frombuffer(data[source.start : source.start + source.nbytes], np.float32)
        mine = raw[info.start : info.start + info.nbytes]
        assert mine == reference(weights), f"{info.name}: {kind} blocks differ from ggml's"
        checked += 1
    assert checked >= 10
    assert read_gguf(path).types["blk.0.attn_q.weight"] == kind


@pytest.mark.parametrize("kind", TYPES)
def test_t5_reads_what_it_writes(tmp_path: Path, kind: str) -> None:
    """Flan-T5's encoder-decoder (gated GELU, relative position buckets in each stack's first
    block, an untied head), against transformers on the Hugging Face export. (transformers'
    GGUF reader reads no ``t5.decoder_block_count`` and takes the feed-forward as gated ReLU,
    so it is no reference here.)"""
    named = "flan-t5-small"
    torch.manual_seed(0)
    model = zoo.build(named, **reference_overrides(named))
    randomize_parameters(model)
    model.eval()
    folder = zoo.export(model, tmp_path / "hf")
    path = zoo.export(model, tmp_path / "t5.gguf", layout="gguf", type=kind)
    reference = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    if kind != "f32":
        _quantize_like_the_file(reference, kind, conv1d=False)
    src, tgt = torch.randint(0, 1000, (2, 7)), torch.randint(0, 1000, (2, 5))
    with torch.no_grad():
        got = zoo.load(path, tokenizer=False)(src, tgt)
        want = reference(input_ids=src, decoder_input_ids=tgt).logits
    assert float((got - want).abs().max()) <= ATOL


def test_a_tied_t5_head_is_refused(tmp_path: Path) -> None:
    """llama.cpp's T5 reads a missing output as the token embedding, unscaled; T5 v1.0
    scales the decoder's output by d_model ** -0.5 before a tied head."""
    model = zoo.build(
        "flan-t5-small", **(reference_overrides("flan-t5-small") | {"tie_embeddings": True})
    )
    with pytest.raises(
        zoo.CheckpointError, match=r"tie_word_embeddings is True: llama\.cpp's 't5'"
    ):
        zoo.export(model, tmp_path / "t5.gguf", layout="gguf")


# -- llama.cpp itself on zoo's files ----------------------------------------------------------
#: A tokenizer of each family's own pipeline, small (tests/test_gguf_vocab.py makes them):
#: llama.cpp loads no file without one. Phi-3's window is as wide as the sequence here:
#: llama.cpp computes Phi-3 with full attention whatever phi3.attention.sliding_window says
#: (its tokens follow transformers' only while the sequence fits in the window).
LLAMA_CPP = {
    "llama": ("_smollm2", {}),
    "mistral": ("_tinyllama", {}),
    "mixtral": ("_tinyllama", {}),
    "qwen2": ("Qwen/Qwen2.5-0.5B-Instruct", {}),
    "qwen3": ("Qwen/Qwen3-0.6B", {}),
    "phi3": ("_phi3", {"sliding_window": 64}),
    "gemma2": ("_gemma", {}),
    "gemma3": ("_gemma", {}),
    "olmo2": ("_olmo2", {}),
    "gpt2": ("_gpt2", {}),
    "gpt-neox": ("_pythia", {}),
}


@pytest.mark.parametrize("name", sorted(LLAMA_CPP))
def test_llama_cpp_decodes_zoos_file_as_zoo_does(tmp_path: Path, name: str) -> None:
    """Greedy tokens of llama.cpp (llama-cpp-python, the ``bench`` extra) on zoo's float32
    file equal zoo's own on that file: a skip where it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        pytest.skip("needs llama-cpp-python (pip install 'torch-zoo[bench]' builds llama.cpp)")
    import test_gguf_vocab as vocabularies

    maker, extra = LLAMA_CPP[name]
    factory = getattr(vocabularies, maker) if maker.startswith("_") else vocabularies._qwen(maker)
    tokenizer = factory(tmp_path)
    named, sizes = CASES[name]
    torch.manual_seed(0)
    overrides = reference_overrides(named) | sizes | extra | {"vocab_size": tokenizer.vocab_size}
    model = zoo.build(named, **overrides)
    randomize_parameters(model)
    model.tokenizer = tokenizer
    path = zoo.export(model.eval(), tmp_path / "m.gguf", layout="gguf")
    prompt = torch.randint(0, tokenizer.vocab_size, (1, 8), generator=_seeded(3))
    ours = zoo.generate(zoo.load(path), prompt, max_new_tokens=16, temperature=0)[0, 8:].tolist()
    engine = llama_cpp.Llama(str(path), n_ctx=64, n_threads=2, verbose=False)
    theirs = []
    for token in engine.generate(prompt[0].tolist(), top_k=1, temp=0.0, repeat_penalty=1.0):
        theirs.append(token)
        if len(theirs) == len(ours):  # zoo stops at an end token; llama.cpp's loop does not
            break
    assert ours == theirs and len(ours) >= 4, (ours, theirs)


# -- a run zoo trained, and its LoRA, as files llama.cpp runs ----------------------------------
SMALL_GPT2 = ["--set", "n_layers=2", "--set", "d_model=64", "--set", "n_heads=4",
              "--set", "d_ff=128", "--set", "context_length=64"]  # fmt: skip


def _zoo(*argv: str) -> None:
    from zoo.cli import main

    assert main(list(argv)) == 0, argv


def _llama_cpp_tokens(path: Path, prompt: list[int], count: int) -> list[int] | None:
    """llama.cpp's greedy tokens after ``prompt``, or ``None`` where it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    engine = llama_cpp.Llama(str(path), n_ctx=64, n_threads=2, verbose=False)
    out: list[int] = []
    for token in engine.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0):
        out.append(token)
        if len(out) == count:
            return out
    return out


def test_a_trained_run_and_its_lora_become_files_llama_cpp_runs(tmp_path: Path) -> None:
    """``zoo train`` (GPT-2's tokenizer), then a LoRA on that run: ``zoo convert RUN
    OUT.gguf --to gguf`` writes the model, ``zoo merge RUN LORA OUT.gguf --to gguf`` the base
    with the adapter merged; zoo reads each back as the run computes, and llama.cpp decodes
    each as zoo does."""
    from zoo.adapters.lora import merge_lora

    data = tmp_path / "data.txt"
    text = Path(zoo.__file__).parents[1] / "plugins/shakespeare/data/tinyshakespeare.txt"
    data.write_text(text.read_text()[:20_000])
    run, lora = tmp_path / "run", tmp_path / "lora"
    _zoo("train", "gpt2-124m", *SMALL_GPT2, "--data", str(data), "--out", str(run),
         "--steps", "3", "--batch-size", "2", "--eval-batches", "1")  # fmt: skip
    _zoo("train", str(run), "--lora", "4", "--data", str(data), "--out", str(lora),
         "--steps", "3", "--batch-size", "2", "--eval-batches", "1")  # fmt: skip
    _zoo("convert", str(run), str(tmp_path / "run.gguf"), "--to", "gguf")
    _zoo("merge", str(run), str(lora), str(tmp_path / "lora.gguf"), "--to", "gguf")
    merged = zoo.load(run, adapter=lora)
    merge_lora(merged)
    prompt = zoo.tokenizer("gpt2-124m").encode("ROMEO: speak")
    ids = torch.tensor([prompt])
    for name, expected in (("run", zoo.load(run)), ("lora", merged)):
        path = tmp_path / f"{name}.gguf"
        loaded = zoo.load(path)
        with torch.no_grad():
            assert float((loaded(ids) - expected(ids)).abs().max()) <= ATOL
        ours = zoo.generate(loaded, ids, max_new_tokens=8, temperature=0)[0, len(prompt) :]
        theirs = _llama_cpp_tokens(path, prompt, len(ours))
        assert theirs is None or theirs == ours.tolist(), (name, ours, theirs)
        assert loaded.tokenizer is not None and loaded.tokenizer.encode("ROMEO") == prompt[:2]


def test_converting_a_lora_run_merges_it_into_its_recorded_base(tmp_path: Path) -> None:
    """``zoo convert LORA_RUN OUT.gguf --to gguf``: the base the run records (shakespeare-byte,
    shipped) with the adapter folded in; its byte tokenizer has no GGUF form, which is said."""
    from zoo.adapters.lora import merge_lora

    data = tmp_path / "data.txt"
    text = Path(zoo.__file__).parents[1] / "plugins/shakespeare/data/tinyshakespeare.txt"
    data.write_text(text.read_text()[:20_000])
    lora = tmp_path / "lora"
    _zoo("train", "shakespeare-byte", "--lora", "4", "--data", str(data), "--out", str(lora),
         "--steps", "3", "--batch-size", "2", "--eval-batches", "1", "--lr", "0.05")  # fmt: skip
    path = tmp_path / "merged.gguf"
    with pytest.warns(RuntimeWarning, match="written without a tokenizer"):
        _zoo("convert", str(lora), str(path), "--to", "gguf", "--type", "f16")
    merged = zoo.load(lora)
    merge_lora(merged)
    ids = torch.tensor([[72, 101, 108, 108, 111]])
    with torch.no_grad():
        got, want = zoo.load(path)(ids), merged(ids)
        base = zoo.load("shakespeare-byte")(ids)
    assert float((got - want).abs().max()) <= 5e-2  # f16 weights
    assert float((want - base).abs().max()) > 0.1  # the adapter changed the model


def test_zoo_chat_takes_a_gguf_file_with_its_template(tmp_path: Path) -> None:
    """``zoo chat FILE.gguf``: the chat template comes from the file's metadata."""
    import subprocess
    import sys

    import test_gguf_vocab as vocabularies

    tokenizer = vocabularies._smollm2(tmp_path)
    named = "smollm2-135m-instruct"
    sizes = reference_overrides(named) | {"vocab_size": tokenizer.vocab_size, "context_length": 256}
    model = zoo.build(named, **sizes)
    model.tokenizer = tokenizer
    path = zoo.export(model.eval(), tmp_path / "chat.gguf", layout="gguf", type="q8_0")
    assert zoo.load(path).tokenizer.chat_template is not None
    run = subprocess.run(
        [sys.executable, "-m", "zoo.cli", "chat", str(path), "--max-new-tokens", "4",
         "--temperature", "0"],
        input="Hello!\n/exit\n", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-2000:]


def test_zoo_serve_takes_a_gguf_file(tmp_path: Path) -> None:
    """``zoo serve FILE.gguf``: the file's model and tokenizer answer as zoo.generate does."""
    import test_gguf_vocab as vocabularies
    from test_serve import Server

    tokenizer = vocabularies._smollm2(tmp_path)
    named = "smollm2-135m-instruct"
    sizes = reference_overrides(named) | {"vocab_size": tokenizer.vocab_size, "context_length": 256}
    torch.manual_seed(0)
    model = zoo.build(named, **sizes)
    randomize_parameters(model)
    model.tokenizer = tokenizer
    path = zoo.export(model.eval(), tmp_path / "served.gguf", layout="gguf")
    loaded = zoo.load(path)
    want = zoo.generate(loaded, "Once upon a time", max_new_tokens=6, temperature=0)
    server = Server(tmp_path / "server", str(path), "--served-model-name", "tiny")
    try:
        out = server.client().completions.create(
            model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0
        )
    finally:
        server.stop()
    assert out.choices[0].text == want
