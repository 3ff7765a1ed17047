"""What people look at during and after a run: a progress bar, a JSONL metrics log, a
loss-curve PNG next to the checkpoint, the run's record (``run.json``: data, times, why it
stopped) and the summary ``zoo info RUN_FOLDER`` prints. Torch-free."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from .. import jsonfile

__all__ = [
    "RUN_RECORD",
    "MetricsLog",
    "Progress",
    "can_plot",
    "is_run_folder",
    "json_line",
    "plot_losses",
    "read_run_record",
    "run_summary",
    "utc_now",
    "write_metrics",
    "write_run_record",
]


class Progress:
    """A tqdm bar on stderr: step, loss, learning rate, tokens per second and ETA. Silent when
    ``enabled`` is false (other ranks, tests)."""

    def __init__(self, *, total: int, initial: int, enabled: bool) -> None:
        self.bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def update(self, *, loss: float, lr: float, tokens_per_second: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(
                loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:,.0f}", refresh=False
            )
            self.bar.update(1)

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def json_line(record: dict[str, Any]) -> str:
    """``record`` as one line of strict JSON: a NaN or infinite number is written ``null``
    (Python's ``json`` would write bare ``NaN``, which JSON readers refuse)."""
    clean = {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()
    }
    return json.dumps(clean, allow_nan=False) + "\n"


def write_metrics(path: Path, history: Sequence[dict[str, Any]]) -> None:
    """One JSON object per step: ``step``, ``loss``, ``lr`` and, when evaluated, ``val_loss``."""
    with open(path, "w", encoding="utf-8") as f:
        for record in history:
            f.write(json_line(record))


class MetricsLog:
    """``metrics.jsonl`` as the run goes: rewritten from the resumed history when it opens
    (steps after the last checkpoint, which the run takes again, are dropped), then one line
    per step, flushed as it happens. Does nothing when ``enabled`` is false (other ranks)."""

    def __init__(self, path: Path, history: Sequence[dict[str, Any]], *, enabled: bool) -> None:
        self.file: IO[str] | None = None
        if enabled:
            self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed in __exit__)
            self.file.writelines(json_line(r) for r in history)
            self.file.flush()

    def append(self, record: dict[str, Any]) -> None:
        """Write one step's line and flush it to the OS (``tail -f`` sees it at once)."""
        if self.file is not None:
            self.file.write(json_line(record))
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def can_plot() -> bool:
    """Whether matplotlib is installed; imports it (headless) on the first call, so that a
    run can pay for the import before it times its steps."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
    except ImportError:
        return False
    return True


def plot_losses(path: Path, history: Sequence[dict[str, Any]], *, title: str) -> bool:
    """Training and held-out loss against step, as a PNG (matplotlib, headless). Returns
    whether it was written (``False`` when matplotlib is not installed). The file is
    replaced atomically, so it can be redrawn while someone looks at it."""
    if not can_plot():
        return False
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in history]
    figure, axes = plt.subplots(figsize=(7, 4), dpi=120)
    axes.plot(steps, [r["loss"] for r in history], label="training loss", linewidth=1)
    evaluated = [r for r in history if "val_loss" in r]
    if evaluated:
        axes.plot(
            [r["step"] for r in evaluated],
            [r["val_loss"] for r in evaluated],
            "o-",
            label="held-out loss",
        )
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats per token)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    partial = path.with_name(f".{path.name}.partial")  # a viewer never sees half a PNG
    figure.savefig(partial, format="png")
    plt.close(figure)
    os.replace(partial, path)
    return True


# -- the run's record and its summary (``zoo info RUN_FOLDER``) --------------------------------
RUN_RECORD = "run.json"
_MAX_RECORD_BYTES = 1 << 20  # a run.json is a few hundred bytes; a larger one is not ours


def utc_now() -> str:
    """The time now, UTC, to the second: ``2026-11-25 14:10:57 UTC``."""
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def write_run_record(out: Path, record: dict[str, Any]) -> None:
    """Replace ``<out>/run.json`` atomically with ``record`` (what :func:`run_summary` reads
    besides ``metrics.jsonl`` and the checkpoint: data, times, why the run stopped)."""
    partial = out / f".{RUN_RECORD}.partial"
    partial.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(partial, out / RUN_RECORD)


def read_run_record(out: Path) -> dict[str, Any]:
    """``<out>/run.json`` as a dict; ``{}`` when there is none (a run from before it was
    written) and ``{"unreadable": why}`` when it is damaged."""
    path = out / RUN_RECORD
    try:
        if path.stat().st_size > _MAX_RECORD_BYTES:
            return {"unreadable": f"{path} is over {_MAX_RECORD_BYTES} bytes"}
        record = jsonfile.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        return {"unreadable": f"{path}: {exc}"}
    return record if isinstance(record, dict) else {"unreadable": f"{path} holds no object"}


@dataclasses.dataclass
class _Losses:
    """What ``metrics.jsonl`` says, read one line at a time (it has a line per step)."""

    step: int = 0
    loss: float | None = None
    val_step: int = 0
    val_loss: float | None = None
    best_step: int = 0
    best_val: float | None = None
    diverged: bool = False
    damaged: int = 0  # lines that are not a step's record (a run killed mid-line)

    def add(self, line: str) -> None:
        try:
            record = jsonfile.loads(line)
            step = record["step"]
        except (ValueError, TypeError, KeyError):
            self.damaged += 1
            return
        if not isinstance(step, int) or isinstance(step, bool):
            self.damaged += 1
            return
        self.step, self.loss = step, _number(record.get("loss"))
        self.diverged = self.diverged or bool(record.get("diverged"))
        val = _number(record.get("val_loss"))
        if val is not None:
            self.val_step, self.val_loss = step, val
            if self.best_val is None or val < self.best_val:
                self.best_step, self.best_val = step, val


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def _read_losses(path: Path) -> _Losses | None:
    losses = _Losses()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip():
                    losses.add(line)
    except FileNotFoundError:
        return None
    return losses


def _planned_steps(out: Path, record: dict[str, Any]) -> int | None:
    """The steps the run was set for: its record's, else its checkpoint's settings."""
    steps = record.get("steps")
    if isinstance(steps, int):
        return steps
    try:  # a run from before run.json: its checkpoint's settings
        config = jsonfile.read(out / "checkpoint" / "trainer.json").get("config", {})
    except (OSError, ValueError, AttributeError):
        return None
    steps = config.get("steps") if isinstance(config, dict) else None
    return steps if isinstance(steps, int) else None


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` is a training run's folder (``zoo train --out``)."""
    return (path / "metrics.jsonl").is_file() or (path / RUN_RECORD).is_file()


def run_summary(out: Path) -> list[tuple[str, str]]:
    """What a run's folder records, as (name, value) lines for ``zoo info``: steps done and
    planned and why it stopped, the last and best losses, the data, what it has seen, its
    wall time and when. Reads ``run.json``, ``metrics.jsonl`` (streamed) and the
    checkpoint's settings; never fails on a damaged file (it says so)."""
    record = read_run_record(out)
    losses = _read_losses(out / "metrics.jsonl")
    rows: list[tuple[str, str]] = []
    done = losses.step if losses is not None else record.get("step", 0)
    planned = _planned_steps(out, record)
    state = record.get("stopped")
    steps = f"{done:,}" + (f" of {planned:,}" if planned is not None else "")
    if isinstance(state, str):
        steps += f" ({_STATES.get(state, state)})"
    rows.append(("steps", steps))
    if losses is not None:
        rows.extend(_loss_rows(losses))
    rows.extend(_record_rows(record, done))
    return rows


_STATES = {
    "steps": "all done",
    "loss_target": "stopped at the loss target",
    "time_budget": "stopped by the time budget",
    "signal": "interrupted: the same command resumes it",
    "running": "running, or killed before it could say why it stopped",
}


def _loss_rows(losses: _Losses) -> list[tuple[str, str]]:
    rows = []
    if losses.loss is not None:
        rows.append(("last loss", f"{losses.loss:.4f} (training, step {losses.step:,})"))
    if losses.val_loss is not None:
        rows.append(
            ("last val loss", f"{losses.val_loss:.4f} (held-out, step {losses.val_step:,})")
        )
    if losses.best_val is not None:
        rows.append(("best val loss", f"{losses.best_val:.4f} (step {losses.best_step:,})"))
    if losses.diverged:
        rows.append(("diverged", "yes: a loss became NaN or infinite (see metrics.jsonl)"))
    if losses.damaged:
        rows.append(("metrics.jsonl", f"{losses.damaged} line(s) that are not a step's record"))
    return rows


def _record_rows(record: dict[str, Any], done: int) -> list[tuple[str, str]]:
    if "unreadable" in record:
        return [("run.json", f"unreadable ({record['unreadable']})")]
    if not record:
        return [("data, time", "not recorded (a run from before zoo train wrote run.json)")]
    rows = []
    data, files = record.get("data"), record.get("files")
    if isinstance(data, str):
        count = f" ({files:,} files)" if isinstance(files, int) and files != 1 else ""
        rows.append(("data", f"{data}{count}"))
    batch, context = record.get("batch_size"), record.get("context")
    if isinstance(batch, int) and isinstance(context, int) and isinstance(done, int):
        if record.get("task") == "causal-lm":  # windows of exactly `context` tokens
            rows.append(("tokens seen", f"{done * batch * context:,} ({batch} x {context} a step)"))
        else:
            rows.append(("seen", f"{done * batch:,} sequences of up to {context} tokens"))
    seconds = record.get("seconds")
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        rows.append(("wall time", _duration(float(seconds))))
    started, updated = record.get("started"), record.get("updated")
    if isinstance(started, str):
        rows.append(("started", started))
    if isinstance(updated, str):
        rows.append(("last written", updated))
    return rows


def _duration(seconds: float) -> str:
    """``3 h 02 min 07 s``, ``4 min 05 s``, ``7.1 s``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min {secs:02d} s" if hours else f"{minutes} min {secs:02d} s"
