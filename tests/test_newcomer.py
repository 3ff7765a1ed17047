"""The newcomer's path through the README and the guides, each step that
went wrong checked at its cause: a run folder that another run already holds, ``zoo check``
of a checkpoint path, the load line ``zoo push`` prints for an adapter."""

from __future__ import annotations

import json
import re
import sys
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


@pytest.fixture
def few_checks(monkeypatch):
    """``zoo check`` running two of the kit's checks (build and reference), to stay fast."""
    import functools

    import zoo.testing

    quick = functools.partial(zoo.testing.run_conformance, checks=("build", "reference"))
    monkeypatch.setattr(zoo.testing, "run_conformance", quick)


def test_zoo_check_takes_a_checkpoint_folder_and_a_training_run(tmp_path, capsys, few_checks):
    """``zoo check runs/mine`` ran nothing ('unknown model'): a checkpoint folder, or a
    training run's folder, is checked as its architecture and config (the kit's small random
    models of it), each row naming the folder given."""
    import torch

    import zoo
    from zoo.cli import main

    torch.manual_seed(0)
    saved = zoo.save(zoo.build("llama-tiny", n_layers=3), tmp_path / "run" / "model")
    for source in (saved, tmp_path / "run"):
        code = main(["check", str(source), "--device", "cpu"])
        out, err = capsys.readouterr()
        assert code == 0, (out, err)
        rows = [line for line in out.splitlines() if line.startswith(str(source))]
        assert [row.split()[1] for row in rows] == ["build", "reference"], out
        assert "max logit difference" in out and "all checks passed" in out


def test_zoo_check_of_neither_a_name_nor_a_folder_says_what_it_takes(tmp_path, capsys):
    from zoo.cli import main

    code = main(["check", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert code == 2 and "a checkpoint folder" in err, err


def test_a_reference_skipped_for_want_of_transformers_names_the_extra(monkeypatch):
    """Without transformers (the main install), the reference check is skipped with the
    command that installs it: an extra of torch-zoo that lists transformers."""
    from importlib.metadata import requires

    from zoo.testing import run_conformance

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    (result,) = run_conformance("llama-tiny", checks=("reference",))
    assert result.status == "skipped", result
    extra = re.search(r"pip install 'torch-zoo\[(\w+)\]'", result.reason or "")
    assert extra, result.reason
    listed = [r for r in requires("torch-zoo") or [] if f'extra == "{extra.group(1)}"' in r]
    assert any(r.startswith("transformers") for r in listed), listed


def test_the_load_line_zoo_push_prints_for_an_adapter_loads_it(
    local_hub, tmp_path, monkeypatch, capsys
):
    """``zoo push`` of a LoRA adapter printed ``zoo.load("hf:org/name@sha")``, which refuses
    an adapter (it is no model). The line it prints now, run as printed against the local
    Hub, loads the base with the adapter."""
    import torch

    import zoo
    from zoo.adapters import BaseRecord, base_fingerprint, per_part, save_adapter
    from zoo.adapters.lora import adapted_layers, attach_lora, plan_lora
    from zoo.cli import main

    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(tmp_path / "weights"))
    torch.manual_seed(0)
    base = zoo.save(zoo.build("llama-tiny").eval(), tmp_path / "weights" / "llama-tiny")
    model = zoo.load(base, onednn=False)
    record = BaseRecord(name="llama-tiny", repo=None, revision=None, sha256=base_fingerprint(model))
    lora = zoo.LoRA(rank=2, alpha=4.0, targets=("attn.qkv",))
    attach_lora(model, plan_lora(model, lora, per_part=per_part(model)))
    save_adapter(model, tmp_path / "adapter", base=record, lora=lora)

    assert main(["push", str(tmp_path / "adapter"), "org/tiny-lora"]) == 0
    out = capsys.readouterr().out
    lines = [line.strip() for line in out.splitlines() if "zoo.load(" in line]
    assert len(lines) == 1, out
    code = lines[0].split("load it with ", 1)[1]
    loaded = eval(code, {"zoo": zoo})  # the line as printed
    assert adapted_layers(loaded), "the line loaded no adapter"
    assert code.startswith('zoo.load("llama-tiny", adapter="hf:org/tiny-lora@'), code
