"""``zoo chat``: lines from standard input are messages, replies stream to standard output,
the conversation is kept (re-rendered through the template every turn), /reset and /exit
work, and a model without a chat template is a one-line error with exit code 2. Driven as a
user drives it: a child process with a pipe for stdin."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from chat_folders import write_folder

import zoo
from zoo.generation import GenerationConfig, stream_continuation

#: The generation settings of these tests (greedy).
SAMPLING = ("--max-new-tokens", "8", "--temperature", "0")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama-shaped model saved with a tokenizer folder's tokenizer (TinyLlama's
    chat template, a context long enough for a few turns). Its weights are scaled up: at
    their initial scale its replies hardly depend on the prompt, so a chat that lost its
    history would print the same."""
    root = tmp_path_factory.mktemp("chat")
    tok = zoo.tokenizer(str(write_folder(root / "tok", "tinyllama-chat")))
    torch.manual_seed(0)
    model = zoo.build("llama-tiny", vocab_size=tok.vocab_size, context_length=1024)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.ndim == 2:
                weight.mul_(8)
    return zoo.save(model, root / "model", tokenizer=tok)


def chat(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    """``zoo chat ARGS`` with ``stdin`` piped in; its output exactly as written (no newline
    translation: a reply may hold a carriage return)."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "zoo.cli", "chat", *args],
        input=stdin.encode("utf-8"),
        capture_output=True,
        env=env,
        timeout=300,
    )
    out, err = run.stdout.decode("utf-8"), run.stderr.decode("utf-8")
    return subprocess.CompletedProcess(run.args, run.returncode, out, err)


def replies(checkpoint, turns: list[str | None], system: str | None = None) -> str:
    """What ``zoo chat`` prints for ``turns`` (``None``: /reset), computed here in the same
    way: each reply generated from the whole conversation so far, rendered by the template."""
    model = zoo.load(checkpoint)
    config = GenerationConfig(max_new_tokens=8, temperature=0)
    opening = [] if system is None else [{"role": "system", "content": system}]
    history, out = list(opening), []
    for message in turns:
        if message is None:
            history = list(opening)
            continue
        history.append({"role": "user", "content": message})
        ids = model.tokenizer.apply_chat_template(
            history, add_generation_prompt=True, tokenize=True
        )
        reply = "".join(stream_continuation(model, ids, config))
        history.append({"role": "assistant", "content": reply})
        out.append(reply + "\n")
    return "".join(out)


def test_chat_keeps_the_conversation_and_resets(checkpoint):
    run = chat(
        str(checkpoint),
        *SAMPLING,
        stdin="Hello there\nAnd then?\n\n/reset\nHello there\n  /exit  \nnot read\n",
    )
    assert run.returncode == 0, run.stderr
    assert "(conversation cleared)" in run.stderr
    expected = replies(checkpoint, ["Hello there", "And then?", None, "Hello there"])
    assert run.stdout == expected
    # guard: had the second turn not seen the first, or /reset not cleared it, the text differs
    one_by_one = "".join(replies(checkpoint, [m]) for m in ["Hello there", "And then?"])
    assert expected != one_by_one + replies(checkpoint, ["Hello there"])
    assert expected != replies(checkpoint, ["Hello there", "And then?", "Hello there"])


def test_chat_ends_at_end_of_input_and_takes_a_system_message(checkpoint):
    system = "You answer in one word."
    run = chat(str(checkpoint), "--system", system, *SAMPLING, stdin="Hi")  # no /exit
    assert run.returncode == 0, run.stderr
    assert run.stdout == replies(checkpoint, ["Hi"], system=system)
    assert run.stdout != replies(checkpoint, ["Hi"])  # the system message changed the prompt


def test_a_model_without_a_chat_template_is_a_one_line_error(tmp_path):
    tok = zoo.tokenizer(str(write_folder(tmp_path / "tok", "tinyllama-chat", template="")))
    model = zoo.build("llama-tiny", vocab_size=tok.vocab_size)
    saved = zoo.save(model, tmp_path / "model", tokenizer=tok)
    run = chat(str(saved), stdin="Hello\n")
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zoo: error: ")
    assert "has no chat template" in lines[0] and "tokenizer_config.json" in lines[0]


def test_a_turn_the_template_refuses_is_reported_and_the_chat_goes_on(tmp_path, capsys):
    """A template that refuses every conversation: each turn is reported on stderr and left
    out, and the chat goes on until the input ends (exit 1: turns went unanswered)."""
    from zoo.cli import main

    tok = zoo.tokenizer(str(write_folder(tmp_path / "tok", "tinyllama-chat")))
    model = zoo.build("llama-tiny", vocab_size=tok.vocab_size)
    saved = zoo.save(model, tmp_path / "model", tokenizer=tok)
    bad = "{% for m in messages %}{{ raise_exception('no ' + m.role) }}{% endfor %}"
    refusing = write_folder(tmp_path / "refusing", "tinyllama-chat", template=bad)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", _Lines("Hi\nHi again\n"))
        code = main(["chat", str(saved), "--tokenizer", str(refusing), "--max-new-tokens", "3"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.count("zoo: error: the chat template refused the conversation: no user") == 2


#: zoo chat's sampling flags at their extremes: each leaves only the most likely token.
AS_GREEDY = [
    ("--temperature", "1", "--top-p", "1e-300"),  # torch.multinomial once failed here
    ("--temperature", "1e300", "--top-p", "5e-324", "--seed", "18446744073709551615"),
    ("--temperature", "5e-324", "--top-k", str(1 << 24), "--seed=-9223372036854775808"),
    ("--temperature", "1.7e308", "--top-k", "1", "--top-p", "1"),
]


def test_chat_keeps_the_most_likely_token_at_every_extreme(checkpoint, capsys):
    """Each extreme of zoo chat's sampling flags gives the greedy reply; ones that sample
    among every token give a reply too (in-process: one load per run, no interpreter)."""
    from zoo.cli import main

    greedy = replies(checkpoint, ["Hi"])
    runs = [*AS_GREEDY, ("--temperature", "1e300", "--top-k", "100000", "--top-p", "1")]
    for flags in runs:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("sys.stdin", _Lines("Hi\n"))
            code = main(["chat", str(checkpoint), "--max-new-tokens", "8", *flags])
        out, err = capsys.readouterr()
        assert code == 0 and err == "", (flags, err)
        assert out == greedy or (flags not in AS_GREEDY and out.endswith("\n")), flags


class _Lines:
    """A text standard input without a byte buffer (as a test or an embedding program
    gives)."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)

    def isatty(self) -> bool:
        return False

    def readline(self) -> str:
        return self.lines.pop(0) if self.lines else ""


def test_chat_help_names_its_commands():
    run = subprocess.run(
        [sys.executable, "-m", "zoo.cli", "chat", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0
    for option in ("--system", "--max-new-tokens", "--temperature", "--top-p", "--seed"):
        assert option in run.stdout
    assert "/reset" in run.stdout and "/exit" in run.stdout


@pytest.fixture(scope="module")
def short_context(tmp_path_factory):
    """A chat model of a 128-token context, as ``zoo train --task chat`` leaves one from
    shakespeare-byte (every turn once failed at the default --max-new-tokens 512)."""
    root = tmp_path_factory.mktemp("short")
    tok = zoo.tokenizer(str(write_folder(root / "tok", "tinyllama-chat")))
    torch.manual_seed(0)
    model = zoo.build("llama-tiny", vocab_size=tok.vocab_size, context_length=128)
    return zoo.save(model, root / "model", tokenizer=tok)


def test_the_default_reply_length_fits_the_context(short_context, capsys):
    """Without --max-new-tokens a reply takes what the context leaves (at most
    CHAT_MAX_NEW_TOKENS): the turn is answered, exit 0, nothing on stderr."""
    from zoo.cli import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", _Lines("Hello!\n"))
        code = main(["chat", str(short_context), "--temperature", "0"])
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    assert out.endswith("\n") and len(out) > 1


def test_a_reply_length_the_context_cannot_hold_is_refused_before_the_chat(short_context, capsys):
    """--max-new-tokens at or over the context leaves no turn answerable: one line naming
    the context and what to give, exit 2, before any turn is read."""
    from zoo.cli import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", _Lines("Hello!\n"))
        code = main(["chat", str(short_context), "--max-new-tokens", "512"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "--max-new-tokens 512" in err and "128-token context" in err, err
    assert "at most 127" in err and len(err.strip().splitlines()) == 1, err


def test_a_turn_that_cannot_be_answered_makes_the_exit_code_1(short_context, capsys):
    """A conversation that outgrows the context is reported (with /reset), the chat goes on,
    and the exit code says that a turn went unanswered."""
    from zoo.cli import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", _Lines("word " * 200 + "\n/reset\nHi\n"))
        code = main(["chat", str(short_context), "--temperature", "0", "--max-new-tokens", "4"])
    out, err = capsys.readouterr()
    assert code == 1, (code, err)
    assert err.count("zoo: error: ") == 1 and "/reset starts over" in err, err
    assert "(conversation cleared)" in err and out.endswith("\n")
