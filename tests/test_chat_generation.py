"""Generation ends at any of the model's end ids (Qwen: ``<|im_end|>`` and
``<|endoftext|>``), taken from the tokenizer unless the settings say otherwise."""

from __future__ import annotations

import types

import pytest
import torch
from chat_folders import token_id, write_folder

import zoo
from zoo.errors import ConfigError
from zoo.generation import GenerationConfig, stream_continuation

IM_END, END_OF_TEXT = token_id("<|im_end|>"), token_id("<|endoftext|>")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A tiny Llama-shaped model with a Qwen-style tokenizer folder (end ids: <|im_end|>,
    then <|endoftext|>)."""
    folder = write_folder(tmp_path_factory.mktemp("tok") / "qwen", "qwen2.5-instruct")
    tok = zoo.tokenizer(str(folder))
    torch.manual_seed(0)
    model = zoo.build("llama-tiny", vocab_size=tok.vocab_size, context_length=512).eval()
    model.tokenizer = tok
    return model, tok


def script(monkeypatch, picks: list[int]) -> None:
    """Make the picker pick ``picks`` in order (the model still runs every step)."""
    steps = iter(picks)

    def pick(logits, **_):
        return torch.full((logits.shape[0],), next(steps), dtype=torch.long)

    monkeypatch.setattr("zoo.generation.sampling.next_tokens", pick)


def test_the_tokenizer_gives_both_end_ids(qwen):
    _, tok = qwen
    assert tok.eos_id == IM_END and tok.end_ids == (IM_END, END_OF_TEXT)


def test_generation_stops_at_the_second_end_id(qwen, monkeypatch):
    model, tok = qwen
    h, i = tok.encode("H"), tok.encode("i")
    picks = [*h, *i, END_OF_TEXT, *h, *h, *h]
    script(monkeypatch, picks)
    assert zoo.generate(model, "Say hi", max_new_tokens=6) == "Hi"
    script(monkeypatch, picks)
    assert "".join(zoo.generate(model, "Say hi", max_new_tokens=6, stream=True)) == "Hi"
    prompt = tok.encode("Say hi")
    script(monkeypatch, picks)
    ids = zoo.generate(model, prompt, max_new_tokens=6)
    assert ids == [*prompt, *h, *i, END_OF_TEXT]  # ids out: up to and with the end id
    script(monkeypatch, picks)
    out = zoo.generate(model, torch.tensor([prompt]), max_new_tokens=6)
    assert out[0, len(prompt) :].tolist() == [*h, *i, END_OF_TEXT]  # nothing after it


def test_a_row_that_ended_on_either_id_repeats_the_first(qwen, monkeypatch):
    model, _ = qwen

    def pick(logits, **_):  # row 0 ends on <|endoftext|> at once, row 1 goes on
        return torch.tensor([END_OF_TEXT, 72][: logits.shape[0]], dtype=torch.long)

    monkeypatch.setattr("zoo.generation.sampling.next_tokens", pick)
    rows = zoo.generate(model, [[72, 105], [72]], max_new_tokens=3)
    assert rows == [[72, 105, END_OF_TEXT], [72, 72, 72, 72]]
    config = GenerationConfig(max_new_tokens=3, eos_id=IM_END, stop_ids=(END_OF_TEXT,))
    new = zoo.generation.generate_ids(model, torch.tensor([[72, 105], [72, 72]]), None, config)
    assert new[0, 2:].tolist() == [END_OF_TEXT, IM_END, IM_END]


def test_without_scripting_a_greedy_run_stops_at_a_stop_id(qwen):
    """The same with the model's own greedy picks: the third new token made an end id."""
    model, _ = qwen
    prompt = torch.tensor([[72, 105, 33]])
    free = GenerationConfig(max_new_tokens=8, temperature=0, stop_ids=())
    tokens = zoo.generation.generate_ids(model, prompt, None, free)[0, 3:].tolist()
    first = tokens.index(tokens[2])  # where that token first appears
    ended = GenerationConfig(max_new_tokens=8, temperature=0, eos_id=300, stop_ids=(tokens[2],))
    out = zoo.generation.generate_ids(model, prompt, None, ended)[0, 3:].tolist()
    assert out[: first + 1] == tokens[: first + 1] and set(out[first + 1 :]) <= {300}


def test_explicit_settings_win_over_the_tokenizer(qwen, monkeypatch):
    model, tok = qwen
    picks = [72, END_OF_TEXT, 105, IM_END, 72]
    script(monkeypatch, picks)
    # eos_id given: the tokenizer's other end ids are not added
    ids = zoo.generation.generate_ids(
        model, torch.tensor([[72]]), None, GenerationConfig(max_new_tokens=5, eos_id=IM_END)
    )
    assert ids[0].tolist() == [72, 72, END_OF_TEXT, 105, IM_END]
    # stop_ids=() given: only the tokenizer's eos ends the text
    script(monkeypatch, picks)
    config = GenerationConfig(max_new_tokens=5, stop_ids=())
    assert zoo.generation.generate_text(model, "H", config, tokenizer=tok) == "H<|endoftext|>i"


def test_a_chat_prompt_streams_until_the_end_of_turn(qwen, monkeypatch):
    model, tok = qwen
    conversation = [{"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(conversation, add_generation_prompt=True)
    prompt = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    assert text.endswith("<|im_start|>assistant\n")
    opening = [token_id("<|im_start|>"), *tok.encode("assistant\n")]  # a control token's id
    assert prompt[-len(opening) :] == opening
    script(monkeypatch, [*tok.encode("Yo"), IM_END, 72])
    config = GenerationConfig(max_new_tokens=4)
    assert "".join(stream_continuation(model, prompt, config)) == "Yo"


def test_duck_typed_tokenizers_without_end_ids_still_work(qwen, monkeypatch):
    model, _ = qwen
    script(monkeypatch, [72, 5, 72])
    tok = types.SimpleNamespace(eos_id=5, bos_id=None, vocab_size=278)
    assert zoo.generate(model, [72], tokenizer=tok, max_new_tokens=3) == [72, 72, 5]


@pytest.mark.parametrize(
    ("stop_ids", "message"),
    [((-1,), "stop_ids must be token ids"), ((1.5,), r"stop_ids\[0\] must be int"),
     ((True,), r"stop_ids\[0\] must be int, got bool"), ("5", "stop_ids must be")],
)  # fmt: skip
def test_bad_stop_ids_are_config_errors(stop_ids, message):
    with pytest.raises(ConfigError, match=message):
        GenerationConfig(stop_ids=stop_ids)


def test_end_ids_put_eos_first_without_repeats():
    assert GenerationConfig(eos_id=3, stop_ids=[4, 3, 5]).end_ids == (3, 4, 5)
    assert GenerationConfig(stop_ids=(4,)).end_ids == (4,)
    assert GenerationConfig().end_ids == ()
