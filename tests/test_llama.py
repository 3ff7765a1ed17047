"""The llama plugin, a family made of declarations: parity with transformers'
LlamaForCausalLM on identical weights (tiny, and a mid-size config with grouped-query
attention), greedy decoding identical to transformers' generate, the Hugging Face checkpoint
layout both ways, and the tokenizer of the model's Hub repo."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from hub_fixtures import set_offline

import zoo
from zoo.tokenizers import TokenizerUnavailableError

SIZES = {
    "tiny": {"vocab_size": 320, "d_model": 64, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2,
             "d_ff": 160, "context_length": 128},
    "mid-gqa": {"vocab_size": 1000, "d_model": 256, "n_heads": 8, "n_kv_heads": 2,
                "n_layers": 4, "d_ff": 688, "context_length": 256},
}  # fmt: skip


def reference(size: dict, seed: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=size["vocab_size"], hidden_size=size["d_model"],
        num_attention_heads=size["n_heads"], num_key_value_heads=size["n_kv_heads"],
        num_hidden_layers=size["n_layers"], intermediate_size=size["d_ff"],
        max_position_embeddings=size["context_length"], rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # transformers initialises norms to 1: make them count
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.1)
    return model


def batch(vocab: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (3, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0  # left padding
    mask[2, 17:] = 0  # right padding
    return ids, mask


@pytest.mark.parametrize("size", ["tiny", "mid-gqa"])
def test_logits_match_transformers(size, tmp_path):
    ref = reference(SIZES[size])
    ref.save_pretrained(tmp_path)  # an HF directory: zoo.load reads its model_type
    model = zoo.load(tmp_path)
    assert type(model.config).architecture == "llama"
    assert model.config.n_kv_heads == SIZES[size]["n_kv_heads"]
    ids, mask = batch(SIZES[size]["vocab_size"])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = ref(ids, attention_mask=mask, position_ids=positions).logits
        got = model(ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    print(size, "max |zoo - transformers|:", float((got[real] - want[real]).abs().max()))


@pytest.mark.parametrize("size", ["tiny", "mid-gqa"])
def test_greedy_decoding_equals_transformers_generate(size, tmp_path):
    ref = reference(SIZES[size], seed=2)
    ref.save_pretrained(tmp_path)
    model = zoo.load(tmp_path)
    ids, _ = batch(SIZES[size]["vocab_size"], seed=3)
    prompt = ids[:1, :10]
    want = ref.generate(prompt, max_new_tokens=30, do_sample=False, min_new_tokens=30)
    got = zoo.generate(model, prompt, max_new_tokens=30, temperature=0)
    assert torch.equal(got, want)


def test_the_hf_llama_layout_round_trips(tmp_path):
    model = zoo.build("llama-tiny").eval()
    zoo.export(model, tmp_path / "hf", layout="hf-llama")
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids, _ = batch(320)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), theirs(ids).logits, rtol=1e-5, atol=1e-5)
    back = zoo.load(tmp_path / "hf")
    for key, value in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


def test_export_refuses_a_llama_the_layout_cannot_hold(tmp_path):
    model = zoo.build("llama-tiny", sliding_window=16)
    with pytest.raises(zoo.CheckpointError, match="sliding_window = 16"):
        zoo.export(model, tmp_path / "hf", layout="hf-llama")


def _llama_tokenizer_json(path: Path) -> Path:
    """A Llama-style tokenizer.json (SentencePiece BPE with byte fallback, "▁" for spaces,
    <unk> <s> </s> at 0-2), as TinyLlama's repo has, trained small."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
         decoders.Strip(" ", 1, 0)]
    )  # fmt: skip
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", *bytes_], show_progress=False
    )
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    tok.save(str(path))
    return path


def test_the_tokenizer_comes_from_the_models_hub_repo(local_hub, tmp_path, monkeypatch):
    source = _llama_tokenizer_json(tmp_path / "tokenizer.json")
    local_hub.add_files("TinyLlama/TinyLlama-1.1B-Chat-v1.0", {"tokenizer.json": source})
    tok = zoo.tokenizer("tinyllama-1.1b")
    text = "the quick brown fox, naïvely"
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(source), bos_token="<s>")
    assert tok.encode(text, add_special_tokens=True) == [
        1,
        *hf(text, add_special_tokens=False).input_ids,
    ]
    assert tok.decode(tok.encode(text)) == text
    set_offline(monkeypatch)  # cached now: no network needed
    assert zoo.tokenizer("tinyllama-1.1b").encode(text) == tok.encode(text)


def test_no_network_and_no_cache_is_a_clear_error(local_hub, monkeypatch):
    set_offline(monkeypatch)
    with pytest.raises(
        TokenizerUnavailableError, match=r"tokenizer\.json from the Hub repo TinyLlama"
    ):
        zoo.tokenizer("tinyllama-1.1b")


def test_a_llama_from_the_hub_brings_its_tokenizer(local_hub, tmp_path):
    ref = reference({**SIZES["tiny"], "vocab_size": 32000})  # TinyLlama's: its tokenizer
    ref.save_pretrained(tmp_path / "hf")
    _llama_tokenizer_json(tmp_path / "hf" / "tokenizer.json")
    local_hub.add_files("org/tiny-llama", {p.name: p for p in (tmp_path / "hf").iterdir()})
    model = zoo.load("hf:org/tiny-llama")
    assert model.tokenizer is not None and model.tokenizer.bos_id == 1
    assert model.tokenizer.encode("the fox", add_special_tokens=True)[0] == 1
    ids, _ = batch(32000)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), ref(ids).logits, rtol=1e-5, atol=1e-5)
