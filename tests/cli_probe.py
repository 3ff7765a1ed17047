"""Runs ``zoo`` commands through ``zoo.cli.main`` in one fresh process and checks that each is
refused in one line, exit 2, before torch is imported (tests/test_cli_early.py,
tests/test_cli_counts.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: Runs each argv through ``zoo.cli.main`` (with ``--stub``: each command's own run replaced by
#: ``exit 0``, so a check that lets a case through is reported, not run) and records, after
#: each, its exit code, its stderr and whether torch had been imported by then; the last row
#: says whether the registry was loaded (the commands ran in the probe).
PROBE = r"""
import contextlib, dataclasses, io, json, sys
import zoo.cli
from zoo.cli import main
if sys.argv[2] == "--stub":
    for name, command in zoo.cli.COMMANDS.items():
        zoo.cli.COMMANDS[name] = dataclasses.replace(command, run=lambda args: 0)
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    results.append([code, err.getvalue(), "torch" in sys.modules])
results.append([0, "", "zoo.plugin.current" in sys.modules])
print(json.dumps(results))
"""


def refused_before_torch(
    folder: Path, cases: list[tuple[list[str], str]], *, stub: bool = False
) -> bool:
    """Run each case's argv (``DATA`` standing for ``folder/data.txt``, written here) in
    ``folder`` and assert it exits 2 with one line holding its expected text, torch not yet
    imported; return whether the registry was loaded by the end."""
    (folder / "data.txt").write_text("some text to train on\n" * 10)
    argvs = [[("data.txt" if a == "DATA" else a) for a in argv] for argv, _ in cases]
    run = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argvs), "--stub" if stub else "--run"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(folder / "hf")},
    )
    assert run.returncode == 0, run.stderr
    *results, control = json.loads(run.stdout)
    for (argv, expected), (code, err, torch_imported) in zip(cases, results, strict=True):
        assert code == 2 and expected in err, f"zoo {' '.join(argv)}: exit {code}: {err}"
        assert err.count("\n") == 1, f"zoo {' '.join(argv)}: not one line: {err}"
        assert not torch_imported, f"zoo {' '.join(argv)} imported torch before its error"
    return bool(control[2])
