"""Every code block of the README and of the guides in ``docs/`` runs as written, offline, or
is marked as what cannot run here; and every link between them resolves.

Each document runs in a scratch folder of its own that holds the repository's ``plugins/``
(for the vendored Tiny Shakespeare) and the small inputs the documents describe
(``my-texts/``, ``more.txt``, ``pairs.tsv``, ``labelled.tsv``), with ``HF_HUB_OFFLINE=1``
and an empty Hugging Face cache. Its blocks run in order, as a reader following it would
(later ones use what earlier ones wrote): the ``zoo``/``torchrun`` commands of its ``sh``
blocks as processes, its ``python`` blocks in one Python process for the document (one
namespace, as if pasted into one session). Only lengths change: steps, generated tokens,
evaluation intervals, a context of 256, a training run's batch (2 sequences) and a Python
run's evaluation batches are cut so that everything runs in a few minutes on 2 cores, and
``zoo tour`` builds the models over 64 MiB (not 512) on the meta device (the tour at its
default, gpt2-124m built with weights within 1 GiB, is tested in tests/test_cli_ux.py); and
a Python ``zoo.load("gpt2-124m", ...)`` (the official weights, from the Hub) loads a 2-layer
``gpt2-124m`` saved in the folder beforehand (same tokenizer and vocabulary). A command or a
line of Python whose comment says ``needs the Hub``, ``several machines`` or ``needs a GPU``
is checked to be marked, not run; one that says ``tested in tests/test_x.py`` (a first
compilation, too slow to repeat here) must name a test file that exists. One that says
``needs the Hub (or a local one...)`` runs against a local Hub (``zoo.localhub``) started for
the document, seeded with the repos its lines read before they push (:data:`HUB_SEEDS`).

For time (2 cores): documents run two at a time, torch on one thread in each; ``zoo``
commands are processes forked from one that has imported torch and what ``zoo train``
imports (:data:`ZOO_SETUP`, :data:`ZOO_COMMAND`); and an exact repeat of a read-only command
with nothing else run since is not run again (:data:`READ_ONLY`).
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

import pytest
from docblocks import (
    DOCS,
    LOCAL_HUB,
    NOT_HERE,
    README,
    ROOT,
    Block,
    all_commands,
    anchors,
    blocks,
    commands,
    documents,
    guide_text,
    links,
    python_to_run,
    runs_here,
)
from forkserver import ForkServer
from hub_fixtures import HUB_TOKEN, hub_client_env
from hubserver import LocalHub

SHAKESPEARE = ROOT / "plugins" / "shakespeare" / "data" / "tinyshakespeare.txt"

#: Small settings: (pattern, replacement) applied to each command before it runs.
SMALL = (
    (r"--steps \d+", "--steps 4"),
    (r"--max-new-tokens \d+", "--max-new-tokens 8"),
    (r"--eval-every \d+", "--eval-every 2"),
    (r"--warmup \d+", "--warmup 1"),
    (r"--batch-size \d+", "--batch-size 2"),
    (r"context_length=256", "context_length=64"),
    (r"^zoo tour$", "zoo tour --max-mib 64"),
)

#: The same for Python blocks, and the official gpt2-124m weights replaced by a small local copy.
SMALL_PYTHON = (
    (r"\bsteps=\d+", "steps=4"),
    (r"\bmax_new_tokens=\d+", "max_new_tokens=8"),
    (r"context_length=256", "context_length=64"),
    (r"(TrainConfig\([^)]*)\bbatch_size=\d+", r"\1batch_size=2"),
    (r"TrainConfig\((?![^)]*\bbatch_size=)", "TrainConfig(batch_size=2, "),
    (r"TrainConfig\(", "TrainConfig(eval_batches=2, "),
    (r'zoo\.load\("gpt2-124m"', 'zoo.load("./gpt2-small"'),
)

#: Saves the small gpt2-124m that SMALL_PYTHON loads in place of the official weights.
SMALL_GPT2 = (
    "import zoo\n"
    'zoo.save(zoo.build("gpt2-124m", n_layers=2, d_model=64, n_heads=2, d_ff=128), "gpt2-small")\n'
)

#: What a document's lines read from the local Hub before anything is pushed to it: the
#: source they name -> the code that publishes it there (a small gpt2-124m, as SMALL_GPT2).
HUB_SEEDS = {
    '"hf:org/name@v1"': (
        "import zoo\n"
        'zoo.push(zoo.build("gpt2-124m", n_layers=2, d_model=64, n_heads=2, d_ff=128), '
        '"org/name", revision="v1")\n'
    ),
}

#: Runs a document's Python blocks one request at a time in one namespace; answers on the
#: original stdout while the blocks' own output goes to stderr.
KERNEL = r"""
import json, os, sys, traceback
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
namespace = {"__name__": "__main__"}
for request in sys.stdin:
    request = json.loads(request)
    try:
        exec(compile(request["code"], request["where"], "exec"), namespace)
        answer = {"ok": True}
    except BaseException:
        answer = {"ok": False, "error": traceback.format_exc()[-3000:]}
    sys.stdout.flush()
    answers.write(json.dumps(answer) + "\n")
    answers.flush()
"""

#: A document's ``zoo`` commands are processes forked from one that has imported torch and
#: a few of torch's and matplotlib's modules, nothing of zoo (zoo's command line starts from a
#: fresh interpreter plus those, without paying their import, 1.5 s of CPU for torch and 3 s
#: for the rest, for each of about 30 commands): each runs ``python -m zoo.cli``
#: as a fresh process would, in its own folder and environment, with its own exit code.
ZOO_SETUP = (
    "import torch\n"
    # and what `zoo train` and `zoo check` import on their way (the optimizer imports dynamo,
    # checkpoints torch.distributed.checkpoint, the loss plot matplotlib as zoo sets it up):
    # 3 s of CPU a command, paid once; none starts a thread or reads the variables that differ
    # between commands (the local Hub's HF_*)
    "import sympy, torch._dynamo, torch.distributed.checkpoint\n"
    "import matplotlib\n"
    "matplotlib.use('Agg')\n"
    "import matplotlib.pyplot\n"
)

ZOO_COMMAND = """
import os, runpy, sys
request = {request!r}
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
sys.argv = ["zoo", *request["args"]]
runpy.run_module("zoo.cli", run_name="__main__", alter_sys=True)
"""

#: ``zoo`` commands that write nothing a later command reads: an exact repeat of one of them that
#: already succeeded, with only such commands run since, would run the same code on the same
#: inputs again (the README's quickstart line and its command list both run ``zoo tour`` and
#: the same ``zoo generate``), so it is not run twice.
READ_ONLY = frozenset({"tour", "list", "info", "plugins", "check", "generate"})

#: What a reader cannot run without the Hub, a GPU or other machines, and must be marked.
_MUST_BE_MARKED = re.compile(r'"hf:|zoo\.(pull|push)\(|device="cuda"|--nnodes')


def readme_commands() -> list[tuple[str, str]]:
    """``(command, comment)`` for each command of the README's ``sh`` blocks, in order."""
    return all_commands([README])


def _small(command: str) -> str:
    for pattern, replacement in SMALL:
        command = re.sub(pattern, replacement, command)
    if " train " in f" {command} " and "--steps" not in command:
        command += " --steps 4"
    if " train " in f" {command} " and "--batch-size" not in command:
        command += " --batch-size 2"  # a step of 2 sequences: the run's code is the same
    if " train " in f" {command} ":
        command += " --eval-batches 2"  # as SMALL_PYTHON's TrainConfig(eval_batches=2, ...)
    return command


def _small_python(code: str) -> str:
    for pattern, replacement in SMALL_PYTHON:
        code = re.sub(pattern, replacement, code)
    return code


def _inputs(folder: Path) -> None:
    """The small inputs the documents' commands name."""
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


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


#: The documents with blocks to run.
RUNNABLE = [p for p in documents() if any(b.language in ("sh", "python") for b in blocks(p))]


def test_the_readme_is_a_front_page_that_links_every_guide():
    readme = README.read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 400, "README.md is a front page: move detail to docs/"
    guides = sorted(DOCS.glob("*.md"))
    assert len(guides) >= 5, "the guides in docs/ were not found"
    assert not [g.name for g in guides if f"(docs/{g.name})" not in readme]


def test_every_command_and_python_line_is_marked_or_runnable():
    commands_found = all_commands()
    assert len(readme_commands()) >= 10, "the README's commands were not found"
    assert any(LOCAL_HUB in comment for _, comment in readme_commands()), "no local-Hub line"
    assert len(commands_found) > len(readme_commands()), "the guides' commands were not found"
    for command, comment in commands_found:
        if "hf:" in command or command.startswith(("zoo pull", "zoo push")):
            assert any(m in comment for m in NOT_HERE) or "ZOO_LOCAL_HUB" in command, command
    for path in documents():
        for block in blocks(path, "python"):
            for number, line in enumerate(block.text.splitlines()):
                code, _, comment = line.partition("  #")
                if _MUST_BE_MARKED.search(code):
                    where = f"{block.where}+{number}: {line}"
                    assert any(m in comment for m in NOT_HERE), f"unmarked: {where}"


def test_a_line_tested_elsewhere_names_its_test():
    named = re.findall(r"tested in (tests/[\w/]+\.py)", guide_text())
    assert named, "no line is marked as tested elsewhere"
    assert not [name for name in named if not (ROOT / name).is_file()]


def test_every_python_block_compiles():
    """A syntax error (or a marked line that cannot become ``pass``) fails fast, not slow."""
    found = [b for p in documents() for b in blocks(p, "python")]
    assert len(found) >= 12, "the python blocks were not found"
    for block in found:
        compile(_small_python(python_to_run(block)), block.where, "exec")


def test_every_link_resolves():
    """Every relative link of the README and the guides names an existing file, and a
    ``#fragment`` an existing heading of its target."""
    broken = []
    for path in documents():
        for target in links(path):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, fragment = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists():
                broken.append(f"{_name(path)}: {target} (no such file)")
            elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
                broken.append(f"{_name(path)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_link_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A title\n[ok](#a-title) [bad](#nowhere) [gone](missing.md)\n")
    assert anchors(page) == {"a-title"}
    assert links(page) == ["#a-title", "#nowhere", "missing.md"]


def _start_python(work: Path, env: dict[str, str], log: IO[str]) -> subprocess.Popen[str]:
    """The Python process a document's ``python`` blocks run in, in ``work``."""
    return subprocess.Popen(
        [sys.executable, "-c", KERNEL],
        cwd=work,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )


def _run_python(kernel: subprocess.Popen[str], code: str, where: str) -> str | None:
    """Run ``code`` in the document's Python process; the error, or None."""
    assert kernel.stdin is not None and kernel.stdout is not None
    kernel.stdin.write(json.dumps({"code": code, "where": where}) + "\n")
    kernel.stdin.flush()
    ready, _, _ = select.select([kernel.stdout], [], [], 600)
    answer = kernel.stdout.readline() if ready else ""
    if not answer:
        return "no answer (the Python process died or hung)"
    reply = json.loads(answer)
    return None if reply["ok"] else reply["error"]


def _run_zoo(
    server: ForkServer, args: list[str], work: Path, env: dict[str, str]
) -> tuple[int, str]:
    """Run ``zoo ARGS`` in ``work`` with ``env`` as a process forked from ``server``: its exit
    code and its stderr."""
    out, err = work.parent / "zoo.stdout", work.parent / "zoo.stderr"
    request = {"args": args, "cwd": str(work), "env": env, "stdout": str(out), "stderr": str(err)}
    process = server.start(ZOO_COMMAND.format(request=request))
    try:
        code = process.wait(timeout=600)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    return code, err.read_text(errors="replace")


def _runs_zoo(found: list[Block]) -> bool:
    """Whether a block of ``found`` has a ``zoo`` command that runs here."""
    return any(
        shlex.split(_small(command))[0] == "zoo"
        for block in found
        if block.language == "sh"
        for command, comment in commands(block)
        if runs_here(comment)
    )


def _run_sh(
    block: Block,
    work: Path,
    env: dict[str, str],
    hub_env: dict[str, str] | None,
    zoo_server: ForkServer | None,
    repeats: set[str],
) -> list[str]:
    """Run the commands of ``block`` that run here; those marked :data:`LOCAL_HUB` with
    ``hub_env`` (the local Hub's); ``zoo`` commands forked from ``zoo_server``. ``repeats``:
    the :data:`READ_ONLY` commands that succeeded since anything else ran (updated)."""
    failures = []
    for command, comment in commands(block):
        if not runs_here(comment):
            continue
        if LOCAL_HUB in comment:
            assert hub_env is not None, "no local Hub was started for this document"
        command_env = hub_env if LOCAL_HUB in comment and hub_env else env
        argv = shlex.split(_small(command))
        read_only = argv[0] == "zoo" and len(argv) > 1 and argv[1] in READ_ONLY
        key = json.dumps([argv, command_env is env])
        if read_only and key in repeats:
            continue
        if not read_only:
            repeats.clear()
        if argv[0] == "zoo":
            assert zoo_server is not None, "no fork server was started for this document"
            returncode, stderr = _run_zoo(zoo_server, argv[1:], work, command_env)
        else:
            if argv[0] == "torchrun":
                argv = [shutil.which("torchrun", path=env["PATH"]) or "torchrun", *argv[1:]]
            elif argv[0] == "python":
                argv = [sys.executable, *argv[1:]]
            run = subprocess.run(
                argv, cwd=work, env=command_env, capture_output=True, text=True, timeout=600
            )
            returncode, stderr = run.returncode, run.stderr
        if returncode != 0:
            failures.append(f"{block.where}: $ {command}\n(exit {returncode})\n{stderr[-1500:]}")
        elif read_only:
            repeats.add(key)
    return failures


def test_the_python_runner_keeps_one_namespace_and_reports_failures(tmp_path):
    with open(tmp_path / "python.log", "w") as log:
        kernel = _start_python(tmp_path, dict(os.environ), log)
        try:
            assert _run_python(kernel, "x = 41\nprint('to the log')\n", "one") is None
            assert _run_python(kernel, "assert x == 41\n", "two") is None
            error = _run_python(kernel, "x += 1\nraise ValueError(x)\n", "three")
            assert error is not None and "ValueError: 42" in error and '"three"' in error
        finally:
            kernel.kill()
            kernel.wait()
    assert "to the log" in (tmp_path / "python.log").read_text()
    marked = Block(README, 1, "python", 'if True:\n    zoo.pull("gpt1")  # needs the Hub\n')
    assert python_to_run(marked) == "if True:\n    pass  # not run here: needs the Hub\n"


#: Documents run two at a time, each in its own folder with its own processes, local Hub and
#: Hugging Face cache, torch on one thread in each: much of a document's time is one process
#: importing or waiting, which leaves the second of 2 cores idle, and torch's own threads only
#: spin against each other's. The longest start first (all blocks: 100 s -> 60 s on 2 cores).
PARALLEL_DOCUMENTS = 2


@pytest.fixture(scope="module")
def document_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[Path, Future[list[str]]]]:
    """Each selected document's run, started in the background: document -> its failures.

    Under pytest-xdist, the README's ``--dist loadfile`` keeps this file's tests in one worker,
    the one that starts the runs (``--dist load`` would have each worker run every document)."""
    selected = [
        item.callspec.params["document"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_document_runs_as_written"
        and item.path == Path(__file__)
    ]
    longest_first = sorted(selected, key=lambda d: (d != README, d.name != "training.md"))
    with ThreadPoolExecutor(PARALLEL_DOCUMENTS, thread_name_prefix="document") as pool:
        runs = {
            document: pool.submit(_run_document, document, tmp_path_factory.mktemp(document.stem))
            for document in longest_first
        }
        yield runs
        for run in runs.values():
            run.cancel()


@pytest.mark.slow
@pytest.mark.parametrize("document", RUNNABLE, ids=_name)
def test_document_runs_as_written(document, document_runs):
    failures = document_runs[document].result()
    assert not failures, "\n\n".join(failures)


def _run_document(document: Path, tmp_path: Path) -> list[str]:
    """Run the blocks of ``document`` in a scratch folder under ``tmp_path``: the failures."""
    from conftest import site_dir  # the toy plugin the plugin guide installs

    work = tmp_path / "work"
    work.mkdir()
    _inputs(work)
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",  # torch on one thread: two documents at a time fill 2 cores
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(site_dir()), os.environ.get("PYTHONPATH")])
        ),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    found = [b for b in blocks(document) if b.language in ("sh", "python")]
    failures: list[str] = []
    repeats: set[str] = set()
    hub = _local_hub(found, tmp_path)
    hub_env = None
    if hub is not None:
        offline = {k: v for k, v in env.items() if k != "HF_HUB_OFFLINE"}
        hub_env = {**offline, **hub_client_env(hub.endpoint, HUB_TOKEN, tmp_path / "hf")}
    python_hub = any(LOCAL_HUB in b.text for b in found if b.language == "python")
    zoo_server = (
        ForkServer(ZOO_SETUP, env=env, cwd=work, one_thread=False) if _runs_zoo(found) else None
    )
    with open(tmp_path / "python.log", "w") as log:
        kernel = _start_python(work, hub_env if python_hub and hub_env else env, log)
        try:
            if any('zoo.load("gpt2-124m"' in python_to_run(b) for b in found):
                error = _run_python(kernel, SMALL_GPT2, "setup")
                assert error is None, error
            for source, seed in HUB_SEEDS.items():
                if any(source in python_to_run(b) for b in found):
                    error = _run_python(kernel, seed, f"seed {source}")
                    assert error is None, error
            for block in found:
                if block.language == "sh":
                    failures += _run_sh(block, work, env, hub_env, zoo_server, repeats)
                    continue
                repeats.clear()  # a Python block may write what a command reads
                error = _run_python(kernel, _small_python(python_to_run(block)), block.where)
                if error is not None:
                    failures.append(f"{block.where}: python block\n{error}")
        finally:
            kernel.kill()
            kernel.wait()
            if zoo_server is not None:
                zoo_server.close()
            if hub is not None:
                hub.close()
    return failures


def _local_hub(found: list[Block], tmp_path: Path) -> LocalHub | None:
    """A running local Hub when a block has a line marked :data:`LOCAL_HUB`, else None."""
    if not any(LOCAL_HUB in b.text for b in found):
        return None
    return LocalHub(token=HUB_TOKEN, root=tmp_path / "localhub").start()
