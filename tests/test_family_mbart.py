"""mBART against transformers' ``MBartForConditionalGeneration``: BART's layout made pre-LN
with a norm after each stack (tests/test_family_bart.py covers what the two share). A folder
``save_pretrained`` wrote loads in zoo with the same logits on a right-padded batch, the same
greedy tokens and the same logits at every cached step, in two tiny geometries; the seams
mBART adds to BART move the logits; a 4.x ``config.json`` loads; ``zoo.export`` writes a
folder transformers loads to the same logits."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from seq2seq_parity import (
    check_folder,
    greedy_pair,
    max_logit_diff,
    padded_pair,
    randomize,
    save_and_load,
    step_logits_diff,
)
from zoo_plugins.mbart.config import MBartConfig
from zoo_plugins.transformer_encdec.model import EncoderDecoder

import zoo
from zoo.errors import CheckpointError

GEOMETRIES: dict[str, dict[str, Any]] = {
    "scaled-gelu": {
        "vocab_size": 110, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 48,
        "decoder_ffn_dim": 48, "max_position_embeddings": 40, "scale_embedding": True,
    },
    "unscaled-relu-untied": {
        "vocab_size": 90, "d_model": 24, "encoder_layers": 1, "decoder_layers": 2,
        "encoder_attention_heads": 3, "decoder_attention_heads": 3, "encoder_ffn_dim": 40,
        "decoder_ffn_dim": 40, "max_position_embeddings": 32, "activation_function": "relu",
        "tie_word_embeddings": False,
    },
}  # fmt: skip
START, EOS = 2, 2


@pytest.fixture(scope="module", params=sorted(GEOMETRIES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(geometry name, transformers' model, zoo's load of its save_pretrained folder, folder)."""
    values = {**GEOMETRIES[request.param], "forced_eos_token_id": None}
    torch.manual_seed(0)
    theirs = transformers.MBartForConditionalGeneration(transformers.MBartConfig(**values))
    randomize(theirs.eval(), std=0.15)
    folder = tmp_path_factory.mktemp(f"mbart-{request.param}")
    ours = save_and_load(theirs, folder)
    assert isinstance(ours, EncoderDecoder) and isinstance(ours.config, MBartConfig)
    return request.param, theirs, ours, folder


def _batch(name: str) -> tuple[torch.Tensor, ...]:
    vocab = GEOMETRIES[name]["vocab_size"]
    return padded_pair(vocab, vocab)


def test_logits_match_and_the_pre_ln_seams_move_them(pair) -> None:
    name, theirs, ours, _ = pair
    assert max_logit_diff(ours, theirs, _batch(name)) <= 1e-4
    for change in ({"norm_first": False}, {"final_norm": False}):
        config = ours.config.replace(**change)
        other = EncoderDecoder(config, zoo.get_registry().parts(config))
        other.load_state_dict(ours.state_dict(), strict=False)
        assert max_logit_diff(other.eval(), theirs, _batch(name)) > 1e-2, change


def test_greedy_tokens_and_step_logits_equal_transformers_on_a_padded_batch(pair) -> None:
    name, theirs, ours, _ = pair
    g = torch.Generator().manual_seed(5)
    vocab = GEOMETRIES[name]["vocab_size"]
    sources = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (9, 4, 6)]
    got, want = greedy_pair(ours, theirs, sources, start=START, eos=EOS)
    assert got == want
    assert step_logits_diff(ours, theirs, sources, start=START, eos=EOS) <= 1e-4


def test_export_loads_in_transformers_to_the_same_logits(pair, tmp_path: Path) -> None:
    name, _, ours, _ = pair
    zoo.export(ours, tmp_path / "out")
    back = transformers.MBartForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    assert max_logit_diff(ours, back, _batch(name)) <= 1e-5
    assert zoo.load(tmp_path / "out").config == ours.config


#: ``facebook/mbart-large-cc25``'s config.json as transformers 4.x wrote it (its keys, at this
#: test's sizes).
CONFIG_4X: dict[str, Any] = {
    "activation_dropout": 0.0, "activation_function": "gelu", "add_bias_logits": False,
    "add_final_layer_norm": True, "architectures": ["MBartForConditionalGeneration"],
    "attention_dropout": 0.0, "bos_token_id": 0, "classif_dropout": 0.0, "d_model": 32,
    "decoder_attention_heads": 4, "decoder_ffn_dim": 48, "decoder_layerdrop": 0.0,
    "decoder_layers": 2, "dropout": 0.1, "encoder_attention_heads": 4,
    "encoder_ffn_dim": 48, "encoder_layerdrop": 0.0, "encoder_layers": 2, "eos_token_id": 2,
    "init_std": 0.02, "is_encoder_decoder": True, "max_position_embeddings": 40,
    "model_type": "mbart", "normalize_before": True, "normalize_embedding": True,
    "num_hidden_layers": 2, "output_past": True, "pad_token_id": 1, "scale_embedding": True,
    "static_position_embeddings": False, "vocab_size": 110,
}  # fmt: skip


def test_a_transformers4_config_json_loads_and_a_post_ln_one_is_refused(
    pair, tmp_path: Path
) -> None:
    name, _, ours, folder = pair
    if name != "scaled-gelu":
        return  # the 4.x file is written for this geometry
    old = tmp_path / "4x"
    shutil.copytree(folder, old)
    (old / "config.json").write_text(json.dumps(CONFIG_4X))
    assert zoo.load(old).config == ours.config
    (old / "config.json").write_text(json.dumps({**CONFIG_4X, "normalize_before": False}))
    with pytest.raises(CheckpointError, match=re.escape("normalize_before = False")):
        zoo.load(old)


def test_the_conformance_kit_passes_on_a_folder(pair, capsys) -> None:
    """``zoo check`` on the folder (see tests/test_family_marian.py)."""
    if pair[0] == "scaled-gelu":
        check_folder(pair[3], capsys)
