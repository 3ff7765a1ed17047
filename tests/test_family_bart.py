"""BART against transformers' ``BartForConditionalGeneration``: a folder ``save_pretrained``
wrote loads in zoo with the same logits on a right-padded batch, the same greedy tokens and
the same logits at every decoding step, in several tiny geometries (a tied or separate head,
scaled embeddings, each activation); every seam zoo declares for it moves the logits; both
transformers generations' ``config.json`` spellings load; keys zoo cannot honour are refused
by name; ``zoo.export`` writes a folder transformers loads to the same logits. No official
config is vendored (no network here): the geometries are transformers' own config class with
small sizes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from seq2seq_parity import (
    check_folder,
    greedy_pair,
    max_logit_diff,
    padded_pair,
    randomize,
    save_and_load,
    step_logits_diff,
)
from zoo_plugins.bart.config import BartConfig
from zoo_plugins.transformer_encdec.model import EncoderDecoder

import zoo
from zoo.errors import CheckpointError

#: Tiny geometries: transformers' BartConfig values (BART's ids: bos 0, pad 1, eos 2 = start).
GEOMETRIES: dict[str, dict[str, Any]] = {
    "tied-gelu": {
        "vocab_size": 120, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 48,
        "decoder_ffn_dim": 48, "max_position_embeddings": 40,
    },
    "untied-scaled-relu": {
        "vocab_size": 100, "tie_word_embeddings": False, "scale_embedding": True,
        "d_model": 24, "encoder_layers": 1, "decoder_layers": 2, "encoder_attention_heads": 3,
        "decoder_attention_heads": 3, "encoder_ffn_dim": 40, "decoder_ffn_dim": 40,
        "max_position_embeddings": 32, "activation_function": "relu",
    },
    "gelu-new": {
        "vocab_size": 80, "d_model": 16, "encoder_layers": 1, "decoder_layers": 1,
        "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 32,
        "decoder_ffn_dim": 32, "max_position_embeddings": 24, "activation_function": "gelu_new",
    },
}  # fmt: skip

START, EOS = 2, 2


def _pair(name: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    """(geometry name, transformers' model, zoo's load of its save_pretrained folder, folder)."""
    values = {**GEOMETRIES[name], "forced_eos_token_id": None}
    torch.manual_seed(0)
    theirs = transformers.BartForConditionalGeneration(transformers.BartConfig(**values)).eval()
    randomize(theirs, std=0.15)
    folder = tmp_path_factory.mktemp(f"bart-{name}")
    ours = save_and_load(theirs, folder)
    assert isinstance(ours, EncoderDecoder) and isinstance(ours.config, BartConfig)
    return name, theirs, ours, folder


@pytest.fixture(scope="module", params=sorted(GEOMETRIES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Each geometry's pair (:func:`_pair`)."""
    return _pair(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory):
    """The pair of the tied-gelu geometry, for the checks one geometry makes."""
    return _pair("tied-gelu", tmp_path_factory)


def test_logits_match_on_a_right_padded_batch(pair) -> None:
    name, theirs, ours, _ = pair
    vocab = GEOMETRIES[name]["vocab_size"]
    assert max_logit_diff(ours, theirs, padded_pair(vocab, vocab)) <= 1e-4
    assert (ours.head.weight is ours.tok_emb.weight) == GEOMETRIES[name].get(
        "tie_word_embeddings", True
    )


#: BART with one seam of zoo's declared as another family has it.
CHANGES: list[dict[str, Any]] = [
    {"position_offset": 0},
    {"embedding_norm": False},
    {"separate_source_positions": False},  # the decoder's table for the source too
    {"logits_bias": False},
    {"scale_embeddings": True},
    {"norm_first": True},
]


def test_every_seam_moves_the_logits(pair) -> None:
    """zoo's model with one BART seam changed (a flag flipped where the geometry already has
    the other value) is far from transformers: each is needed."""
    name, theirs, ours, _ = pair
    vocab = GEOMETRIES[name]["vocab_size"]
    batch = padded_pair(vocab, vocab)
    state = ours.state_dict()
    for change in CHANGES:
        ((key, value),) = change.items()
        if getattr(ours.config, key) == value:
            value = not value
        config = ours.config.replace(**{key: value})
        other = EncoderDecoder(config, zoo.get_registry().parts(config))
        if key == "position_offset":  # the same table, position p read from row p
            state = {**state, "pos_emb.weight": state["pos_emb.weight"][:-2]}
            state["src_pos_emb.weight"] = state["src_pos_emb.weight"][:-2]
        other.load_state_dict(state, strict=False)
        state = ours.state_dict()
        assert max_logit_diff(other.eval(), theirs, batch) > 1e-2, change


def test_greedy_tokens_and_step_logits_equal_transformers_on_a_padded_batch(pair) -> None:
    """``zoo.generate`` (the source left-padded, positions counted from each row's first
    token) gives transformers' greedy tokens for right-padded sources, row for row, and the
    cached session's logits at every step are transformers'."""
    name, theirs, ours, _ = pair
    g = torch.Generator().manual_seed(5)
    vocab = GEOMETRIES[name]["vocab_size"]
    sources = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (9, 4, 6)]
    got, want = greedy_pair(ours, theirs, sources, start=START, eos=EOS)
    assert got == want
    assert step_logits_diff(ours, theirs, sources, start=START, eos=EOS) <= 1e-4


def test_export_loads_in_transformers_to_the_same_logits(pair, tmp_path: Path) -> None:
    name, _, ours, _ = pair
    vocab = GEOMETRIES[name]["vocab_size"]
    batch = padded_pair(vocab, vocab)
    zoo.export(ours, tmp_path / "out")
    back = transformers.BartForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    assert max_logit_diff(ours, back, batch) <= 1e-5
    again = zoo.load(tmp_path / "out")
    assert again.config == ours.config
    for key, tensor in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], tensor), key


#: ``facebook/bart-large``'s config.json as transformers 4.x wrote it (its keys and kinds of
#: value, at this test's sizes): the old switches, labels, generation defaults.
CONFIG_4X: dict[str, Any] = {
    "_num_labels": 3, "activation_dropout": 0.1, "activation_function": "gelu",
    "add_bias_logits": False, "add_final_layer_norm": False,
    "architectures": ["BartModel"], "attention_dropout": 0.1, "bos_token_id": 0,
    "classif_dropout": 0.1, "classifier_dropout": 0.0, "d_model": 32,
    "decoder_attention_heads": 4, "decoder_ffn_dim": 48, "decoder_layerdrop": 0.0,
    "decoder_layers": 2, "decoder_start_token_id": 2, "dropout": 0.1,
    "early_stopping": True, "encoder_attention_heads": 4, "encoder_ffn_dim": 48,
    "encoder_layerdrop": 0.0, "encoder_layers": 2, "eos_token_id": 2,
    "extra_pos_embeddings": 2, "forced_bos_token_id": 0, "forced_eos_token_id": 2,
    "gradient_checkpointing": False, "id2label": {"0": "LABEL_0", "1": "LABEL_1"},
    "init_std": 0.02, "is_encoder_decoder": True, "label2id": {"LABEL_0": 0, "LABEL_1": 1},
    "max_position_embeddings": 40, "model_type": "bart", "no_repeat_ngram_size": 3,
    "normalize_before": False, "normalize_embedding": True, "num_beams": 4,
    "num_hidden_layers": 2, "output_past": False, "pad_token_id": 1, "scale_embedding": False,
    "static_position_embeddings": False, "task_specific_params": {"summarization": {}},
    "transformers_version": "4.7.0.dev0", "use_cache": True, "vocab_size": 120,
}  # fmt: skip


def _with_config(folder: Path, where: Path, config: dict[str, Any]) -> Path:
    shutil.copytree(folder, where)
    (where / "config.json").write_text(json.dumps(config))
    return where


def test_a_transformers4_config_json_loads_the_same_model(tied, tmp_path: Path) -> None:
    _, _, ours, folder = tied
    assert zoo.load(_with_config(folder, tmp_path / "4x", CONFIG_4X)).config == ours.config


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"normalize_before": True}, "normalize_before = True"),
        ({"normalize_embedding": False}, "normalize_embedding = False"),
        ({"add_final_layer_norm": True}, "add_final_layer_norm = True"),
        ({"extra_pos_embeddings": 0}, "extra_pos_embeddings = 0"),
        ({"decoder_attention_heads": 2}, "decoder_attention_heads = 2"),
        ({"is_encoder_decoder": False}, "is_encoder_decoder = False"),
        ({"rope_flavour": 2}, "rope_flavour = 2"),
    ],
)
def test_keys_zoo_cannot_honour_are_refused_by_name(
    tied, tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    folder = tied[3]
    with pytest.raises(CheckpointError, match=re.escape(named)):
        zoo.load(_with_config(folder, tmp_path / "bad", {**CONFIG_4X, **change}))


def test_a_checkpoint_without_the_logits_bias_or_with_tied_copies_loads(
    tied, tmp_path: Path
) -> None:
    """Checkpoints older transformers wrote: without ``final_logits_bias`` (zeros, as
    transformers loads it), or with the embedding under every name."""
    _, _, ours, folder = tied
    state = load_file(folder / "model.safetensors")
    del state["final_logits_bias"]
    for copy in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        state[copy] = state["model.shared.weight"].clone()
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    save_file(state, old / "model.safetensors", metadata={"format": "pt"})
    again = zoo.load(old)
    assert again.final_logits_bias is not None and not again.final_logits_bias.any()
    for key, tensor in ours.state_dict().items():
        if key != "final_logits_bias":
            assert torch.equal(again.state_dict()[key], tensor), key


def test_the_conformance_kit_passes_on_a_folder(tied, capsys) -> None:
    """``zoo check`` on the folder (see tests/test_family_marian.py)."""
    check_folder(tied[3], capsys)
