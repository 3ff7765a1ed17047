"""Every command in the README runs as written, offline, or the README says it needs the Hub.

The ``zoo`` commands of the README's ``sh`` blocks run in order (later ones use what earlier
ones wrote, as a reader following the README would) in a scratch folder that holds the
repository's ``plugins/`` (for the vendored Tiny Shakespeare) and the small inputs the README
describes (``my-texts/``, ``pairs.tsv``, ``labelled.tsv``), with ``HF_HUB_OFFLINE=1`` and
an empty Hugging Face cache. Only the lengths change: steps, generated tokens and evaluation
intervals are cut so that the whole README runs in a few minutes on 2 cores. A command marked
``# needs the Hub`` or ``# several machines`` is checked to be marked, not run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHAKESPEARE = ROOT / "plugins" / "shakespeare" / "data" / "tinyshakespeare.txt"

#: Comments that mark a command the test does not run, and why.
NOT_HERE = ("needs the Hub", "several machines")

#: Small settings: (pattern, replacement) applied to each command before it runs.
SMALL = (
    (r"--steps \d+", "--steps 4"),
    (r"--max-new-tokens \d+", "--max-new-tokens 8"),
    (r"--eval-every \d+", "--eval-every 2"),
    (r"--warmup \d+", "--warmup 1"),
)

PROGRAMS = ("zoo", "torchrun", "python -m zoo")


def readme_commands() -> list[tuple[str, str]]:
    """``(command, comment)`` for each command line of the README's ``sh`` blocks, in order;
    a ``&&`` chain is split and only its zoo commands are kept (the install steps are what
    ``.ci/run`` runs)."""
    text = README.read_text(encoding="utf-8")
    found: list[tuple[str, str]] = []
    for block in re.findall(r"^[ \t]*```sh\n(.*?)^[ \t]*```", text, flags=re.M | re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            command, _, comment = line.partition(" # ")
            if line.lstrip().startswith("#"):
                continue
            for part in command.split("&&"):
                part = part.strip()
                if part.startswith(PROGRAMS):
                    found.append((part, comment.strip()))
    return found


def _small(command: str) -> str:
    for pattern, replacement in SMALL:
        command = re.sub(pattern, replacement, command)
    if " train " in f" {command} " and "--steps" not in command:
        command += " --steps 4"
    return command


def _inputs(folder: Path) -> None:
    """The small inputs the README's commands name."""
    text = SHAKESPEARE.read_text(encoding="utf-8")
    (folder / "plugins").symlink_to(ROOT / "plugins", target_is_directory=True)
    texts = folder / "my-texts"
    texts.mkdir()
    (texts / "a.txt").write_text(text[:60_000], encoding="utf-8")
    (texts / "b.txt").write_text(text[60_000:120_000], encoding="utf-8")
    (folder / "more.txt").write_text(text[120_000:180_000], encoding="utf-8")
    words = [w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 3][:400]
    (folder / "pairs.tsv").write_text("".join(f"{w}\t{w[::-1]}\n" for w in words))
    lines = [line for line in text.splitlines() if len(line) > 20][:400]
    labelled = [f"{line}\t{'shout' if line.isupper() else 'speak'}\n" for line in lines]
    labelled += [f"{line.upper()}\tshout\n" for line in lines[:200]]
    (folder / "labelled.tsv").write_text("".join(labelled), encoding="utf-8")


def test_every_readme_command_is_marked_or_runnable():
    commands = readme_commands()
    assert len(commands) >= 10, "the README's commands were not found"
    for command, comment in commands:
        if "hf:" in command or command.startswith(("zoo pull", "zoo push")):
            assert any(m in comment for m in NOT_HERE) or "ZOO_LOCAL_HUB" in command, command


@pytest.mark.slow
def test_readme_commands_run_as_written(tmp_path):
    from conftest import site_dir  # the toy plugin the README's plugin guide installs

    work = tmp_path / "work"
    work.mkdir()
    _inputs(work)
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(site_dir()), os.environ.get("PYTHONPATH")])
        ),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    failures = []
    for command, comment in readme_commands():
        if any(mark in comment for mark in NOT_HERE):
            continue
        argv = shlex.split(_small(command))
        if argv[0] == "zoo":
            argv = [sys.executable, "-m", "zoo.cli", *argv[1:]]
        elif argv[0] == "torchrun":
            argv = [shutil.which("torchrun", path=env["PATH"]) or "torchrun", *argv[1:]]
        run = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            failures.append(f"$ {command}\n(exit {run.returncode})\n{run.stderr[-1500:]}")
    assert not failures, "\n\n".join(failures)
