"""Configs are frozen and validated; every bad value names the field and why."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import zoo
from zoo.errors import ConfigError, UnknownModelError


def test_build_carries_the_frozen_config_and_name():
    model = zoo.build("gpt2", n_layers=1)  # alias
    assert model.name == "gpt2-124m"
    assert model.config.n_layers == 1 and model.config.d_model == 768
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.config.n_layers = 3


def test_build_from_a_config_instance():
    _, _, config = zoo.resolve_config("gpt1", n_layers=1)
    model = zoo.build(config, d_ff=64)
    assert model.name is None and model.config.d_ff == 64 and model.config.n_layers == 1


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"d_model": 100}, ["d_model", "divisible by n_heads = 12"]),
        ({"n_layers": -1}, ["n_layers", "positive"]),
        ({"vocab_size": 0}, ["vocab_size", "positive"]),
        ({"positions": "rotary-ish"}, ["positions", "learned", "sinusoidal"]),
        ({"activation": "swish"}, ["activation", "'gelu'"]),
        ({"dropout": 1.5}, ["dropout", "[0, 1)"]),
        ({"d_model": "768"}, ["d_model", "must be int", "str"]),
        ({"n_layers": True}, ["n_layers", "must be int", "bool"]),
        ({"head_bias": True}, ["head_bias", "tie_embeddings=False"]),
    ],
)
def test_invalid_values_name_the_field(overrides, words):
    with pytest.raises(ConfigError) as err:
        zoo.build("gpt2-124m", device="meta", **overrides)
    for word in words:
        assert word in str(err.value)


def test_unknown_override_lists_valid_fields():
    with pytest.raises(ConfigError) as err:
        zoo.build("gpt2-124m", n_layer=2)
    message = str(err.value)
    assert "'n_layer'" in message and "Did you mean 'n_layers'" in message
    assert "context_length" in message  # the valid fields are listed


def test_encoder_decoder_uses_its_own_layer_fields():
    with pytest.raises(ConfigError, match="n_layers"):
        zoo.build("transformer-encdec", n_layers=2)
    model = zoo.build("transformer-encdec", device="meta", n_encoder_layers=2, n_decoder_layers=3)
    assert len(model.encoder) == 2 and len(model.decoder) == 3


def test_unknown_model_suggests_close_matches():
    with pytest.raises(UnknownModelError) as err:
        zoo.build("gpt2-125m")
    assert "gpt2-124m" in str(err.value) and "zoo list" in str(err.value)


def test_ints_widen_to_float_fields():
    assert zoo.build("gpt1", device="meta", dropout=0).config.dropout == 0.0


def test_dtype_must_be_floating():
    with pytest.raises(ConfigError, match="floating"):
        zoo.build("gpt1", device="meta", dtype=torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtype_argument(dtype):
    model = zoo.build("wiki-gpt-wordpiece", dtype=dtype, n_layers=1)
    assert {p.dtype for p in model.parameters()} == {dtype}
