"""Generation's one shape: the core (ids in, ids out, as tensors) gives the tokens the
previous ``zoo.generate`` gave, recorded before the redesign in
``tests/data/generation_golden.json``; the wrappers return exactly their declared types;
streamed pieces join to the text; the settings are one validated ``GenerationConfig``."""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_generation import small

import zoo
from zoo.cli import main
from zoo.errors import ConfigError
from zoo.generation import (
    GenerationConfig,
    generate_ids,
    generate_text,
    generate_texts,
    left_pad,
    stream_ids,
    stream_text,
)

GOLDEN = json.loads((Path(__file__).parent / "data" / "generation_golden.json").read_text())
#: The prompts and sampling settings the golden tokens were recorded with (zoo.generate on
#: lists of ids, before the core existed).
PROMPTS = [[3, 17, 42, 7, 99, 5], [8, 9]]
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": 123}
MODES = {"greedy": {"temperature": 0}, "sampled": SAMPLING}


@pytest.fixture(scope="module")
def gpt2():
    return small("gpt2-124m")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", ["gpt2-124m", "llama-tiny", "transformer-encdec"])
def test_the_core_gives_the_recorded_tokens(name, mode):
    model = small(name)
    ids, keep = left_pad(PROMPTS, torch.device("cpu"))
    config = GenerationConfig(max_new_tokens=10, start_id=1, **MODES[mode])
    out = generate_ids(model, ids, keep, config)
    golden = GOLDEN[name][mode]
    if model.is_encoder_decoder:
        assert out.tolist() == golden  # (B, 1 + N): the start token, then the new tokens
    else:
        assert out.shape == (2, ids.shape[1] + 10)
        for row, prompt, want in zip(out.tolist(), PROMPTS, golden, strict=True):
            assert row[ids.shape[1] - len(prompt) :] == want  # the left padding dropped
    assert zoo.generate(model, PROMPTS, max_new_tokens=10, start_id=1, **MODES[mode]) == golden


@pytest.mark.parametrize("mode", list(MODES))
def test_the_core_stops_rows_at_end_of_text_as_recorded(gpt2, mode):
    golden = GOLDEN["gpt2-124m-eos"]
    eos = golden["eos_id"]
    config = GenerationConfig(max_new_tokens=10, eos_id=eos, vocab_limit=900, **MODES[mode])
    ids, keep = left_pad(PROMPTS, torch.device("cpu"))
    out = generate_ids(gpt2, ids, keep, config).tolist()
    for row, prompt, want in zip(out, PROMPTS, golden[mode], strict=True):
        row = row[ids.shape[1] - len(prompt) :]
        assert row[: len(want)] == want
        assert all(t == eos for t in row[len(want) :])  # an ended row repeats end-of-text
    tensor = torch.tensor([[3, 17, 42], [8, 9, 10]])
    greedy = dataclasses.replace(config, temperature=0.0, seed=None, top_k=None, top_p=None)
    assert generate_ids(gpt2, tensor, None, greedy).tolist() == golden["tensor"]


def test_stream_ids_yields_what_generate_ids_appends(gpt2):
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    config = GenerationConfig(max_new_tokens=7, **SAMPLING)
    steps = list(stream_ids(gpt2, ids, None, config))
    assert len(steps) == 7 and all(s.shape == (2,) for s in steps)
    assert torch.equal(
        generate_ids(gpt2, ids, None, config), torch.cat([ids, torch.stack(steps, 1)], 1)
    )


def test_an_integer_mask_equals_a_bool_mask_and_right_padding_is_refused(gpt2):
    ids, keep = left_pad([[5, 6, 7], [9]], torch.device("cpu"))
    config = GenerationConfig(max_new_tokens=5, temperature=0)
    assert keep is not None
    assert torch.equal(
        generate_ids(gpt2, ids, keep.long(), config), generate_ids(gpt2, ids, keep, config)
    )
    holed = torch.tensor([[True, True, True], [True, False, True]])
    with pytest.raises(ValueError, match=r"padding after a token.*pad on the left only"):
        generate_ids(gpt2, ids, holed, config)
    with pytest.raises(ValueError, match="a prompt is empty"):
        generate_ids(gpt2, ids, torch.zeros_like(ids), config)


def test_the_core_refuses_at_the_call_not_at_the_first_token(gpt2):
    long = torch.ones(1, 60, dtype=torch.long)
    with pytest.raises(ValueError, match="exceeds the context length 64"):
        stream_ids(gpt2, long, None, GenerationConfig(max_new_tokens=10))
    with pytest.raises(ValueError, match="needs start_id"):
        stream_ids(small("transformer-encdec"), torch.tensor([[1, 2]]))


# -- exact return types ---------------------------------------------------------------------
def test_each_form_returns_exactly_its_type(gpt2):
    tok = types.SimpleNamespace(
        name="ids",
        eos_id=None,
        bos_id=None,
        vocab_size=1000,
        encode=lambda text: [int(w) for w in text.split()],
        decode=lambda ids: "".join(f" {i}" for i in ids),
    )
    kw = {"tokenizer": tok, "max_new_tokens": 3, "temperature": 0}
    assert type(zoo.generate(gpt2, "1 2 3", **kw)) is str
    texts = zoo.generate(gpt2, ["1 2 3", "4"], **kw)
    assert type(texts) is list and [type(t) for t in texts] == [str, str]
    stream = zoo.generate(gpt2, "1 2 3", stream=True, **kw)
    assert isinstance(stream, Iterator) and not isinstance(stream, (str, list))
    assert all(type(piece) is str for piece in stream)
    tensor = zoo.generate(gpt2, torch.tensor([[1, 2, 3]]), **kw)
    assert type(tensor) is torch.Tensor and tensor.shape == (1, 6)
    row = zoo.generate(gpt2, [1, 2, 3], **kw)
    assert type(row) is list and all(type(t) is int for t in row) and len(row) == 6
    rows = zoo.generate(gpt2, [[1, 2, 3], [4]], **kw)
    assert type(rows) is list and [len(r) for r in rows] == [6, 4]
    assert all(type(t) is int for r in rows for t in r)
    config = GenerationConfig(max_new_tokens=3, temperature=0)
    assert type(generate_text(gpt2, "1 2 3", config, tokenizer=tok)) is str
    assert generate_texts(gpt2, ["1 2 3", "4"], config, tokenizer=tok) == texts
    assert "".join(stream_text(gpt2, "1 2 3", config, tokenizer=tok)) == texts[0]
    assert type(generate_ids(gpt2, torch.tensor([[1, 2, 3]]), None, config)) is torch.Tensor


def test_the_declared_return_types_are_checked_by_mypy():
    """generate's overloads (each prompt form its own return type) are asserted in
    tests/types_generate.py, which the test command's ``mypy`` reads: it must stay listed."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "tests/types_generate.py" in pyproject["tool"]["mypy"]["files"]
    assert "assert_type(generate(m, [1, 2]), list[int])" in (
        Path(__file__).with_name("types_generate.py").read_text()
    )


# -- streaming ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_streamed_pieces_join_to_the_text(seed):
    """Byte-level: a sampled character may be split across tokens (held back until whole)."""
    model = zoo.load("shakespeare-byte")
    config = GenerationConfig(max_new_tokens=40, temperature=1.3, seed=seed, stop=("\n\n",))
    text = generate_text(model, "ROMEO: é", config)
    pieces = list(stream_text(model, "ROMEO: é", config))
    assert "".join(pieces) == text and "\n\n" not in text


# -- the settings -----------------------------------------------------------------------------
def test_generation_config_is_frozen_and_checks_its_fields():
    config = GenerationConfig(temperature=0, stop="x")
    assert config.temperature == 0.0 and type(config.temperature) is float
    assert config.stop == ("x",) and GenerationConfig(stop=["a", "b"]).stop == ("a", "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 3  # type: ignore[misc]
    for bad, message in [
        ({"max_new_tokens": 1.5}, "GenerationConfig.max_new_tokens must be int"),
        ({"max_new_tokens": True}, "GenerationConfig.max_new_tokens must be int"),
        ({"top_k": "5"}, "GenerationConfig.top_k must be int"),
        ({"compile": 1}, "GenerationConfig.compile must be bool"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"vocab_limit": 0}, "vocab_limit must be a positive integer"),
        ({"seed": 2**64}, r"0 to 2\*\*64 - 1"),
        ({"stop": ("ok", "")}, "stop must be a non-empty string"),
    ]:
        with pytest.raises(ConfigError, match=message):
            GenerationConfig(**bad)


def test_stop_strings_and_streams_need_text(gpt2):
    with pytest.raises(ValueError, match="stop strings cut text"):
        zoo.generate(gpt2, [1, 2, 3], max_new_tokens=2, stop="x")
    with pytest.raises(ValueError, match="stream=True takes a single prompt, a string"):
        zoo.generate(gpt2, [1, 2, 3], max_new_tokens=2, stream=True)  # type: ignore[call-overload]


def test_the_cli_checks_every_setting_before_loading(capsys):
    """A bad setting is reported before the model is looked up (here: none exists)."""
    code = main(["generate", "no-such-model", "hi", "--top-p", "2"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "top_p must be in (0, 1]" in err
