"""Every Hub download is bounded, and no staging file outlives its download.

An endless chunked body with a real ETag once wrote 856 MB in 12 s and was stopped only by the
3,600 s deadline; the ``.zoo-*.incomplete`` staging file survived the process and the next
successful pull. Each test reproduces one way in against ``tests/hubserver.py``'s LocalHub
(``endless``: a chunked body that never ends), with the byte counts scaled down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hub_fixtures import HUB_TOKEN, hub_client_env
from hubserver import LocalHub

import zoo
from zoo.testing import small_overrides


def small() -> torch.nn.Module:
    torch.manual_seed(0)
    return zoo.build("gpt2-124m", **small_overrides("gpt2-124m")).eval()


def blobs(tmp_path: Path, repo_id: str = "org/m") -> Path:
    return tmp_path / "hf_home" / "hub" / f"models--{repo_id.replace('/', '--')}" / "blobs"


def staging_files(tmp_path: Path, repo_id: str = "org/m") -> list[Path]:
    return sorted(blobs(tmp_path, repo_id).glob(".zoo-*.incomplete"))


@pytest.fixture(autouse=True)
def _own_zoo_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "zoo-cache"))


def test_an_endless_weights_body_stops_at_the_declared_size(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The Hub declares the weights' size (file metadata, X-Linked-Size); a body that goes on
    past it is refused as soon as it does, not at the deadline. Counted in bytes, not timed:
    with a deadline of an hour, the refusal names the declared size and came a chunk or a few
    past the end, not gigabytes."""
    monkeypatch.setenv("ZOO_HUB_DEADLINE", "3600")
    zoo.push(small(), "org/m")
    local_hub.endless.add("model.safetensors")
    with pytest.raises(zoo.UnsafeCheckpointError, match=r"model\.safetensors: .*declared"):
        zoo.load("hf:org/m")
    assert local_hub.endless_sent < 64 << 20
    assert staging_files(tmp_path) == []


def test_an_endless_body_with_no_declared_size_stops_at_the_cap(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """No metadata (the call fails), no Content-Length nor X-Linked-Size: ZOO_HUB_MAX_BYTES
    (scaled down to 2 MB) bounds the weights."""
    zoo.push(small(), "org/m")
    local_hub.info_status = 503
    local_hub.unsized.add("model.safetensors")
    local_hub.endless.add("model.safetensors")
    monkeypatch.setenv("ZOO_HUB_MAX_BYTES", "2000000")
    with pytest.raises(zoo.UnsafeCheckpointError, match=r"2,000,000-byte.*ZOO_HUB_MAX_BYTES"):
        zoo.load("hf:org/m")
    assert local_hub.endless_sent < 64 << 20
    assert staging_files(tmp_path) == []


def test_a_size_announced_over_the_declared_one_is_refused_before_reading(
    local_hub: LocalHub, tmp_path: Path
):
    """X-Linked-Size bigger than the file metadata's size: refused before the body is read."""
    zoo.push(small(), "org/m")
    local_hub.download_headers["model.safetensors"] = {"X-Linked-Size": str(10**15)}
    with pytest.raises(
        zoo.UnsafeCheckpointError,
        match=r"X-Linked-Size header declares 1,000,000,000,000,000 bytes, more than",
    ):
        zoo.load("hf:org/m")
    assert staging_files(tmp_path) == []


def test_a_declared_size_over_the_cap_is_refused_before_downloading(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    zoo.push(small(), "org/m")
    monkeypatch.setenv("ZOO_HUB_MAX_BYTES", "1000")
    with pytest.raises(zoo.UnsafeCheckpointError, match=r"over the 1,000-byte.*ZOO_HUB_MAX_BYTES"):
        zoo.load("hf:org/m")
    assert not any(r.path.endswith("model.safetensors") for r in local_hub.requests)


def test_a_declared_size_over_the_free_disk_space_is_refused(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import shutil

    from zoo.hub import transfer

    zoo.push(small(), "org/m")
    real = shutil.disk_usage
    monkeypatch.setattr(transfer.shutil, "disk_usage", lambda p: real(p)._replace(free=4096))
    with pytest.raises(zoo.HubError, match=r"model\.safetensors.*free"):
        zoo.load("hf:org/m")
    assert staging_files(tmp_path) == []


def test_an_interrupted_download_leaves_no_staging_file(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Ctrl-C in the middle of the body: the staging file goes with it."""
    from zoo.hub import transfer

    zoo.push(small(), "org/m")
    real = transfer._Download._write_chunk

    def interrupted(self: transfer._Download, out: object, chunk: bytes) -> None:
        if self.done > 1000:
            raise KeyboardInterrupt
        real(self, out, chunk)

    monkeypatch.setattr(transfer._Download, "_write_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        zoo.load("hf:org/m")
    assert staging_files(tmp_path) == []


_PULL = "import zoo; zoo.pull('org/m')"


def test_a_killed_pull_leaves_nothing_after_the_next_pull(local_hub: LocalHub, tmp_path: Path):
    """A pull killed mid-download (SIGKILL: no cleanup runs) left its staging file for good:
    the next pull removes staging files no live download holds."""
    zoo.push(small(), "org/m")
    local_hub.endless.add("model.safetensors")
    local_hub.download_headers["model.safetensors"] = {"X-Linked-Size": str(10**9)}
    local_hub.info_status = 503  # no metadata: the body may run to the announced size
    env = {
        **os.environ,
        **hub_client_env(local_hub.endpoint, HUB_TOKEN, tmp_path / "hf_home"),
        "ZOO_CACHE_DIR": str(tmp_path / "zoo-cache"),
    }
    child = subprocess.Popen([sys.executable, "-c", _PULL], env=env)
    try:
        deadline = time.monotonic() + 60
        while not any(p.stat().st_size > 1 << 20 for p in staging_files(tmp_path)):
            assert child.poll() is None and time.monotonic() < deadline, "the child never began"
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert staging_files(tmp_path)  # what a killed process leaves
    local_hub.clear_faults()
    zoo.pull("org/m")
    assert staging_files(tmp_path) == []


def test_a_live_download_keeps_its_staging_file(tmp_path: Path):
    """The sweep leaves alone a staging file that a running download holds."""
    from zoo.hub.staging import Staging, sweep

    folder = tmp_path / "blobs"
    folder.mkdir()
    with Staging(folder) as live:
        live.file.write(b"partial")
        orphan = folder / ".zoo-0123.incomplete"
        orphan.write_bytes(b"left by a killed process")
        sweep(folder)
        assert live.path.exists() and not orphan.exists()
    assert list(folder.iterdir()) == []


def test_max_bytes_setting(monkeypatch: pytest.MonkeyPatch):
    from zoo.hub.transfer import Limits

    assert Limits.from_env().max_bytes == 64 << 30
    monkeypatch.setenv("ZOO_HUB_MAX_BYTES", "12345")
    assert Limits.from_env().max_bytes == 12345
    monkeypatch.setenv("ZOO_HUB_MAX_BYTES", "-1")
    with pytest.raises(zoo.ConfigError, match="ZOO_HUB_MAX_BYTES"):
        Limits.from_env()


# -- no traceback from a malformed Hub answer -------------------------------------------------
@pytest.mark.parametrize("where", ["/api/", "/resolve/"])
def test_a_redirect_loop_is_a_hub_error(local_hub: LocalHub, where: str):
    """A Hub redirecting to itself was an httpx TooManyRedirects traceback (the API calls and
    the downloads alike)."""
    zoo.push(small(), "org/m")
    local_hub.redirect_loop = where
    with pytest.raises(zoo.HubError, match=r"org/m.*redirect.*HF_ENDPOINT"):
        zoo.load("hf:org/m")


def test_a_redirect_loop_for_tokenizer_files_is_a_clear_error(local_hub: LocalHub):
    local_hub.redirect_loop = "/"
    with pytest.raises(zoo.ZooError, match="redirect"):
        zoo.tokenizer("gpt1")


def test_a_deeply_nested_api_answer_is_a_hub_error(local_hub: LocalHub):
    """An API answer nested 100k deep was a RecursionError from inside huggingface_hub."""
    zoo.push(small(), "org/m")
    local_hub.api_body = b'{"sha": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(zoo.HubError, match=r"org/m.*could not be read"):
        zoo.load("hf:org/m")


def test_the_cli_names_a_redirect_loop(local_hub: LocalHub, tmp_path: Path):
    """``zoo pull`` against a looping Hub: exit 2, the message, no traceback."""
    zoo.push(small(), "org/m")
    local_hub.redirect_loop = "/api/"
    env = {
        **os.environ,
        **hub_client_env(local_hub.endpoint, HUB_TOKEN, tmp_path / "hf_home"),
        "ZOO_CACHE_DIR": str(tmp_path / "zoo-cache"),
    }
    run = subprocess.run(
        [sys.executable, "-m", "zoo.cli", "pull", "org/m"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "redirect" in run.stderr


def test_a_body_of_no_declared_size_stops_before_the_disk_fills(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Under the 64 GiB cap, a body with no size could still fill a smaller disk: it stops
    when less than 1 GiB stays free (the free space is faked, checked every 64 MiB)."""
    import shutil

    from zoo.hub import bounds, transfer

    zoo.push(small(), "org/m")
    local_hub.info_status = 503
    local_hub.unsized.add("model.safetensors")
    local_hub.endless.add("model.safetensors")
    monkeypatch.setattr(transfer, "DISK_CHECK_EVERY", 1 << 20)
    real = shutil.disk_usage
    monkeypatch.setattr(bounds.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 29))
    with pytest.raises(zoo.HubError, match=r"declared no size.*free on the disk"):
        zoo.load("hf:org/m")
    assert local_hub.endless_sent < 64 << 20
    assert staging_files(tmp_path) == []
