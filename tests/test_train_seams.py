"""Training's seams: a diverging run stops with an error and saves nothing non-finite; a
tampered resumable state is refused before any step; signals, a second run on one folder and
negative settings are told apart; metrics and the loss plot appear as the run goes; the stop
reason, the time budget and the device check are what they say."""

from __future__ import annotations

import functools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

import zoo
from zoo.errors import ConfigError
from zoo.train import DivergedError, ResumeError, RunLockedError, TrainConfig, train

WORDS = "the quick brown fox jumps over a lazy dog and then runs far into the green wood"
TINY = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "context_length": 16}
CONFIG = TrainConfig(steps=4, batch_size=4, lr=3e-3, min_lr=3e-4, warmup=1, eval_every=2)
CONFIG = TrainConfig(**{**CONFIG.__dict__, "eval_batches": 2})
BYTE = zoo.tokenizer("byte")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS.split()) for _ in range(10)) + "." for _ in range(200)]
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("\n".join(lines))
    return path


def tiny(**overrides: Any) -> zoo.nn.ZooModel:
    torch.manual_seed(0)
    return zoo.build("gpt2-124m", **{**TINY, "vocab_size": 257, "dropout": 0.0, **overrides})


def run(corpus: Path, out: Path, config: TrainConfig = CONFIG, **kwargs: Any) -> Any:
    kwargs.setdefault("log", None)
    return train(tiny(), corpus, out, config=config, tokenizer=BYTE, **kwargs)


def strict_json(line: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"bare {name} is not JSON")

    return json.loads(line, parse_constant=refuse)


def zoo_train(corpus: Path, out: Path, *extra: str) -> list[str]:
    """``zoo train`` argv for a tiny GPT-2 (its own GPT-2 tokenizer, vendored)."""
    return [
        "train", "gpt2-124m", "--data", str(corpus), "--out", str(out), "--batch-size", "4",
        "--warmup", "1", "--eval-every", "2",
        *[f"--set={k}={v}" for k, v in {**TINY, "dropout": 0}.items()], *extra,
    ]  # fmt: skip


# -- A. a diverging run --------------------------------------------------------------------------
def test_a_diverging_run_stops_with_an_error_and_saves_nothing_non_finite(corpus, tmp_path):
    from zoo.cli import main

    out = tmp_path / "run"
    argv = zoo_train(corpus, out, "--steps", "8", "--lr", "1e30", "--checkpoint-every", "1")
    assert main(argv) == 2  # not 0
    assert not (out / "model").exists()  # the NaN model is not saved
    lines = [strict_json(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["loss"] is None and lines[-1]["diverged"] is True
    assert all(math.isfinite(r["loss"]) for r in lines[:-1])
    saved = json.loads((out / "checkpoint" / "trainer.json").read_text())
    assert saved["step"] == len(lines) - 1  # the last good step
    weights = zoo.load(out / "checkpoint" / "model")
    assert all(bool(torch.isfinite(v).all()) for v in weights.state_dict().values())


def test_the_diverged_error_names_the_step_and_the_fix(corpus, tmp_path, capsys):
    config = TrainConfig(**{**CONFIG.__dict__, "lr": 1e30, "min_lr": 1e29, "steps": 8})
    with pytest.raises(
        DivergedError, match=r"step \d+: the training loss is (nan|inf).*Lower --lr"
    ):
        run(corpus, tmp_path / "run", config=config)


# -- B. a tampered resumable state ----------------------------------------------------------------
@pytest.fixture(scope="module")
def halfway(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped by SIGINT at step 3 of 4: its checkpoint is to be resumed."""
    out = tmp_path_factory.mktemp("halfway") / "run"

    def interrupt(line: str) -> None:
        if line.startswith("step 2:"):
            os.kill(os.getpid(), signal.SIGINT)

    result = run(corpus, out, log=interrupt)
    assert result.steps == 3 and result.interrupted and result.signal == signal.SIGINT
    assert result.stopped == "signal"
    return out


def copy_of(halfway: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(halfway, out)
    (out / ".zoo-train-lock").unlink(missing_ok=True)
    return out


def tamper_tensors(out: Path, change: Any) -> None:
    path = out / "checkpoint" / "state.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    change(tensors)
    path.unlink()  # a link into the current version: write a plain file instead
    safetensors.torch.save_file(tensors, str(path))


def test_an_untampered_checkpoint_resumes(halfway, corpus, tmp_path):
    result = run(corpus, copy_of(halfway, tmp_path))
    assert result.steps == 4 and len(result.losses) == 1 and result.stopped == "steps"


def _zeros_1(tensors: dict[str, torch.Tensor]) -> None:
    for key in tensors:
        if key.endswith("/exp_avg"):
            tensors[key] = torch.zeros(1)


def test_a_too_small_optimizer_tensor_is_an_error_not_a_segfault(halfway, corpus, tmp_path):
    """The fused AdamW would write past the end of a 1-element ``exp_avg`` (SIGSEGV)."""
    out = copy_of(halfway, tmp_path)
    tamper_tensors(out, _zeros_1)
    child = f"""
import torch, zoo
from zoo.train import TrainConfig, train
torch.manual_seed(0)
model = zoo.build("gpt2-124m", **{TINY!r}, vocab_size=257, dropout=0.0)
train(model, {str(corpus)!r}, {str(out)!r}, config=TrainConfig(**{CONFIG.__dict__!r}),
      tokenizer=zoo.tokenizer("byte"), log=None)
"""
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])  # not -11 (SIGSEGV)
    assert "ResumeError" in done.stderr and "exp_avg" in done.stderr, done.stderr[-2000:]


def _bigger(tensors: dict[str, torch.Tensor]) -> None:
    key = next(k for k in tensors if k.endswith("/exp_avg") and tensors[k].ndim == 2)
    rows, cols = tensors[key].shape
    tensors[key] = torch.zeros(rows + 1, cols)


def _nan(tensors: dict[str, torch.Tensor]) -> None:
    key = next(k for k in tensors if k.endswith("/exp_avg_sq"))
    tensors[key] = tensors[key].clone().fill_(float("nan"))


def _step(tensors: dict[str, torch.Tensor]) -> None:
    key = next(k for k in tensors if k.endswith("/step"))
    tensors[key] = torch.tensor(1e9)


def _int_step(tensors: dict[str, torch.Tensor]) -> None:
    key = next(k for k in tensors if k.endswith("/step"))
    tensors[key] = torch.tensor([3, 3])


def _rng(tensors: dict[str, torch.Tensor]) -> None:
    tensors["rng.torch"] = torch.zeros(3, dtype=torch.uint8)


def _stranger(tensors: dict[str, torch.Tensor]) -> None:
    tensors["optimizer/no.such.weight/exp_avg"] = torch.zeros(2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_bigger, r"exp_avg' is torch.float32 \(\d+, 32\), this model needs"),
        (_nan, "exp_avg_sq' holds NaN"),
        (_step, r"step' is 1000000000.0, not a step in 0..3"),
        (_int_step, "step' must be a floating scalar tensor"),
        (_rng, "rng.torch' is torch.uint8 \\(3,\\)"),
        (_stranger, "unknown tensor 'optimizer/no.such.weight/exp_avg'"),
    ],
)
def test_tampered_optimizer_tensors_are_refused(halfway, corpus, tmp_path, change, message):
    out = copy_of(halfway, tmp_path)
    tamper_tensors(out, change)
    with pytest.raises(ResumeError, match=message):
        run(corpus, out)


def _rewrite_json(out: Path, text: str) -> None:
    path = out / "checkpoint" / "trainer.json"
    path.unlink()
    path.write_text(text)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda meta: "[" * 100_000 + "]" * 100_000, "is not valid JSON"),
        (lambda meta: json.dumps([meta]), "must hold a JSON object, got list"),
        (lambda meta: json.dumps({**meta, "step": "3"}), "'step' must be a JSON int"),
        (lambda meta: json.dumps({**meta, "step": 99}), r"step 99 is not in 0..4"),
        (lambda meta: json.dumps({**meta, "history": [{"step": 1}]}), "1 history records"),
        (lambda meta: json.dumps(meta).replace('"loss": ', '"loss": NaN, "x": ', 1), "NaN is not"),
        (
            lambda meta: json.dumps({**meta, "param_groups": [{"params": []}]}),
            "param_groups: 1 groups, this optimizer has 2",
        ),
        (
            lambda meta: json.dumps(
                {**meta, "param_groups": [{**g, "eps": "x"} for g in meta["param_groups"]]}
            ),
            r"param_groups\[0\].eps is 'x'",
        ),
    ],
)
def test_a_tampered_trainer_json_is_refused(halfway, corpus, tmp_path, edit, message):
    out = copy_of(halfway, tmp_path)
    meta = json.loads((out / "checkpoint" / "trainer.json").read_text())
    _rewrite_json(out, edit(meta))
    with pytest.raises(ResumeError, match=message):
        run(corpus, out)


def test_resuming_with_other_settings_says_which(halfway, corpus, tmp_path):
    out = copy_of(halfway, tmp_path)
    other = TrainConfig(**{**CONFIG.__dict__, "lr": 1e-3, "eval_every": 1})  # eval may change
    with pytest.raises(
        ResumeError, match=r"other settings: lr 0.003 \(now 0.001\)\. To start a new run"
    ):
        run(corpus, out, config=other)


def test_resuming_another_model_says_so(halfway, corpus, tmp_path):
    out = copy_of(halfway, tmp_path)
    model = tiny(d_ff=128)
    with pytest.raises(ResumeError, match=r"written for another model \(blocks.0.ffn"):
        train(model, corpus, out, config=CONFIG, tokenizer=BYTE, log=None)


# -- C. signals, one run per folder, negative settings ------------------------------------------
@pytest.mark.parametrize(
    ("sig", "code"),  # a child trains until signalled (~10 s each): SIGINT's in the default run
    [pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow), (signal.SIGTERM, 143)],
)
def test_a_signal_saves_then_exits_128_plus_its_number(corpus, tmp_path, sig, code):
    out = tmp_path / "run"
    argv = zoo_train(corpus, out, "--steps", "100000", "--eval-every", "0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
    )
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text()):
            time.sleep(0.1)  # D: a line per step, as it happens
        assert metrics.read_text(), "no metrics line while running"
        proc.send_signal(sig)
        err, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err[-2000:]
    assert f"{signal.Signals(sig).name} (checkpoint saved" in err
    saved = json.loads((out / "checkpoint" / "trainer.json").read_text())
    assert saved["step"] >= 1 and (out / "model").exists()


def test_a_second_run_on_the_same_folder_is_refused_while_the_first_holds_it(corpus, tmp_path):
    from filelock import FileLock

    from zoo.cli import main

    out = tmp_path / "run"
    out.mkdir()
    with FileLock(str(out / ".zoo-train-lock")):  # as a running `zoo train` holds it
        with pytest.raises(RunLockedError, match="being trained into by another run"):
            run(corpus, out)
        assert main(zoo_train(corpus, out, "--steps", "2")) == 2
    assert not (out / "checkpoint").exists() and not (out / "data").exists()
    assert run(corpus, out).steps == 4  # released: the run goes
    assert run(corpus, out).steps == 4  # and released again at its end


def test_a_lock_left_by_a_killed_run_does_not_block_the_next(corpus, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = (
        "import os, signal; from filelock import FileLock; "
        f"FileLock({str(out / '.zoo-train-lock')!r}).acquire(); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    done = subprocess.run([sys.executable, "-c", holder], env=ENV, timeout=60)
    assert done.returncode == -signal.SIGKILL and (out / ".zoo-train-lock").exists()
    assert run(corpus, out).steps == 4


def test_eval_batches_reaches_the_run_from_the_command_line(corpus, tmp_path, capsys):
    from zoo.cli import main

    assert main(zoo_train(corpus, tmp_path / "run", "--eval-batches", "0")) == 2
    assert "TrainConfig.eval_batches must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything was made


@pytest.mark.parametrize("name", ["warmup", "eval_every", "checkpoint_every"])
def test_negative_intervals_are_refused(corpus, tmp_path, name, capsys):
    from zoo.cli import main

    with pytest.raises(ConfigError, match=f"TrainConfig.{name} must be >= 0"):
        TrainConfig(**{name: -1})
    flag = "--" + name.replace("_", "-")
    assert main(zoo_train(corpus, tmp_path / "run", flag, "-5")) == 2
    assert f"TrainConfig.{name} must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything was made


# -- D. metrics and plot as the run goes ---------------------------------------------------------
def test_metrics_and_the_loss_plot_appear_while_the_run_goes(corpus, tmp_path):
    out = tmp_path / "run"
    seen: dict[str, Any] = {}

    def look(line: str) -> None:
        if line.startswith("step 4:"):  # step 4's evaluation: steps 1-3 are written
            seen["lines"] = (out / "metrics.jsonl").read_text().splitlines()
            seen["png"] = (out / "loss.png").exists()  # drawn at step 2's evaluation

    run(corpus, out, config=TrainConfig(**{**CONFIG.__dict__, "steps": 6}), log=look)
    assert [strict_json(line)["step"] for line in seen["lines"]] == [1, 2, 3]
    assert seen["png"]
    final = [strict_json(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in final] == [1, 2, 3, 4, 5, 6]


# -- E. periodic checkpoints by default ------------------------------------------------------------
def test_checkpoints_are_written_at_every_evaluation_by_default(corpus, tmp_path, monkeypatch):
    from zoo.train import loop

    saved: list[int] = []
    real = loop.save_state

    def spy(out: Path, model: Any, optimizer: Any, step: int, *args: Any, **kwargs: Any) -> None:
        saved.append(step)
        real(out, model, optimizer, step, *args, **kwargs)

    monkeypatch.setattr(loop, "save_state", spy)
    assert TrainConfig().checkpoint_every is None and TrainConfig().checkpoint_interval == 200
    run(corpus, tmp_path / "run", config=TrainConfig(**{**CONFIG.__dict__, "steps": 6}))
    assert saved == [2, 4, 6]
    saved.clear()
    no_periodic = TrainConfig(**{**CONFIG.__dict__, "steps": 6, "checkpoint_every": 0})
    run(corpus, tmp_path / "other", config=no_periodic)
    assert saved == [6]


# -- F. the stop reason ----------------------------------------------------------------------------
def test_the_stop_line_names_the_loss_target(corpus, tmp_path):
    lines: list[str] = []
    config = TrainConfig(**{**CONFIG.__dict__, "eval_every": 1, "loss_target": 10.0})
    result = run(corpus, tmp_path / "run", config=config, log=lines.append)
    assert result.steps == 1 and result.stopped == "loss_target" and not result.interrupted
    assert any(
        line.startswith("stopped at step 1: loss target reached (val ") and "<= 10)" in line
        for line in lines
    ), lines


# -- G. the time budget ----------------------------------------------------------------------------
class WorkClock:
    """The clock a run reads, moved only by the work it does: each forward pass (a step's,
    an evaluation batch's) takes ``PASS`` seconds, each save (the checkpoint, the final model)
    ``SAVE``. The budget's decisions are then the same on an idle or a busy machine: no
    assertion here depends on how fast the machine is."""

    PASS, SAVE = 0.2, 0.1

    def __init__(self) -> None:
        self.now = 0.0
        self.passes = 0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def work_clock(monkeypatch: pytest.MonkeyPatch) -> WorkClock:
    """zoo.train's clock readings (the run's start, each step, evaluation and save, the
    budget's ``now``) come from a :class:`WorkClock`."""
    from types import SimpleNamespace

    from zoo.train import loop, start, steps
    from zoo.train.time_budget import Budget

    clock = WorkClock()
    fake_time = SimpleNamespace(monotonic=clock.monotonic)
    for module in (loop, start, steps):
        monkeypatch.setattr(module, "time", fake_time)
    monkeypatch.setattr(start, "Budget", functools.partial(Budget, now=clock.monotonic))

    def costs(seconds: float, real: Any, counts: bool = False) -> Any:
        def work(*args: Any, **kwargs: Any) -> Any:
            clock.now += seconds
            clock.passes += counts
            return real(*args, **kwargs)

        return work

    monkeypatch.setattr(steps, "loss_of", costs(WorkClock.PASS, steps.loss_of, counts=True))
    monkeypatch.setattr(loop, "save_state", costs(WorkClock.SAVE, loop.save_state))
    monkeypatch.setattr(loop, "save", costs(WorkClock.SAVE, loop.save))
    return clock


def test_the_time_budget_is_kept_by_not_starting_a_step_that_would_end_past_it(
    corpus, tmp_path, work_clock
):
    """Forward passes of 0.2 s, saves of 0.1 s and a 6 s budget: the run, its final
    evaluation and model included, ends within it, and near it (it did not stop early). The
    old loop checked the clock only after a step, then evaluated and saved past the budget
    (6.7 s on this clock). A clock the work moves, not the wall: a wall-clock bound
    failed beside a busy test worker (6.09 s)."""
    lines: list[str] = []
    config = TrainConfig(**{**CONFIG.__dict__, "steps": 1000, "eval_every": 3, "time_budget": 6})
    result = run(corpus, tmp_path / "run", config=config, log=lines.append)
    assert 5.0 < work_clock.now <= 6.0, (work_clock.now, lines)
    assert result.stopped == "time_budget" and result.steps >= 2, (result.steps, lines)
    assert any("stopped at step" in line and "time budget (6 s): " in line for line in lines)


def test_a_budget_that_cannot_fit_one_step_is_refused_before_it(corpus, tmp_path, work_clock):
    """A held-out batch is timed before step 1 (0.2 s here): a step, the final evaluation
    (2 batches) and the checkpoint cannot end within 0.1 s. The old loop trained one step
    past the budget, then evaluated and saved."""
    config = TrainConfig(**{**CONFIG.__dict__, "steps": 100, "time_budget": 0.1})
    with pytest.raises(ConfigError, match=r"time budget \(0.1 s\) cannot fit one step: ") as e:
        run(corpus, tmp_path / "run", config=config)
    assert "final evaluation (2 held-out batches, ~0." in str(e.value)
    assert "Give --time-budget " in str(e.value)
    assert work_clock.passes == 2  # the two timed held-out batches, no training step
    left = [p for p in ("checkpoint", "model", "metrics.jsonl") if (tmp_path / "run" / p).exists()]
    assert not left  # nothing trained, nothing for zoo info to take for a run


# -- I. the device check -----------------------------------------------------------------------
def test_training_on_a_missing_cuda_device_is_a_clear_error(corpus, tmp_path, monkeypatch, capsys):
    from zoo.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert main(zoo_train(corpus, tmp_path / "run", "--device", "cuda", "--steps", "2")) == 2
    assert "sees no CUDA device" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        run(corpus, tmp_path / "api", device="cuda")


# -- a run's folder loads its model -------------------------------------------------------------
def logits_of(source: Path) -> torch.Tensor:
    with torch.no_grad():
        return zoo.load(source)(torch.tensor([[5, 6, 7, 8]]))


def test_a_run_folder_and_its_checkpoint_folder_load_their_models(corpus, tmp_path, capsys):
    """`zoo train --out OUT` leaves OUT/model and OUT/checkpoint/model: OUT loads the final
    model, OUT/checkpoint the resumable one, as `zoo generate`/`zoo info` take them (both used
    to say 'has no config.json ... Save with zoo.save()')."""
    from zoo.cli import main

    out = tmp_path / "run"
    run(corpus, out)
    assert torch.equal(logits_of(out), logits_of(out / "model"))
    assert torch.equal(logits_of(out / "checkpoint"), logits_of(out / "checkpoint" / "model"))
    for source in (out, out / "checkpoint"):
        argv = ["generate", str(source), "ab", "--max-new-tokens", "3", "--temperature", "0"]
        assert main(argv) == 0
        assert main(["info", str(source)]) == 0
    capsys.readouterr()


def test_a_run_stopped_before_its_final_model_loads_from_its_checkpoint(halfway, tmp_path):
    out = copy_of(halfway, tmp_path)
    shutil.rmtree(out / "model", ignore_errors=True)  # stopped before the final model/
    assert torch.equal(logits_of(out), logits_of(out / "checkpoint" / "model"))
