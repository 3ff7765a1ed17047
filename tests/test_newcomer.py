"""The newcomer's path through the README and the guides (issue 42 ask 7), each step that
went wrong checked at its cause: a run folder that another run already holds, ``zoo check``
of a checkpoint path, the load line ``zoo push`` prints for an adapter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zoo.train import TrainConfig
from zoo.train.errors import ResumeError
from zoo.train.state import load_state

ROOT = Path(__file__).resolve().parent.parent


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


#: "`zoo tour --max-mib N` builds all but `a`, `b` and `c`" (or "(`--max-mib N`: all but ...)").
_TOUR = re.compile(r"--max-mib (\d+)`(?: builds|:) all but ((?:`[\w.-]+`(?:,\s+|\s+and\s+)?)+)")


def test_the_readme_names_the_models_the_tour_leaves_on_meta():
    """Each README sentence on ``zoo tour --max-mib N`` names exactly the named models whose
    float32 weights are over N MiB, the tour's own rule (it said 'all but Mistral and
    Mixtral' at 5000, where five stay on meta)."""
    import zoo.api as api

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    claims = _TOUR.findall(readme)
    assert claims, "the README's zoo tour --max-mib sentence was not found"
    over = {name: api.info(name).parameters * 4 / 2**20 for name in api.list_models()}
    for mib, listed in claims:
        said = set(re.findall(r"`([\w.-]+)`", listed))
        assert said == {name for name, size in over.items() if size > int(mib)}, mib


def test_no_python_block_needs_a_gpu_to_go_on():
    """A Python block of the README or the guides runs on a CPU machine to its end: a GPU is
    chosen where present (``device="cuda"`` only in a line marked as needing one, alone)."""
    from docblocks import blocks, documents

    stopping = []
    for path in documents():
        for block in blocks(path, "python"):
            for line in block.text.splitlines():
                if 'device="cuda"' in line and not line.lstrip().startswith("#"):
                    stopping.append(f"{path.name}: {line.strip()}")
    assert not stopping


def test_every_documented_training_run_warms_up_for_less_than_its_steps():
    """A ``zoo train`` command of the README or the guides runs clean: its warm-up (given,
    or TrainConfig's default) is shorter than its --steps (the README's LoRA run, 100 steps
    at the default warm-up of 100, opened with a warning about itself)."""
    from docblocks import blocks, documents

    default = TrainConfig().warmup
    warming = []
    for path in documents():
        for block in blocks(path, "sh"):
            for line in block.text.splitlines():
                command = line.partition("  #")[0]
                steps = re.search(r"--steps[ =](\d+)", command)
                if "zoo" not in command or " train " not in command or steps is None:
                    continue
                warmup = re.search(r"--warmup[ =](\d+)", command)
                if (int(warmup.group(1)) if warmup else default) >= int(steps.group(1)):
                    warming.append(f"{path.name}: {command.strip()}")
    assert not warming
