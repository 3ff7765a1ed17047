"""T5 against transformers' ``T5ForConditionalGeneration``, v1.0 (ReLU, a tied head whose
input is scaled by ``d_model ** -0.5``) and v1.1 / Flan-T5 (gated GELU, a head of its own, as
their 4.x config.json says ``tie_word_embeddings: false``): a folder loads in zoo with the
same logits on a right-padded batch (sources longer than the bias's ``max_distance``, so the
logarithmic buckets count), the same greedy tokens and the same logits at every cached step;
each T5 seam zoo declares moves the logits; both transformers generations' ``config.json``
load; keys zoo cannot honour are refused by name; ``zoo.export`` writes a folder
transformers loads to the same logits. transformers 5's T5 ``generate`` fails when the
stacks' depths differ, so the geometry with unequal depths compares logits only. No official
config is vendored (no network here)."""

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
    step_logits_diff,
)
from zoo_plugins.t5.config import T5Config
from zoo_plugins.t5.positions import relative_buckets
from zoo_plugins.transformer_encdec.model import EncoderDecoder

import zoo
from zoo.errors import CheckpointError

_SIZES = {"vocab_size": 99, "d_model": 32, "d_ff": 48, "num_heads": 4}
#: Tiny geometries: transformers' T5Config values (T5's ids: pad 0 = decoder start, eos 1).
GEOMETRIES: dict[str, dict[str, Any]] = {
    "v1.0-relu": {**_SIZES, "d_kv": 8, "num_layers": 2,
                  "relative_attention_num_buckets": 8, "relative_attention_max_distance": 12},
    "v1.1-gated-gelu-own-head": {**_SIZES, "d_kv": 12, "num_layers": 2,
                                 "feed_forward_proj": "gated-gelu",
                                 "relative_attention_num_buckets": 10,
                                 "relative_attention_max_distance": 9},
    "unequal-depths-gated-silu": {**_SIZES, "d_kv": 8, "num_layers": 1,
                                  "num_decoder_layers": 3, "feed_forward_proj": "gated-silu"},
}  # fmt: skip
OWN_HEAD = {"v1.1-gated-gelu-own-head"}
START, EOS = 0, 1


def _untie(folder: Path) -> None:
    """``folder`` as transformers 4.x wrote a v1.1 checkpoint: a head of its own
    (``lm_head.weight``) and ``tie_word_embeddings: false``, no 5.x keys."""
    state = load_file(folder / "model.safetensors")
    g = torch.Generator().manual_seed(7)
    state["lm_head.weight"] = torch.randn(state["shared.weight"].shape, generator=g) * 0.15
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    for key in ("scale_decoder_outputs", "dense_act_fn", "is_gated_act"):
        config.pop(key)
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))


def _pair(name: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    """(geometry name, transformers' model and zoo's, both loaded from one folder, folder)."""
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**GEOMETRIES[name]))
    randomize(model, std=0.15)
    folder = tmp_path_factory.mktemp(f"t5-{name}")
    model.save_pretrained(folder)
    if name in OWN_HEAD:
        _untie(folder)
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
    ours = zoo.load(folder)
    assert isinstance(ours, EncoderDecoder) and isinstance(ours.config, T5Config)
    return name, theirs, ours, folder


@pytest.fixture(scope="module", params=sorted(GEOMETRIES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Each geometry's pair (:func:`_pair`)."""
    return _pair(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def v10(tmp_path_factory: pytest.TempPathFactory):
    """The v1.0 pair, for the checks one geometry makes."""
    return _pair("v1.0-relu", tmp_path_factory)


def _batch() -> tuple[torch.Tensor, ...]:
    return padded_pair(_SIZES["vocab_size"], _SIZES["vocab_size"])


def test_logits_match_on_a_right_padded_batch(pair) -> None:
    name, theirs, ours, _ = pair
    assert max_logit_diff(ours, theirs, _batch()) <= 1e-4
    c = ours.config
    own = name in OWN_HEAD
    assert (c.tie_embeddings, c.scale_decoder_output) == (not own, not own)
    assert (ours.head.weight is ours.tok_emb.weight) == (not own)
    assert theirs.config.scale_decoder_outputs == c.scale_decoder_output


#: T5 with one seam of zoo's declared as another family has it.
CHANGES: list[dict[str, Any]] = [
    {"attn_scale": None},  # scores scaled by head_dim ** -0.5
    {"separate_source_positions": False},  # the decoder's buckets for the encoder too
    {"scale_decoder_output": True},
    {"norm": "layernorm"},
    {"relative_attention_max_distance": 40},
    {"relative_attention_num_buckets": 6},
]


def _changed(model: EncoderDecoder, key: str, value: Any) -> EncoderDecoder:
    if getattr(model.config, key) == value:
        value = not value
    config = model.config.replace(**{key: value})
    other = EncoderDecoder(config, zoo.get_registry().parts(config))
    state = model.state_dict()
    if key == "relative_attention_num_buckets":  # the first buckets of the tables
        state = {k: v[:value] if "pos_emb" in k else v for k, v in state.items()}
    other.load_state_dict(state, strict=False)
    return other.eval()


def test_every_seam_moves_the_logits(pair) -> None:
    """zoo's model with one T5 seam changed is far from transformers: each is needed."""
    _, theirs, ours, _ = pair
    for change in CHANGES:
        ((key, value),) = change.items()
        assert max_logit_diff(_changed(ours, key, value), theirs, _batch()) > 1e-2, change


def test_the_buckets_are_transformers(v10) -> None:
    """zoo's buckets are ``T5Attention._relative_position_bucket``'s, both directions, for
    distances well past ``max_distance``."""
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-300, 300)[None]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 12), (10, 9)):
            want = T5Attention._relative_position_bucket(
                relative, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance
            )
            got = relative_buckets(
                relative, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance
            )
            assert torch.equal(got, want), (bidirectional, buckets, distance)


#: The geometries whose stacks are equally deep: transformers 5's T5 generate fails otherwise.
EQUAL_DEPTHS = sorted(
    name
    for name, values in GEOMETRIES.items()
    if values.get("num_decoder_layers", values["num_layers"]) == values["num_layers"]
)


@pytest.mark.parametrize("name", EQUAL_DEPTHS)
def test_greedy_tokens_and_step_logits_equal_transformers_on_a_padded_batch(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``zoo.generate`` gives transformers' greedy tokens for right-padded sources (longer
    than ``max_distance``), row for row, and the cached session's logits at every step are
    transformers'."""
    _, theirs, ours, _ = _pair(name, tmp_path_factory)
    g = torch.Generator().manual_seed(5)
    sources = [torch.randint(2, 99, (n,), generator=g).tolist() for n in (15, 4, 9)]
    got, want = greedy_pair(ours, theirs, sources, start=START, eos=EOS, new=16)
    assert got == want
    assert step_logits_diff(ours, theirs, sources, start=START, eos=EOS, new=16) <= 1e-4


def test_export_loads_in_transformers_to_the_same_logits(pair, tmp_path: Path) -> None:
    _, _, ours, _ = pair
    zoo.export(ours, tmp_path / "out")
    back = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    assert max_logit_diff(ours, back, _batch()) <= 1e-5
    again = zoo.load(tmp_path / "out")
    assert again.config == ours.config
    for key, tensor in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], tensor), key


#: ``google-t5/t5-small``'s config.json as transformers 4.x wrote it (its keys and kinds of
#: value, at this test's sizes).
CONFIG_4X: dict[str, Any] = {
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 48, "d_kv": 8, "d_model": 32,
    "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1,
    "initializer_factor": 1.0, "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06,
    "model_type": "t5", "n_positions": 512, "num_heads": 4, "num_layers": 2,
    "output_past": True, "pad_token_id": 0, "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 12,
    "task_specific_params": {"translation_en_to_de": {"prefix": "translate English to German: "}},
    "vocab_size": 99,
}  # fmt: skip


def _with_config(folder: Path, where: Path, config: dict[str, Any]) -> Path:
    shutil.copytree(folder, where)
    (where / "config.json").write_text(json.dumps(config))
    return where


def test_a_transformers4_config_json_loads_the_same_model(v10, tmp_path: Path) -> None:
    _, _, ours, folder = v10
    assert zoo.load(_with_config(folder, tmp_path / "4x", CONFIG_4X)).config == ours.config


def test_a_head_of_its_own_saved_by_transformers5_loads_untied(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """transformers 5 saves Flan-T5 (a head of its own, unscaled) with
    ``tie_word_embeddings: true`` and ``scale_decoder_outputs: false``, both weights kept:
    zoo reads the head as its own (it read it tied, then refused the second weight; the
    kit's config round trip through transformers found it)."""
    _, theirs, ours, _ = _pair("v1.1-gated-gelu-own-head", tmp_path_factory)
    folder = tmp_path_factory.mktemp("t5-saved-by-5")
    theirs.save_pretrained(folder)
    written = json.loads((folder / "config.json").read_text())
    assert (written["tie_word_embeddings"], written["scale_decoder_outputs"]) == (True, False)
    again = zoo.load(folder)
    assert again.config == ours.config and not again.config.tie_embeddings
    assert max_logit_diff(again, theirs, _batch()) <= 1e-4


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"feed_forward_proj": "gated-relu"}, "feed_forward_proj = 'gated-relu'"),
        ({"feed_forward_proj": "gated-gelu", "dense_act_fn": "gelu"}, "dense_act_fn = 'gelu'"),
        ({"is_decoder": True}, "is_decoder = True"),
        ({"relative_attention_num_buckets": 2}, "relative_attention_num_buckets = 2"),
        ({"rope_flavour": 2}, "rope_flavour = 2"),
    ],
)
def test_keys_zoo_cannot_honour_are_refused_by_name(
    v10, tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    folder = v10[3]
    with pytest.raises(CheckpointError, match=re.escape(named)):
        zoo.load(_with_config(folder, tmp_path / "bad", {**CONFIG_4X, **change}))


def test_a_head_of_its_own_under_a_config_that_ties_it_loads_as_transformers_loads_it(
    v10, tmp_path: Path
) -> None:
    """transformers 5 writes ``tie_word_embeddings: true`` for every T5 and ties the head
    only where the checkpoint holds none: a v1.0 (scaled) head beside ``shared`` loads as a
    head of its own, in transformers and in zoo (which refused it)."""
    folder = v10[3]
    own = tmp_path / "own"
    shutil.copytree(folder, own)
    state = load_file(own / "model.safetensors")
    state["lm_head.weight"] = state["shared.weight"] + 1
    save_file(state, own / "model.safetensors", metadata={"format": "pt"})
    ours = zoo.load(own)
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(own).eval()
    assert not ours.config.tie_embeddings and ours.config.scale_decoder_output
    assert ours.head.weight is not ours.tok_emb.weight
    assert max_logit_diff(ours, theirs, _batch()) <= 1e-4


def test_a_transformers4_file_without_a_head_is_tied_whatever_it_says(v10, tmp_path: Path):
    folder = v10[3]
    tied = zoo.load(
        _with_config(folder, tmp_path / "4x", {**CONFIG_4X, "tie_word_embeddings": False})
    )
    assert tied.config.tie_embeddings and not tied.config.scale_decoder_output


@pytest.mark.parametrize("name", ["v1.0-relu", "v1.1-gated-gelu-own-head"])
def test_the_conformance_kit_passes_on_a_folder(
    name: str, tmp_path_factory: pytest.TempPathFactory, capsys
) -> None:
    """``zoo check`` on the folder, a tied and scaled head and one of its own (see
    tests/test_family_marian.py)."""
    check_folder(_pair(name, tmp_path_factory)[3], capsys)
