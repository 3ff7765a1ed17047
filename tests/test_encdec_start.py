"""An encoder-decoder's target starts where its config.json says (``decoder_start_token_id``,
zoo's ``decoder_start_id``), so ``zoo.generate`` needs no ``start_id`` for a folder that has no
``generation_config.json``: Marian's pad, BART's end of text, T5's pad where transformers 5
leaves the key out of the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import zoo

transformers = pytest.importorskip("transformers")

SIZES = dict(d_model=16, encoder_attention_heads=2, decoder_attention_heads=2,
             encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_layers=1, decoder_layers=1,
             max_position_embeddings=32)  # fmt: skip


def _saved(model: torch.nn.Module, folder: Path) -> Path:
    model.save_pretrained(folder)
    (folder / "generation_config.json").unlink(missing_ok=True)
    return folder


def test_marian_starts_with_the_start_id_its_config_names(tmp_path: Path) -> None:
    config = transformers.MarianConfig(vocab_size=64, pad_token_id=63, decoder_start_token_id=63,
                                       eos_token_id=0, **SIZES)  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # one vocabulary: transformers 5 keeps three tables; make them one
        for copy in (reference.model.encoder.embed_tokens, reference.model.decoder.embed_tokens):
            copy.weight.copy_(reference.model.shared.weight)
    model = zoo.load(_saved(reference, tmp_path / "marian"), tokenizer=False)
    assert model.config.decoder_start_id == 63
    ids = torch.tensor([[5, 6, 7, 0]])
    ours = zoo.generate(model, ids, max_new_tokens=6, temperature=0)
    theirs = reference.generate(ids, max_new_tokens=6, do_sample=False, num_beams=1,
                                forced_eos_token_id=None, bad_words_ids=None)  # fmt: skip
    assert ours[0, 0] == 63 and ours.tolist() == theirs[:, : ours.shape[1]].tolist()


@pytest.mark.parametrize(
    ("make", "start"),
    [
        (lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=40, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)), 0),
        (lambda: transformers.BartForConditionalGeneration(transformers.BartConfig(
            vocab_size=40, **SIZES)), 2),
    ],
    ids=["t5", "bart"],
)  # fmt: skip
def test_the_family_default_fills_a_start_id_the_file_leaves_out(make, start, tmp_path: Path):
    folder = _saved(make(), tmp_path / "model")
    model = zoo.load(folder, tokenizer=False)
    assert model.config.decoder_start_id == start
    assert zoo.generate(model, torch.tensor([[5, 6, 7]]), max_new_tokens=2)[0, 0] == start


def test_a_source_vocabulary_of_its_own_takes_its_own_ids(tmp_path: Path) -> None:
    """Marian with ``share_encoder_decoder_embeddings = false``: source ids past the target's
    vocabulary are valid prompt ids."""
    config = transformers.MarianConfig(vocab_size=80, decoder_vocab_size=40, pad_token_id=39,
                                       decoder_start_token_id=39, eos_token_id=0,
                                       share_encoder_decoder_embeddings=False, **SIZES)  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.MarianMTModel(config).eval()
    model = zoo.load(_saved(reference, tmp_path / "marian"), tokenizer=False)
    assert (model.config.source_vocab, model.config.vocab_size) == (80, 40)
    ids = torch.tensor([[75, 6, 70, 0]])  # 75 and 70: source ids only
    ours = zoo.generate(model, ids, max_new_tokens=4, temperature=0)
    theirs = reference.generate(ids, max_new_tokens=4, do_sample=False, num_beams=1,
                                forced_eos_token_id=None, bad_words_ids=None)  # fmt: skip
    assert ours.tolist() == theirs[:, : ours.shape[1]].tolist()


def test_saved_and_exported_checkpoints_keep_the_generation_defaults(tmp_path: Path) -> None:
    """A model loaded with a ``generation_config.json`` writes it back when saved (zoo's format)
    or exported (transformers reads the same beams, bad words and start token)."""
    config = transformers.MarianConfig(vocab_size=64, pad_token_id=63, decoder_start_token_id=63,
                                       eos_token_id=0, **SIZES)  # fmt: skip
    folder = tmp_path / "marian"
    transformers.MarianMTModel(config).save_pretrained(folder)
    defaults = {"num_beams": 4, "bad_words_ids": [[63]], "max_length": 40,
                "decoder_start_token_id": 63, "forced_eos_token_id": 0}  # fmt: skip
    transformers.GenerationConfig(**defaults).save_pretrained(folder)
    model = zoo.load(folder, tokenizer=False)
    zoo.save(model, tmp_path / "saved")
    assert zoo.load(tmp_path / "saved").generation_config == model.generation_config
    zoo.export(model, tmp_path / "exported")
    read = transformers.GenerationConfig.from_pretrained(tmp_path / "exported")
    assert {key: getattr(read, key) for key in defaults} == defaults
