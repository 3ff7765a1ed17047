"""Chat fine-tuning (``zoo train --task chat``): which tokens are the replies (transformers'
assistant mask on a template with ``{% generation %}``, prefix renders on one without), the
conversations file checked line by line, rows packed with targets only on replies, a short
fine-tune whose loss falls and whose output keeps its template, and ``zoo chat`` on it (a
child process, stdin piped in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from chat_folders import write_folder

import zoo
from zoo.tokenizers import ChatTemplateError, with_chat_template
from zoo.tokenizers.byte import ByteTokenizer
from zoo.tokenizers.chat_replies import reply_tokens
from zoo.train import DataError, TrainConfig, train
from zoo.train.chat_data import ChatData, for_chat, read_conversations
from zoo.train.data import IGNORE

DATA = Path(__file__).parents[1] / "plugins" / "shakespeare" / "data"
SAMPLE = DATA / "chat-sample.jsonl"
BYTE_TEMPLATE = (DATA / "chat_template.jinja").read_text()

#: A ChatML template (Qwen's turns) without markers, and the same with the reply and its end
#: marked: what prefix renders find is what the marks say.
PLAIN = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MARKED = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|im_end|>\n"
    "{% endgeneration %}{% else %}{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say é ☃ and 🎭"},
        {"role": "assistant", "content": "é ☃ 🎭"},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": "☃"},
    ],
    [{"role": "assistant", "content": "I speak first."}, {"role": "user", "content": "ok"}],
]


def _folders(tmp_path: Path) -> dict[str, Path]:
    return {
        name: write_folder(tmp_path / name, "qwen2.5-instruct", template=source)
        for name, source in (("plain", PLAIN), ("marked", MARKED))
    }


def _hf_masks(folder: Path, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    from transformers import AutoTokenizer

    out = AutoTokenizer.from_pretrained(folder).apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return list(out["input_ids"]), list(out["assistant_masks"])


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_reply_masks_equal_transformers_assistant_masks(tmp_path, messages):
    """With {% generation %} markers: ids and mask are transformers' own. Without them:
    prefix renders mark the same tokens (the reply and its end of turn)."""
    folders = _folders(tmp_path)
    ids, mask = _hf_masks(folders["marked"], messages)
    assert any(mask)
    marked = reply_tokens(zoo.tokenizer(str(folders["marked"])), messages)
    assert marked.marked and (marked.ids, marked.mask) == (ids, mask)
    plain = reply_tokens(zoo.tokenizer(str(folders["plain"])), messages)
    assert not plain.marked and (plain.ids, plain.mask) == (ids, mask)


def test_a_template_that_rewrites_earlier_turns_is_refused_without_markers():
    """Prefix renders need a template that renders by appending; one that does not (it
    writes the number of messages first) is refused, pointing at the markers."""
    counting = "{{ messages | length }}{% for m in messages %}{{ m.content }}{% endfor %}"
    tok = with_chat_template(ByteTokenizer(), counting)
    with pytest.raises(ChatTemplateError, match="generation"):
        reply_tokens(tok, CONVERSATIONS[0])


def test_byte_template_marks_the_reply_and_its_end_token():
    tok = with_chat_template(ByteTokenizer(), BYTE_TEMPLATE)
    replies = reply_tokens(tok, CONVERSATIONS[1])
    reply = tok.decode([i for i, keep in zip(replies.ids, replies.mask, strict=True) if keep])
    assert reply == "é ☃ 🎭<|endoftext|>☃<|endoftext|>"
    assert replies.ids.count(tok.eos_id) == 2


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


GOOD = {"messages": CONVERSATIONS[0]}
#: zoo chat's settings here: short greedy replies.
SAMPLING = ("--max-new-tokens", "6", "--temperature", "0")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "not JSON"),
        ([GOOD], "one JSON object"),
        ({**GOOD, "extra": 1}, "unknown key(s) 'extra'"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role 'wizard'"),
        ({"messages": [{"role": "user", "content": 3}]}, "string 'content'"),
        ({"messages": [{"role": "user", "content": "x", "score": 1}]}, "unknown key(s) 'score'"),
        ({"messages": [{"role": "user", "content": "only a question"}]}, "no assistant"),
        ({**GOOD, "tools": "none"}, "'tools'"),
    ],
)
def test_bad_lines_are_refused_with_their_line_number(tmp_path, bad, message):
    path = _write(tmp_path / "c.jsonl", [GOOD, "", bad])
    with pytest.raises(DataError, match=r"c\.jsonl, line 3: ") as caught:
        read_conversations(path)
    assert message in str(caught.value)


def test_sizes_are_bounded(tmp_path, monkeypatch):
    """A line over MAX_LINE_BYTES, a file over MAX_FILE_BYTES: refused before parsing."""
    import zoo.train.chat_lines as chat  # (the reader's module)

    path = _write(tmp_path / "c.jsonl", [GOOD, GOOD])
    monkeypatch.setattr(chat, "MAX_LINE_BYTES", 64)
    with pytest.raises(DataError, match=r"line 1: longer than"):
        read_conversations(path)
    monkeypatch.setattr(chat, "MAX_FILE_BYTES", 100)
    with pytest.raises(DataError, match=r"c\.jsonl is over"):
        read_conversations(path)


def test_a_conversation_longer_than_a_row_or_a_file_too_small_is_refused(tmp_path):
    tok = with_chat_template(ByteTokenizer(), BYTE_TEMPLATE)
    long = {"messages": [{"role": "user", "content": "x" * 200}, CONVERSATIONS[0][1]]}
    path = _write(tmp_path / "c.jsonl", [GOOD] * 5 + [long] + [GOOD] * 4)
    with pytest.raises(DataError, match=r"line 6: \d+ tokens rendered, more than a row of 129"):
        ChatData.build(read_conversations(path), tok, 128, 0.1, str(path))
    with pytest.raises(DataError, match="too few to hold some out"):
        ChatData.build(read_conversations(_write(path, [GOOD])), tok, 128, 0.1, str(path))


def test_rows_pack_whole_conversations_and_target_only_replies():
    tok = with_chat_template(ByteTokenizer(), BYTE_TEMPLATE)
    conversations = read_conversations(SAMPLE)
    data = ChatData.build(conversations, tok, 128, 0.1, str(SAMPLE))
    assert data.tokens.shape[1] == 129 and data.conversations == len(conversations) == 162
    assert 0 < data.split < len(data.tokens) < len(conversations)  # several to a row
    inputs, targets = data.batch("train", 4, torch.Generator().manual_seed(0))
    assert inputs["input_ids"].shape == targets.shape == (4, 128)
    for row in targets:
        kept = row[row != IGNORE].tolist()
        assert kept and kept.count(tok.eos_id) >= 1
        assert "USER:" not in tok.decode(kept)  # never the prompt


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A tiny byte-level model fine-tuned for chat on the sample, with the byte template."""
    out = tmp_path_factory.mktemp("chat") / "run"
    torch.manual_seed(0)
    model = zoo.build("shakespeare-byte", n_layers=2, d_model=32, n_heads=2, d_ff=64)
    tokenizer = for_chat(model, ByteTokenizer(), BYTE_TEMPLATE)
    config = TrainConfig(
        steps=12, batch_size=4, lr=1e-2, warmup=0, eval_every=0, eval_batches=1, seed=0
    )
    return train(model, SAMPLE, out, config=config, tokenizer=tokenizer, log=None)


def test_a_short_chat_fine_tune_learns_and_keeps_its_template(tuned):
    losses = tuned.losses
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5
    loaded = zoo.load(tuned.checkpoint)
    assert loaded.tokenizer.chat_template == BYTE_TEMPLATE
    assert loaded.tokenizer.encode("hé") == ByteTokenizer().encode("hé")


def test_a_lora_chat_fine_tune_keeps_its_template_in_the_run_folder(tmp_path):
    """With a LoRA the template goes to <out>/tokenizer/, and zoo.load(<out>) (the base with
    its adapter) renders with it."""
    model = zoo.load("shakespeare-byte")  # (the base the adapter records is reloaded)
    tokenizer = for_chat(model, ByteTokenizer(), BYTE_TEMPLATE)
    config = TrainConfig(steps=2, batch_size=2, warmup=0, eval_every=0, eval_batches=1)
    lora = zoo.LoRA(rank=2)
    train(
        model, SAMPLE, tmp_path / "run", config=config, tokenizer=tokenizer, adapter=lora, log=None
    )
    assert zoo.load(tmp_path / "run").tokenizer.chat_template == BYTE_TEMPLATE


def test_zoo_chat_answers_with_the_fine_tuned_model(tuned):
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "zoo.cli", "chat", str(tuned.checkpoint), *SAMPLING],
        input=b"Hello!\nWhat is 2 plus 3?\n/exit\n",
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr.decode()
    assert len(run.stdout.decode("utf-8").splitlines()) == 2  # a reply a line


def test_a_model_without_template_needs_one():
    model = zoo.build("shakespeare-byte", n_layers=1, d_model=16, n_heads=2, d_ff=32)
    with pytest.raises(DataError, match="--chat-template FILE"):
        for_chat(model, ByteTokenizer())


def test_chat_template_flag_goes_with_task_chat(tmp_path, capsys):
    from zoo.cli import main

    template = tmp_path / "t.jinja"
    template.write_text(BYTE_TEMPLATE)
    args = ["train", "--from", "shakespeare-byte", "--data", str(SAMPLE), "--out", "x"]
    assert main([*args, "--chat-template", str(template)]) == 2
    assert "--chat-template renders conversations: it goes with --task chat" in (
        capsys.readouterr().err
    )
    template.write_text("{% for %}")
    assert main([*args, "--task", "chat", "--chat-template", str(template)]) == 2
    assert "t.jinja" in capsys.readouterr().err
