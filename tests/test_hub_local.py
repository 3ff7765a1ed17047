"""``python -m zoo.localhub``: the documented way to try push and pull without the internet.
Everything runs as a user would: the server and zoo in child processes, configured
only by the environment variables the server prints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

import zoo
from zoo.testing import small_overrides

_CLEAN = ("HF_", "HUGGING", "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME")


def _start(root: Path) -> tuple[subprocess.Popen[str], dict[str, str], list[str]]:
    """The server, the variables it says to export, and everything it printed."""
    server = subprocess.Popen(
        [sys.executable, "-m", "zoo.localhub", "--port", "0", "--root", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert server.stdout is not None
    lines: list[str] = []
    while not (lines and lines[-1].startswith("Ctrl-C")):
        line = server.stdout.readline()
        if not line:
            raise AssertionError(f"the server exited: {''.join(lines)}")
        lines.append(line)
    exports = dict(
        line.split("export ", 1)[1].strip().split("=", 1) for line in lines if "export " in line
    )
    return server, exports, lines


def test_try_the_hub_offline(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", **small_overrides("gpt2-124m")).eval()
    zoo.save(model, tmp_path / "runs" / "mine" / "model")  # a run folder, as docs/hub.md has
    server, exports, lines = _start(tmp_path / "hub-root")
    try:
        assert set(exports) == {"HF_ENDPOINT", "HF_HUB_DISABLE_XET", "HF_TOKEN"}, lines
        assert exports["HF_ENDPOINT"].startswith("http://127.0.0.1:")
        assert exports["HF_HUB_DISABLE_XET"] == "1"
        base = {k: v for k, v in os.environ.items() if not k.startswith(_CLEAN)}
        env = {**base, **exports, "ZOO_CACHE_DIR": str(tmp_path / "zoo-cache")}
        push = subprocess.run(
            [sys.executable, "-m", "zoo.cli", "push", str(tmp_path / "runs" / "mine"), "org/tiny"],
            env={**env, "HF_HOME": str(tmp_path / "home-push")},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert push.returncode == 0, push.stderr
        assert "pushed" in push.stdout
        fresh = tmp_path / "home-pull"  # a fresh cache: the weights must come from the server
        probe = (
            "import sys, torch, zoo\n"
            "m = zoo.load('hf:org/tiny')\n"
            "torch.save(m.state_dict()['head.weight'], sys.argv[1])\n"
        )
        pull = subprocess.run(
            [sys.executable, "-c", probe, str(tmp_path / "head.pt")],
            env={**env, "HF_HOME": str(fresh)},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert pull.returncode == 0, pull.stderr
        loaded = torch.load(tmp_path / "head.pt", weights_only=True)
        assert torch.equal(loaded, model.state_dict()["head.weight"])
        assert list((fresh / "hub").glob("models--org--tiny/snapshots/*/model.safetensors"))
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0


def test_a_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    server, exports, _ = _start(tmp_path / "one")
    try:
        port = exports["HF_ENDPOINT"].rsplit(":", 1)[1]
        second = subprocess.run(
            [sys.executable, "-m", "zoo.localhub", "--port", port],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1 and "cannot listen" in second.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def test_the_runtime_hub_client_does_not_import_the_server() -> None:
    """The local Hub is a tool beside ``zoo.hub``, not part of it: no module of ``zoo.hub``
    imports ``zoo.localhub`` (at the top or inside a function)."""
    import ast

    hub = Path(zoo.__file__).parent / "hub"
    offenders = []
    for path in sorted(hub.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(a.name for a in node.names)]
            if any("localhub" in name for name in names):
                offenders.append(path.name)
    assert offenders == []
