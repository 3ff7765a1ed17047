"""Hugging Face checkpoints: transformers' GPT-2 / GPT-1 files load into zoo with the same
logits, and zoo's export loads back into transformers unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import zoo
from zoo.errors import CheckpointError, StateDictMismatchError

transformers = pytest.importorskip("transformers")

TINY = {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32}
ATOL = 1e-5


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path_factory.mktemp("zoo-cache")))


def reference(kind: str, **config):
    """A random transformers LM head model in eval mode."""
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(**{**TINY, "vocab_size": 97, **config})
        return transformers.GPT2LMHeadModel(cfg).eval()
    cfg = transformers.OpenAIGPTConfig(**{**TINY, "vocab_size": 97, **config})
    return transformers.OpenAIGPTLMHeadModel(cfg).eval()


def ids_for(model, length: int = 16) -> torch.Tensor:
    vocab = model.config.vocab_size
    return torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(1))


def assert_parity(zoo_model, ref, ids: torch.Tensor, atol: float = ATOL) -> None:
    with torch.no_grad():
        expected = ref(ids).logits
        actual = zoo_model(ids)
    assert actual.shape == expected.shape
    diff = (actual - expected).abs().max().item()
    assert diff <= atol, f"logits differ by {diff:.3g}"


def rewrite_weights(directory: Path, edit) -> None:
    """Rewrite model.safetensors after ``edit(state) -> state``."""
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    state = {k: v.clone() for k, v in load_file(str(path)).items()}
    save_file(edit(state), str(path), metadata={"format": "pt"})


@pytest.mark.parametrize("kind", ["gpt2", "openai-gpt"])
def test_transformers_checkpoint_loads_with_same_logits(kind: str, tmp_path: Path) -> None:
    ref = reference(kind)
    ref.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    model = zoo.load(tmp_path)
    assert type(model.config).architecture == {"gpt2": "gpt2", "openai-gpt": "gpt1"}[kind]
    assert model.head.weight is model.tok_emb.weight
    assert model.load_report.ok
    assert model.tokenizer is None  # a 97-id vocabulary is no registered tokenizer's
    assert_parity(model, ref, ids_for(ref))
    half = zoo.load(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("kind", ["gpt2", "openai-gpt"])
def test_keys_without_prefix_and_with_mask_buffers(kind: str, tmp_path: Path) -> None:
    """The official files: no ``transformer.`` prefix, old ``attn.bias``/``masked_bias``
    buffers, no ``lm_head``."""
    ref = reference(kind)
    ref.save_pretrained(tmp_path)
    n = ref.config.n_positions

    def edit(state):
        out = {k.removeprefix("transformer."): v for k, v in state.items() if "lm_head" not in k}
        for i in range(ref.config.n_layer):
            out[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
            if kind == "gpt2":
                out[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
        return out

    rewrite_weights(tmp_path, edit)
    model = zoo.load(tmp_path)
    assert model.load_report.ok
    assert_parity(model, ref, ids_for(ref))


@pytest.mark.parametrize(
    ("kind", "layout", "config"),
    [
        ("gpt2", "hf-gpt2", {}),
        ("gpt2", "hf-gpt2", {"tie_word_embeddings": False}),
        ("openai-gpt", "hf-openai-gpt", {}),
    ],
)
def test_export_loads_back_into_transformers(kind, layout, config, tmp_path: Path) -> None:
    ref = reference(kind, **config)
    ref.save_pretrained(tmp_path / "hf")
    model = zoo.load(tmp_path / "hf")
    zoo.export(model, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name[0] != ".") == [
        "config.json",
        "model.safetensors",
    ]
    cls = type(ref)
    back = cls.from_pretrained(tmp_path / "out").eval()
    ids = ids_for(ref)
    with torch.no_grad():
        assert torch.equal(back(ids).logits, ref(ids).logits)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.metadata()["format"] == "pt"
    assert ("lm_head.weight" in keys) == (config.get("tie_word_embeddings") is False)
    assert all(not k.startswith("transformer.") for k in keys)
    # and zoo reads its own export
    assert_parity(zoo.load(tmp_path / "out"), ref, ids)
    assert zoo.export(model, tmp_path / "explicit", layout=layout).is_dir()


def test_zoo_built_model_exports(tmp_path: Path) -> None:
    model = zoo.build("gpt2-124m", n_layers=1, d_model=64, n_heads=4, d_ff=128, vocab_size=97)
    model.eval()
    zoo.export(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["n_inner"] == 128
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids = ids_for(back)
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids), atol=ATOL, rtol=0)


def test_export_needs_a_layout(tmp_path: Path) -> None:
    model = zoo.build("wiki-gpt-wordpiece", n_layers=1, d_model=64, n_heads=4, d_ff=128)
    with pytest.raises(CheckpointError, match="layout"):
        zoo.export(model, tmp_path / "a")
    gpt2 = zoo.build("gpt2-124m", n_layers=1, d_model=64, n_heads=4, d_ff=128, vocab_size=97)
    with pytest.raises(CheckpointError, match="hf-openai-gpt"):
        zoo.export(gpt2, tmp_path / "b", layout="hf-openai-gpt")
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())


def test_convert_checkpoint_both_ways(tmp_path: Path) -> None:
    ref = reference("gpt2")
    ref.save_pretrained(tmp_path / "hf")
    zoo.convert_checkpoint(tmp_path / "hf", tmp_path / "zoo")
    manifest = json.loads((tmp_path / "zoo" / "config.json").read_text())
    assert manifest["format"] == "zoo" and manifest["architecture"] == "gpt2"
    assert_parity(zoo.load(tmp_path / "zoo"), ref, ids_for(ref))
    zoo.convert_checkpoint(tmp_path / "zoo", tmp_path / "hf2", to="hf-gpt2")
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf2").eval()
    ids = ids_for(ref)
    with torch.no_grad():
        assert torch.equal(back(ids).logits, ref(ids).logits)
    with pytest.raises(CheckpointError, match=r"no checkpoint layout .pickle. .it has: hf-gpt2"):
        zoo.convert_checkpoint(tmp_path / "hf", tmp_path / "x", to="pickle")


def test_hf_key_problems_are_reported(tmp_path: Path) -> None:
    ref = reference("gpt2")
    ref.save_pretrained(tmp_path)

    def edit(state):
        del state["transformer.h.1.mlp.c_fc.bias"]
        state["transformer.h.0.attn.rotary.weight"] = torch.zeros(3)
        return state

    rewrite_weights(tmp_path, edit)
    with pytest.raises(StateDictMismatchError) as info:
        zoo.load(tmp_path)
    message = str(info.value)
    assert "1 missing (blocks.1.ffn.fc.bias)" in message
    assert "1 unexpected (transformer.h.0.attn.rotary.weight)" in message
    model = zoo.load(tmp_path, strict=False)
    assert model.load_report.missing == ("blocks.1.ffn.fc.bias",)
    assert model.load_report.initialised == ("blocks.1.ffn.fc.bias",)
    assert not model.blocks[1].ffn.fc.bias.is_meta


def test_unsupported_model_type(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(zoo.UnknownArchitectureError, match=r"'mamba'.*Install a plugin"):
        zoo.load(tmp_path)


def test_no_tokenizer_is_borrowed_because_the_vocabulary_size_matches(tmp_path: Path) -> None:
    """A Hugging Face GPT-2 folder without tokenizer files gets no tokenizer, though
    gpt2-124m's has the same 50,257 ids: it may be any vocabulary of that size. Generation
    on text then says how to give one; ids still work; an explicit tokenizer is used."""
    ref = reference("gpt2", vocab_size=50257, n_layer=1)
    ref.save_pretrained(tmp_path)
    model = zoo.load(tmp_path)
    assert model.tokenizer is None
    assert "never guesses" in model.tokenizer_error
    with pytest.raises(ValueError, match=r"needs a tokenizer.*--tokenizer NAME"):
        zoo.generate(model, "Hello", max_new_tokens=2)
    ids = torch.tensor([[15496, 995]])
    assert zoo.generate(model, ids, max_new_tokens=2, temperature=0).shape == (1, 4)
    text = zoo.generate(model, "Hello", max_new_tokens=2, tokenizer=zoo.tokenizer("gpt2-124m"))
    assert isinstance(text, str)


def test_gpt1_folder_brings_its_own_vocabulary_files(tmp_path: Path) -> None:
    """An openai-gpt folder holding vocab.json + merges.txt is read with those very files;
    without them the same weights get no tokenizer."""
    ref = reference("openai-gpt", vocab_size=40478, n_layer=1)
    ref.save_pretrained(tmp_path)
    assert zoo.load(tmp_path).tokenizer is None
    for name, vendored in (
        ("vocab.json", "encoder_bpe_40000.json"),
        ("merges.txt", "vocab_40000.bpe"),
    ):
        (tmp_path / name).write_bytes(
            (Path(__file__).parent / "data" / "gpt1" / vendored).read_bytes()
        )
    tok = zoo.load(tmp_path).tokenizer
    want = transformers.OpenAIGPTTokenizer(
        str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")
    )
    assert tok is not None and tok.encode("Hello world!") == want.encode("Hello world!")


# -- full size (one each) -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "openai-gpt"])
def test_full_size_parity_and_export(kind: str, tmp_path: Path) -> None:
    cls, cfg = {
        "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config),
        "openai-gpt": (transformers.OpenAIGPTLMHeadModel, transformers.OpenAIGPTConfig),
    }[kind]
    torch.manual_seed(0)
    ref = cls(cfg()).eval()
    ref.save_pretrained(tmp_path / "hf")
    model = zoo.load(tmp_path / "hf", tokenizer=False)
    expected = {"gpt2": 124_439_808, "openai-gpt": 116_534_784}[kind]
    assert model.num_parameters() == expected
    ids = ids_for(ref, length=24)
    assert_parity(model, ref, ids)
    zoo.export(model, tmp_path / "out")
    back = cls.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert torch.equal(back(ids).logits, ref(ids).logits)


def test_cli_generate_says_how_to_give_a_tokenizer(tmp_path: Path, capsys) -> None:
    from zoo.cli import main

    reference("gpt2", vocab_size=50257, n_layer=1).save_pretrained(tmp_path)
    assert main(["generate", str(tmp_path), "Hello", "--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert "--tokenizer NAME" in err and "Hello" not in out  # refused before echoing
    argv = ["generate", str(tmp_path), "Hello", "--max-new-tokens", "2", "--tokenizer", "gpt2-124m"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("Hello")
