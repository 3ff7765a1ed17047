"""Marian (OPUS-MT) against transformers' ``MarianMTModel``: a folder ``save_pretrained``
wrote loads in zoo with the same logits on a right-padded batch and the same greedy tokens,
in several tiny geometries (one vocabulary or the source's own, a tied or separate head, each
activation transformers names, an odd width where the sines outnumber the cosines); every
seam zoo declares for it moves the logits; both transformers generations' ``config.json``
spellings load; keys zoo cannot honour are refused by name; ``zoo.export`` writes a folder
transformers loads to the same logits. No official config is vendored (there is no network
here): the geometries are transformers' own config class with small sizes."""

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
from zoo_plugins.marian.config import MarianConfig
from zoo_plugins.transformer_encdec.model import EncoderDecoder

import zoo
from zoo.errors import CheckpointError

#: Tiny geometries: transformers' MarianConfig values (pad = decoder start, eos 0, as OPUS-MT).
GEOMETRIES: dict[str, dict[str, Any]] = {
    "shared-swish": {
        "vocab_size": 120, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 48,
        "decoder_ffn_dim": 48, "max_position_embeddings": 64, "activation_function": "swish",
        "scale_embedding": True, "pad_token_id": 119, "decoder_start_token_id": 119,
    },
    "separate-vocabularies-gelu": {
        "vocab_size": 130, "decoder_vocab_size": 90, "share_encoder_decoder_embeddings": False,
        "d_model": 24, "encoder_layers": 1, "decoder_layers": 3, "encoder_attention_heads": 3,
        "decoder_attention_heads": 3, "encoder_ffn_dim": 40, "decoder_ffn_dim": 40,
        "max_position_embeddings": 48, "activation_function": "gelu", "scale_embedding": False,
        "pad_token_id": 89, "decoder_start_token_id": 89,
    },
    "untied-odd-width-relu": {
        "vocab_size": 100, "tie_word_embeddings": False, "d_model": 27, "encoder_layers": 2,
        "decoder_layers": 1, "encoder_attention_heads": 3, "decoder_attention_heads": 3,
        "encoder_ffn_dim": 36, "decoder_ffn_dim": 36, "max_position_embeddings": 40,
        "activation_function": "relu", "scale_embedding": True, "pad_token_id": 99,
        "decoder_start_token_id": 99,
    },
    "gelu-new": {
        "vocab_size": 80, "d_model": 16, "encoder_layers": 1, "decoder_layers": 1,
        "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 32,
        "decoder_ffn_dim": 32, "max_position_embeddings": 32, "activation_function": "gelu_new",
        "scale_embedding": True, "pad_token_id": 79, "decoder_start_token_id": 79,
    },
}  # fmt: skip


def _vocabularies(values: dict[str, Any]) -> tuple[int, int]:
    source = values["vocab_size"]
    return source, values.get("decoder_vocab_size", source)


def _pair(name: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    """(geometry name, transformers' model, zoo's load of its save_pretrained folder, folder)."""
    values = {**GEOMETRIES[name], "eos_token_id": 0, "forced_eos_token_id": None}
    torch.manual_seed(0)
    theirs = transformers.MarianMTModel(transformers.MarianConfig(**values)).eval()
    randomize(theirs, std=0.15)
    folder = tmp_path_factory.mktemp(f"marian-{name}")
    ours = save_and_load(theirs, folder)
    assert isinstance(ours, EncoderDecoder) and isinstance(ours.config, MarianConfig)
    return name, theirs, ours, folder


@pytest.fixture(scope="module", params=sorted(GEOMETRIES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Each geometry's pair (:func:`_pair`)."""
    return _pair(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory):
    """The pair of the shared-vocabulary geometry, for the checks one geometry makes."""
    return _pair("shared-swish", tmp_path_factory)


def test_logits_match_on_a_right_padded_batch(pair) -> None:
    name, theirs, ours, _ = pair
    values = GEOMETRIES[name]
    batch = padded_pair(*_vocabularies(values))
    assert max_logit_diff(ours, theirs, batch) <= 1e-4
    c = ours.config
    assert c.separate_source_embedding == ("decoder_vocab_size" in values)
    assert c.tie_embeddings == values.get("tie_word_embeddings", True)
    assert (ours.head.weight is ours.tok_emb.weight) == c.tie_embeddings


#: Marian with one seam of zoo's declared as another family has it.
CHANGES: list[dict[str, Any]] = [
    {"positions": "sinusoidal"},  # interleaved sin/cos instead of sines then cosines
    {"scale_embeddings": False},
    {"logits_bias": False},
    {"final_norm": True},
    {"norm_first": True},
]


def test_every_seam_moves_the_logits(pair) -> None:
    """zoo's model with one Marian seam changed (a flag flipped where the geometry already
    has the other value) is far from transformers: each is needed."""
    name, theirs, ours, _ = pair
    batch = padded_pair(*_vocabularies(GEOMETRIES[name]))
    for change in CHANGES:
        ((key, value),) = change.items()
        if getattr(ours.config, key) == value:
            value = not value
        config = ours.config.replace(**{key: value})
        other = EncoderDecoder(config, zoo.get_registry().parts(config))
        other.load_state_dict(ours.state_dict(), strict=False)  # (a new norm: the identity)
        assert max_logit_diff(other.eval(), theirs, batch) > 1e-2, change


def test_greedy_tokens_and_step_logits_equal_transformers_on_a_padded_batch(pair) -> None:
    """``zoo.generate`` (the source left-padded, positions counted from each row's first
    token) gives transformers' greedy tokens for right-padded sources, row for row, and the
    cached session's logits at every step are transformers'. Source ids stay inside the
    target vocabulary: zoo.generate checks prompt ids against ``vocab_size``, the target's."""
    name, theirs, ours, _ = pair
    source_vocab, target_vocab = _vocabularies(GEOMETRIES[name])
    g = torch.Generator().manual_seed(5)
    top = min(source_vocab, target_vocab)
    sources = [torch.randint(3, top, (n,), generator=g).tolist() for n in (9, 4, 6)]
    start = GEOMETRIES[name]["decoder_start_token_id"]
    got, want = greedy_pair(ours, theirs, sources, start=start, eos=0)
    assert got == want
    assert step_logits_diff(ours, theirs, sources, start=start, eos=0) <= 1e-4


def test_a_left_padded_source_gives_the_unpadded_logits(pair) -> None:
    """zoo counts source positions from each row's first real token: padding on the left
    changes nothing (transformers counts from the first column, so it pads on the right)."""
    name, _, ours, _ = pair
    source_vocab, target_vocab = _vocabularies(GEOMETRIES[name])
    src = torch.randint(3, source_vocab, (1, 7), generator=torch.Generator().manual_seed(2))
    tgt = torch.randint(3, target_vocab, (1, 5), generator=torch.Generator().manual_seed(3))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), src], dim=1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 7, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(ours(padded, tgt, mask), ours(src, tgt), atol=1e-5, rtol=0)


def test_export_loads_in_transformers_to_the_same_logits(pair, tmp_path: Path) -> None:
    name, theirs, ours, _ = pair
    batch = padded_pair(*_vocabularies(GEOMETRIES[name]))
    zoo.export(ours, tmp_path / "out")
    back = transformers.MarianMTModel.from_pretrained(tmp_path / "out").eval()
    assert max_logit_diff(ours, back, batch) <= 1e-5
    assert max_logit_diff(ours, theirs, batch) <= 1e-4
    again = zoo.load(tmp_path / "out")
    assert again.config == ours.config
    for key, tensor in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], tensor), key


#: ``Helsinki-NLP/opus-mt-en-de``'s config.json as transformers 4.x wrote it (keys and kinds of
#: value, at this test's sizes): the old BART-code switches, labels, generation defaults.
CONFIG_4X: dict[str, Any] = {
    "_num_labels": 3, "activation_dropout": 0.0, "activation_function": "swish",
    "add_bias_logits": False, "add_final_layer_norm": False, "architectures": ["MarianMTModel"],
    "attention_dropout": 0.0, "bad_words_ids": [[119]], "bos_token_id": 0,
    "classif_dropout": 0.0, "classifier_dropout": 0.0, "d_model": 32,
    "decoder_attention_heads": 4, "decoder_ffn_dim": 48, "decoder_layerdrop": 0.0,
    "decoder_layers": 2, "decoder_start_token_id": 119, "decoder_vocab_size": 120,
    "dropout": 0.1, "encoder_attention_heads": 4, "encoder_ffn_dim": 48,
    "encoder_layerdrop": 0.0, "encoder_layers": 2, "eos_token_id": 0,
    "extra_pos_embeddings": 120, "forced_eos_token_id": 0, "gradient_checkpointing": False,
    "id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}, "init_std": 0.02,
    "is_encoder_decoder": True, "label2id": {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2},
    "max_length": 64, "max_position_embeddings": 64, "model_type": "marian",
    "normalize_before": False, "normalize_embedding": False, "num_beams": 4,
    "num_hidden_layers": 2, "pad_token_id": 119, "scale_embedding": True,
    "share_encoder_decoder_embeddings": True, "static_position_embeddings": True,
    "transformers_version": "4.22.0.dev0", "use_cache": True, "vocab_size": 120,
}  # fmt: skip


def _with_config(folder: Path, where: Path, config: dict[str, Any]) -> Path:
    shutil.copytree(folder, where)
    (where / "config.json").write_text(json.dumps(config))
    return where


def test_a_transformers4_config_json_loads_the_same_model(shared, tmp_path: Path) -> None:
    _, _, ours, folder = shared
    again = zoo.load(_with_config(folder, tmp_path / "4x", CONFIG_4X))
    assert again.config == ours.config


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"normalize_before": True}, "normalize_before = True"),
        ({"normalize_embedding": True}, "normalize_embedding = True"),
        ({"add_final_layer_norm": True}, "add_final_layer_norm = True"),
        ({"static_position_embeddings": False}, "static_position_embeddings = False"),
        ({"decoder_attention_heads": 2}, "decoder_attention_heads = 2"),
        ({"decoder_ffn_dim": 64}, "encoder_ffn_dim = 48 but decoder_ffn_dim = 64"),
        ({"activation_function": "tanh"}, "activation_function = 'tanh'"),
        ({"num_hidden_layers": 3}, "num_hidden_layers = 3"),
        ({"decoder_vocab_size": 121}, "decoder_vocab_size = 121"),
        ({"rope_flavour": 2}, "rope_flavour = 2"),
    ],
)
def test_keys_zoo_cannot_honour_are_refused_by_name(
    shared, tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    folder = shared[3]
    with pytest.raises(CheckpointError, match=re.escape(named)):
        zoo.load(_with_config(folder, tmp_path / "bad", {**CONFIG_4X, **change}))


def test_an_older_checkpoint_with_every_tied_copy_loads_and_a_stale_copy_is_refused(
    shared, tmp_path: Path
) -> None:
    """Older transformers saved the tied embedding under every name and the static position
    tables too: the same model loads; a copy that differs from the shared table is refused."""
    _, theirs, ours, folder = shared
    state = load_file(folder / "model.safetensors")
    shared = state["model.shared.weight"]
    state["model.encoder.embed_tokens.weight"] = shared.clone()
    state["model.decoder.embed_tokens.weight"] = shared.clone()
    state["lm_head.weight"] = shared.clone()
    table = theirs.model.encoder.embed_positions.weight.detach().clone()
    state["model.encoder.embed_positions.weight"] = table
    state["model.decoder.embed_positions.weight"] = table.clone()
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    save_file(state, old / "model.safetensors", metadata={"format": "pt"})
    again = zoo.load(old)
    for key, tensor in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], tensor), key
    state["model.decoder.embed_tokens.weight"] = shared + 1
    save_file(state, old / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.decoder\.embed_tokens\.weight differs"):
        zoo.load(old)


def test_a_checkpoint_without_the_logits_bias_loads_it_as_zeros(shared, tmp_path: Path) -> None:
    folder = shared[3]
    state = load_file(folder / "model.safetensors")
    del state["final_logits_bias"]
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    save_file(state, bare / "model.safetensors", metadata={"format": "pt"})
    model = zoo.load(bare)
    assert model.final_logits_bias is not None and not model.final_logits_bias.any()


def test_the_conformance_kit_passes_on_a_folder(shared, capsys) -> None:
    """``zoo check`` on the folder: build, forward, backward, meta, ties, save and load,
    dtypes, bad input, the layout's round trip and cached decoding against recomputation."""
    check_folder(shared[3], capsys)
