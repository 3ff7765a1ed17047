"""Chat fine-tuning data checked line by line: OpenAI's fine-tuning types
(``"tool_calls": "rm -rf"`` was once accepted), a lone surrogate refused with its line, the file
checked in one streaming pass that holds one line at a time (11 MB once took 105 s and 589 MB
before step 1), and ``weight`` 0 replies left out of the loss."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
import torch

from zoo.tokenizers import with_chat_template
from zoo.tokenizers.byte import ByteTokenizer
from zoo.train import DataError
from zoo.train.chat_data import (
    ChatData,
    count_conversations,
    iter_conversations,
    read_conversations,
)
from zoo.train.data import IGNORE

DATA = Path(__file__).parents[1] / "plugins" / "shakespeare" / "data"
BYTE_TEMPLATE = (DATA / "chat_template.jinja").read_text()
USER = {"role": "user", "content": "Hi"}
REPLY = {"role": "assistant", "content": "Hello!"}
GOOD = {"messages": [USER, REPLY]}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _with(**assistant: object) -> dict[str, object]:
    return {"messages": [USER, {"role": "assistant", **assistant}]}


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (_with(content=None, tool_calls="rm -rf"), "tool_calls must be a non-empty list"),
        (_with(content=None, tool_calls=[]), "tool_calls must be a non-empty list"),
        (_with(content=None, tool_calls=["rm -rf"]), "tool_calls[0] must be an object"),
        (_with(content=None, tool_calls=[{**CALL, "id": 7}]), "tool_calls[0].id must be a"),
        (_with(content=None, tool_calls=[{**CALL, "type": "shell"}]), ".type must be 'function'"),
        (
            _with(content=None, tool_calls=[{**CALL, "function": {"name": "f", "arguments": {}}}]),
            "function.arguments must be a string, got an object",
        ),
        (_with(content=None, tool_calls=[{**CALL, "function": {"name": "f"}}]), "no 'arguments'"),
        (_with(content=None, tool_calls=[{**CALL, "x": 1}]), "unknown key(s) 'x'"),
        ({"messages": [{**USER, "tool_calls": [CALL]}, REPLY]}, "only the assistant's"),
        ({"messages": [{**USER, "tool_call_id": "c"}, REPLY]}, "only the tool's messages"),
        ({"messages": [{"role": "tool", "content": "", "tool_call_id": 1}, REPLY]}, "_call_id"),
        (_with(content="x", name=3), ".name must be a string, got a number"),
        (_with(content="x", weight=2), "weight must be 0 or 1"),
        (_with(content="x", weight=True), "weight must be 0 or 1"),
        (_with(content="x", weight=0), "no reply to learn"),
        (_with(content=["x"]), "needs a string 'content'"),
        (_with(content=None), "null only beside 'tool_calls'"),
        ({**GOOD, "tools": [1]}, "tools[0] must be an object"),
        ({**GOOD, "tools": [{"type": "function", "function": {}}]}, "function has no 'name'"),
        ({**GOOD, "tools": [{**TOOL, "type": "code"}]}, "tools[0].type must be 'function'"),
        ({**GOOD, "tools": "none"}, "'tools' must be a list"),
    ],
)
def test_lines_are_checked_against_openai_s_types(tmp_path, bad, message):
    path = _write(tmp_path / "c.jsonl", [GOOD, "", bad])
    with pytest.raises(DataError, match=r"c\.jsonl, line 3: ") as caught:
        count_conversations(path)
    assert message in str(caught.value)


def test_openai_s_tool_calls_tools_names_and_weights_are_taken(tmp_path):
    lines = [
        {
            "messages": [
                {"role": "system", "content": "s", "name": "rules"},
                USER,
                {"role": "assistant", "content": None, "tool_calls": [CALL], "weight": 0},
                {"role": "tool", "content": "42", "tool_call_id": "call_1"},
                {**REPLY, "weight": 1},
            ],
            "tools": [TOOL],
        },
        {"messages": [{"role": "user", "content": "\ud83c\udfad"}, REPLY]},  # a pair: one char
    ]
    path = _write(tmp_path / "c.jsonl", lines)
    assert count_conversations(path) == 2
    assert read_conversations(path)[1].messages[0]["content"] == "🎭"


def test_a_lone_surrogate_is_refused_with_its_line_and_place(tmp_path):
    path = tmp_path / "c.jsonl"
    lone = '{"messages": [{"role": "user", "content": "a\\udc80"}]}'
    path.write_text(json.dumps(GOOD) + "\n" + lone + "\n")
    with pytest.raises(DataError, match=r"line 2: messages\[0\]\.content holds a lone surrogate"):
        count_conversations(path)


def test_bytes_that_are_not_utf8_are_refused_with_their_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"messages": "\xff"}\n')
    with pytest.raises(DataError, match=r"line 2: not UTF-8 \(byte 0xff at column 15\)"):
        count_conversations(path)


def test_the_check_streams_one_line_at_a_time(tmp_path):
    """Python's allocations while checking 2 MB of conversations stay under 1 MB, whatever
    the file's size (the file, its lines and every parsed line were held before)."""
    line = json.dumps({"messages": [{"role": "user", "content": "to be " * 8}, REPLY]})
    path = tmp_path / "c.jsonl"
    path.write_text((line + "\n") * (2_000_000 // len(line)))
    tracemalloc.start()
    try:
        count = count_conversations(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 2_000_000 // len(line)
    assert peak < 1_000_000, peak


def test_a_bad_last_line_is_found_before_anything_is_rendered(tmp_path, monkeypatch):
    import zoo.tokenizers.chat_replies as replies
    from zoo.train.chat_data import read_chat
    from zoo.train.task import DataRequest

    rendered = []
    monkeypatch.setattr(replies, "reply_spans", lambda *a, **k: rendered.append(1))
    path = _write(tmp_path / "c.jsonl", [GOOD] * 50 + [_with(content=None, tool_calls="x")])
    tok = with_chat_template(ByteTokenizer(), BYTE_TEMPLATE)
    request = DataRequest(path, tok, tmp_path, 128, 0.1, None)  # type: ignore[arg-type]
    model = type("M", (), {"is_encoder_decoder": False})()
    with pytest.raises(DataError, match="line 51: message 1"):
        read_chat(model, request)  # type: ignore[arg-type]
    assert not rendered


def test_a_streamed_build_packs_as_the_list_and_weight_0_is_not_learned(tmp_path):
    tok = with_chat_template(ByteTokenizer(), BYTE_TEMPLATE)
    first = {"role": "assistant", "content": "NOT THIS"}
    lines = [GOOD] * 9 + [{"messages": [USER, {**first, "weight": 0}, USER, REPLY]}] * 3
    path = _write(tmp_path / "c.jsonl", lines)
    listed = ChatData.build(read_conversations(path), tok, 128, 0.25, str(path))
    streamed = ChatData.build(iter_conversations(path), tok, 128, 0.25, str(path), len(lines))
    assert torch.equal(listed.tokens, streamed.tokens) and listed.split == streamed.split
    assert streamed.tokens.dtype == torch.int16  # 257 ids: two bytes a token
    inputs, targets = streamed.batch("held", 8, torch.Generator().manual_seed(0))
    assert inputs["input_ids"].dtype == torch.long
    learned = tok.decode([t for t in targets.flatten().tolist() if t != IGNORE])
    assert "Hello!" in learned and "NOT THIS" not in learned
    assert "NOT THIS" in tok.decode(inputs["input_ids"][0].tolist())  # it is still read


def test_the_command_line_checks_the_file_before_torch_is_imported(tmp_path):
    """zoo train --task chat: a bad line (the last of 2,000) is said in one line, exit 2,
    before torch is imported (it came after the model was built and the memory checked)."""
    import os
    import subprocess
    import sys

    path = _write(tmp_path / "c.jsonl", [GOOD] * 1999 + [_with(content=None, tool_calls="rm")])
    argv = ["train", "--from", "shakespeare-byte", "--task", "chat", "--data", str(path),
            "--out", str(tmp_path / "o")]  # fmt: skip
    probe = (
        "import sys, contextlib, io\nfrom zoo.cli import main\nerr = io.StringIO()\n"
        "with contextlib.redirect_stderr(err):\n    code = main(sys.argv[1:])\n"
        "print(code, 'torch' in sys.modules, repr(err.getvalue()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    code, torch_imported, err = done.stdout.split(" ", 2)
    assert (code, torch_imported) == ("2", "False"), done.stdout
    assert "c.jsonl, line 2000: message 1 (assistant).tool_calls must be a non-empty" in err
