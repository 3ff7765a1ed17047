"""A first load (sha256 hashed, every weight checked for NaN and infinity) and a load
followed by a forward pass hold the checkpoint about once: peak memory at most 1.15x the
weights file. The NaN/inf scan used to take whole-tensor temporaries (1.6x on gpt2-124m)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import zoo

CHILD = textwrap.dedent(
    """
    import json, sys, torch, zoo

    def peak_mb():  # this process's own high-water mark
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024

    torch.ones(1)
    base = peak_mb()
    model = zoo.load(sys.argv[1], verify=True, tokenizer=False)
    after_load = peak_mb()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4]]))
    print(json.dumps({"load": after_load - base, "forward": peak_mb() - base}))
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_a_first_load_holds_the_file_once(tmp_path: Path) -> None:
    torch.manual_seed(0)
    # the GPT-2 embedding (154 MB) dominates, as in the full model
    zoo.save(zoo.build("gpt2-124m", n_layers=1), tmp_path / "ckpt")
    file_mb = (tmp_path / "ckpt" / "model.safetensors").stat().st_size / 2**20
    env = {"ZOO_CACHE_DIR": str(tmp_path / "cache")}  # nothing remembered: a first load
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    grew = json.loads(run.stdout.strip().splitlines()[-1])
    assert grew["load"] <= 1.15 * file_mb, (grew, file_mb)
    assert grew["forward"] <= 1.15 * file_mb, (grew, file_mb)
