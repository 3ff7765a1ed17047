"""Every argument check that needs no torch comes before torch is imported:
a misspelled name, a missing file, a number out of range is reported at once, by every
command that takes one, with the message the command gave before."""

from __future__ import annotations

from pathlib import Path

from cli_probe import refused_before_torch

#: (argv, what the error says). DATA is a text file that exists; everything else named is
#: missing or misspelled.
CASES = [
    (["generate", "gtp2-124m", "hi"], "unknown model 'gtp2-124m'. Did you mean 'gpt2-124m'"),
    (["generate", "gtp2-124m", "hi", "--random"], "unknown model 'gtp2-124m'"),
    (["generate", "runs/none", "hi"], "checkpoint runs/none does not exist"),
    (["generate", "gpt2", "hi", "--tokenizer", "nosuch"], "Registered tokenizers"),
    (["generate", "gpt2", "hi", "--max-new-tokens", "0"], "max_new_tokens must be a positive"),
    (["generate", "gpt2", "hi", "--seed", str(2**70)], "seed"),
    (["chat", "qwen2.5-0.5b-instrut"], "Did you mean 'qwen2.5-0.5b-instruct'"),
    (["chat", "qwen2.5-0.5b-instruct", "--tokenizer", "none/"], "unknown model 'none/'"),
    (["chat", "qwen2.5-0.5b-instruct", "--temperature", "-1"], "temperature must be"),
    (["serve", "gtp2"], "unknown model 'gtp2'"),
    (["serve", "gpt2", "--port", "70000"], "--port must be from 0 to 65535"),
    (["classify", "runs/none", "some text"], "checkpoint runs/none does not exist"),
    (["classify", "shakespeare-byt", "some text"], "Did you mean 'shakespeare-byte'"),
    (["train", "shakespeare-byt", "--data", "DATA", "--out", "o"], "unknown model"),
    (["train", "shakespeare-byte", "--data", "none.txt", "--out", "o"], "none.txt does not exist"),
    (["train", "shakespeare-byte", "--data", "DATA", "--out", "o", "--steps", "0"], "steps"),
    (["train", "gpt2", "--data", "DATA", "--out", "o", "--set", "nosuch=3"], "no field 'nosuch'"),
    (["train", "gpt2", "--data", "DATA", "--out", "o", "--tokenizer", "tok"], "no saved tokenizer"),
    (["train", "--from", "runs/none", "--data", "DATA", "--out", "o"], "runs/none does not exist"),
    (["train", "--from", "gpt2", "--set", "n_layers=1", "--data", "DATA", "--out", "o"], "--set"),
    (
        ["train", "--from", "gpt2", "--train-tokenizer", "300", "--data", "DATA", "--out", "o"],
        "new",
    ),
    (["train", "--data", "DATA", "--out", "o"], "name the model once"),
    (
        ["train", "gpt2", "--data", "DATA", "--out", "o", "--tokenizer-max-distinct", "9"],
        "--tokenizer-max-distinct goes with --train-tokenizer",
    ),
    (["check", "gpt2-12m"], "unknown model 'gpt2-12m'"),
    (["convert", "runs/none", "out"], "checkpoint runs/none does not exist"),
    (["info", "gpt2-12m"], "unknown model 'gpt2-12m'"),
    (["push", "runs/none", "org/x"], "runs/none does not exist"),
    (["pull", "gtp2-124m"], "unknown model 'gtp2-124m'"),
]


def test_argument_errors_come_before_torch_is_imported(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()  # a folder with no saved tokenizer in it
    assert refused_before_torch(tmp_path, CASES), (
        "the registry was not imported: the commands did not run in the probe"
    )
