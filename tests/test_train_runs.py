"""`zoo train`'s clear errors for the meta device and for numbers out of range, a
time budget that trains the steps that fit, the loss plot and the warm-up said at the start,
and `zoo info` of a run's folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from test_train_seams import BYTE, CONFIG, ENV, WORDS, run, zoo_train

import zoo
from zoo.cli import main
from zoo.errors import ConfigError
from zoo.train import TrainConfig, train
from zoo.train.time_budget import Budget, stop_reason
from zoo.train.world import World

CPU = torch.device("cpu")

SEED_RANGE_WORDS = "seed must be an integer from 0 to 2**64 - 1 (18446744073709551615)"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text((WORDS + ".\n") * 100)
    return path


def config(**changes: Any) -> TrainConfig:
    return TrainConfig(**{**CONFIG.__dict__, **changes})


# -- 10. the meta device ---------------------------------------------------------------------
def test_zoo_train_on_the_meta_device_is_a_clear_error(corpus, tmp_path, capsys):
    assert main(zoo_train(corpus, tmp_path / "run", "--device", "meta")) == 2
    err = capsys.readouterr().err
    assert "meta device" in err and "zoo train --device cpu" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before anything was made


def test_train_refuses_the_meta_device_and_a_model_on_it_in_python(corpus, tmp_path):
    with pytest.raises(ConfigError, match=r"meta device .* cannot train"):
        run(corpus, tmp_path / "a", device="meta")
    on_meta = zoo.build("gpt2-124m", n_layers=1, d_model=32, n_heads=2, d_ff=64, device="meta")
    with pytest.raises(ConfigError, match=r"meta device .* cannot train"):
        train(on_meta, corpus, tmp_path / "b", config=CONFIG, tokenizer=BYTE, log=None)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- 11. numbers out of range --------------------------------------------------------------------
@pytest.mark.parametrize("seed", [2**70, 2**64, -(2**63) - 1])
def test_a_seed_out_of_range_names_the_range_zoo_generate_names(corpus, tmp_path, capsys, seed):
    assert main(zoo_train(corpus, tmp_path / "run", "--seed", str(seed))) == 2
    err = capsys.readouterr().err
    assert SEED_RANGE_WORDS in err and str(seed) in err and "Overflow" not in err
    with pytest.raises(ConfigError, match=r"seed must be an integer from 0 to 2\*\*64 - 1"):
        TrainConfig(seed=seed)


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training fails the test at once: a count the old code took trained (or evaluated, or
    searched for a batch that fits) for 2**70 rounds."""
    import zoo.train.loop

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the run was started")

    monkeypatch.setattr(zoo.train.loop, "train", refuse)
    monkeypatch.setattr(zoo.train, "train", refuse, raising=False)  # the lazy name, if bound


@pytest.mark.parametrize(
    "name",
    [
        "steps",
        "batch_size",
        "grad_accum",
        "warmup",
        "eval_every",
        "eval_batches",
        "checkpoint_every",
    ],
)
def test_every_count_beyond_int64_is_refused_by_name(corpus, tmp_path, capsys, no_training, name):
    flag = "--" + name.replace("_", "-")
    assert main(zoo_train(corpus, tmp_path / "run", flag, str(2**70))) == 2
    assert f"TrainConfig.{name} ({flag}) must be at most" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=f"TrainConfig.{name} .* must be at most"):
        TrainConfig(**{name: 2**63})
    TrainConfig(checkpoint_every=10**9)  # the largest is taken


def test_the_top_of_the_seed_range_trains(corpus, tmp_path):
    """The loop seeds the evaluation with seed + 1: 2**64 overflowed a torch.Generator."""
    result = run(corpus, tmp_path / "run", config=config(steps=1, eval_batches=1, seed=2**64 - 1))
    assert result.steps == 1 and result.val_loss is not None


def test_the_memory_advice_for_a_huge_batch_is_immediate():
    """The advice looked for a smaller batch one size at a time, from the one given down: a
    batch of 2**62 never finished (batches are now at most 2**20, the advice bisects).
    Run in a child process with a timeout."""
    code = textwrap.dedent(
        """
        import torch, zoo
        from zoo.errors import InsufficientMemoryError
        from zoo.train import TrainConfig
        from zoo.train.memory import check_training_memory
        model = zoo.build("gpt2-124m", device="meta", n_layers=1, d_model=32, n_heads=2,
                          d_ff=64, context_length=16, vocab_size=257)
        try:
            check_training_memory(model, TrainConfig(batch_size=2**20), torch.device("cpu"),
                                  available=2**30)
        except InsufficientMemoryError as exc:
            print(str(exc).split("Settings that fit: ")[1])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("--batch-size "), done.stdout
    assert 1 <= int(done.stdout.split()[1].rstrip(".;")) < 2**20


# -- 15. the time budget (a fake clock: no timing) ---------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def simulate(
    budget_s: float, first: float, step: float, batch: float, slower_after: int = 0
) -> tuple[int, float]:
    """A run on a fake clock: 5 s of data preparation, the held-out batch timed before step
    1 (``batch`` s), a first step of ``first`` s then steps of ``step`` s, 20 held-out
    batches per evaluation, checkpoints of 50 MB written at 100 MB/s (0.5 s). After
    ``slower_after`` steps (0: never) the machine gets 4 times slower. Returns the steps
    taken and when the final evaluation and the two saves ended."""
    now = FakeClock()
    budget = Budget(config(eval_batches=20, time_budget=budget_s), World(0, 1, CPU), 0.0, now=now)
    now.t = 5.0 + batch
    budget.probed(batch, 50 * 10**6)
    assert budget.cannot_start() is None
    steps = 0
    while True:
        if steps == slower_after > 0:
            step, batch = 4 * step, 4 * batch
        seconds = first if steps == 0 else step
        now.t += seconds
        budget.stepped(seconds)
        steps += 1
        if budget.exhausted(now_eval=False, now_save=False):
            break
    return steps, now.t + 20 * batch + 2 * 0.5


def test_a_budget_trains_every_step_that_fits_with_the_final_evaluation_and_save():
    """A slow first step (10 s: warm-up) and 3 s steps, a 60 s budget: after 8 steps 37 s
    are used and the evaluation (20 s) and saves (1 s) end at 58 s; a ninth step would end
    them at 61 s. The old budget took each held-out batch to last as long as the longest of
    the last ten steps (200 s for the evaluation): it stopped after step 1."""
    steps, ended = simulate(60, first=10.0, step=3.0, batch=1.0)
    assert steps == 8 and ended == 58.0


@pytest.mark.parametrize("step", [0.5, 2.0, 7.0])
def test_the_budget_is_kept_whatever_the_step_time(step):
    _, ended = simulate(120, first=3 * step, step=step, batch=step / 3)
    assert ended <= 120 < ended + step  # kept, and no room for another step


def test_the_evaluation_estimate_follows_a_machine_that_slows_down():
    """After 5 steps the machine is 4 times slower: the evaluation timed at the start (20 s)
    would now take 80 s; the estimate follows the steps, and the run ends at 193 s."""
    steps, ended = simulate(200, first=10.0, step=3.0, batch=1.0, slower_after=5)
    assert steps == 12 and ended == 193.0, (steps, ended)  # a 13th step: 205 s


def test_a_budget_that_cannot_fit_one_step_says_so_with_the_figures():
    now = FakeClock()
    budget = Budget(config(eval_batches=20, time_budget=60), World(0, 1, CPU), 0.0, now=now)
    now.t = 50.0  # data preparation
    budget.probed(1.0, 10**8)  # 20 held-out batches: ~20 s
    refusal = budget.cannot_start()
    assert refusal is not None and refusal.startswith("time budget (60 s) cannot fit one step: ")
    assert "50.0 s are used already" in refusal and "~20.0 s" in refusal
    assert "Give --time-budget 75 or more" in refusal  # 50 + 3 x 1 + 20 + 2 x 1


def test_a_first_step_longer_than_the_budget_still_says_so():
    now = FakeClock()
    budget = Budget(config(time_budget=10), World(0, 1, CPU), 0.0, now=now)
    budget.probed(0.1, 0)
    now.t = 30.0
    budget.stepped(29.0)
    assert budget.exhausted(now_eval=False, now_save=False)
    assert "the first step alone ended past it, 30.0 s after" in stop_reason(
        "time_budget", None, None, budget.config, budget
    )


# -- 16, 19. what the run says before its first step -----------------------------------------
def test_a_warm_up_as_long_as_the_run_and_a_missing_plot_are_said_first(
    corpus, tmp_path, monkeypatch
):
    """`--steps 40` with the default `--warmup 100` never reached the peak nor decayed,
    silently; without matplotlib, no loss.png was said only at the end of the run."""
    from zoo.train import start

    monkeypatch.setattr(start, "can_plot", lambda: False)
    lines: list[str] = []
    result = run(corpus, tmp_path / "run", config=config(steps=2, warmup=5), log=lines.append)
    assert lines[0] == (
        "warning: the warm-up (5 steps) is not shorter than the run (2 steps): the learning "
        "rate reaches 0.0012 (the peak is 0.003) at the last step and never decays to 0.0003; "
        "a tenth of the steps (--warmup 0) reaches the peak, then decays"
    )
    assert lines[1].startswith("no loss.png: matplotlib is not installed (pip install ")
    assert "'torch-zoo[train]')" in lines[1]
    assert result.steps == 2 and not (tmp_path / "run" / "loss.png").exists()


def test_a_run_longer_than_its_warm_up_says_nothing_first():
    from zoo.train.start import opening_lines

    assert opening_lines(TrainConfig(), plotting=True) == []
    assert opening_lines(TrainConfig(steps=101, warmup=100), plotting=True) == []
    assert len(opening_lines(TrainConfig(steps=100, warmup=100), plotting=True)) == 1


# -- 19. zoo info of a run's folder ----------------------------------------------------------
@pytest.fixture(scope="module")
def resumed_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A run stopped at its loss target after 2 of 4 steps, then resumed to the end; the
    first call's run.json is returned with it."""
    out = tmp_path_factory.mktemp("runs") / "run"
    first = run(corpus, out, config=config(loss_target=100.0))
    assert first.stopped == "loss_target" and first.steps == 2
    record = json.loads((out / "run.json").read_text())
    assert run(corpus, out).steps == 4
    return out, record


def info_rows(capsys: pytest.CaptureFixture[str], folder: Path) -> dict[str, str]:
    """``zoo info FOLDER``'s ``run:`` rows, by name."""
    assert main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    section = out.split("\n  run:\n")[1]
    rows = (line.strip().split("  ", 1) for line in section.splitlines())
    return {name: value.strip() for name, value in rows}


def test_zoo_info_of_a_run_folder_shows_the_run(resumed_run, corpus, capsys):
    out, first = resumed_run
    assert first["stopped"] == "loss_target" and first["step"] == 2
    record = json.loads((out / "run.json").read_text())
    assert record["started"] == first["started"] and record["seconds"] > first["seconds"]
    rows = info_rows(capsys, out)
    losses = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    vals = [r["val_loss"] for r in losses if "val_loss" in r]
    assert rows["steps"] == "4 of 4 (all done)"
    assert rows["last loss"] == f"{losses[-1]['loss']:.4f} (training, step 4)"
    assert rows["last val loss"] == f"{vals[-1]:.4f} (held-out, step 4)"
    assert rows["best val loss"].startswith(f"{min(vals):.4f} (step ")
    assert rows["data"] == str(corpus.resolve())
    assert rows["tokens seen"] == f"{4 * 4 * 16:,} (4 x 16 a step)"
    assert rows["wall time"].endswith(" s") and rows["started"] == first["started"]


def test_zoo_info_of_an_older_or_damaged_run_folder_says_what_it_can(resumed_run, tmp_path, capsys):
    out, _ = resumed_run
    old = tmp_path / "old"
    shutil.copytree(out, old)
    (old / "run.json").unlink()  # a run from before run.json
    with open(old / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')  # a run killed mid-line
    rows = info_rows(capsys, old)
    assert rows["steps"] == "4 of 4" and "not recorded" in rows["data, time"]
    assert rows["metrics.jsonl"] == "1 line(s) that are not a step's record"
    (old / "run.json").write_text("[1, 2")
    assert info_rows(capsys, old)["run.json"].startswith("unreadable (")


def test_zoo_info_of_a_run_with_no_model_yet_shows_the_run(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 5.5, "lr": 0.001}\n')
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{out}: a training run (no model saved yet)\n  run:\n")
    assert "    last loss   5.5000 (training, step 1)\n" in text
