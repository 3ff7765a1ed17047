"""The newcomer's path through the README and the guides (issue 42 ask 7), each step that
went wrong checked at its cause: a run folder that another run already holds, ``zoo check``
of a checkpoint path, the load line ``zoo push`` prints for an adapter."""

from __future__ import annotations

import json

import pytest

from zoo.train import TrainConfig
from zoo.train.errors import ResumeError
from zoo.train.state import load_state


def _run_folder(out, config: TrainConfig, step: int):
    """``out`` as a run of ``config`` leaves it after ``step`` steps (its trainer.json)."""
    folder = out / "checkpoint"
    folder.mkdir(parents=True)
    meta = {
        "step": step,
        "param_groups": [],
        "scalars": {},
        "history": [{"step": i + 1, "loss": 1.0} for i in range(step)],
        "config": config.trajectory(),
    }
    (folder / "trainer.json").write_text(json.dumps(meta), encoding="utf-8")
    return out


def test_an_out_folder_of_another_run_says_so_and_how_to_go_on(tmp_path):
    """The README's LoRA run (100 steps) left runs/lora; docs/adapters.md's (50 steps, other
    batch) into the same folder read 'step 100 is not in 0..50', as if a file were damaged.
    Now: the folder holds another run, the settings that differ, and what to do."""
    out = _run_folder(tmp_path / "lora", TrainConfig(steps=100), step=100)
    now = TrainConfig(steps=50, batch_size=4, warmup=5)
    with pytest.raises(ResumeError) as err:
        load_state(out, None, None, None, now)  # type: ignore[arg-type]  # refused first
    message = str(err.value)
    assert f"{out} already holds another training run" in message, message
    assert "steps 100 (now 50)" in message and "batch_size" in message
    assert "another --out" in message and "not in 0..50" not in message
