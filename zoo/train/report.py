"""What people look at during and after a run: a progress bar, a JSONL metrics log and a
loss-curve PNG next to the checkpoint."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

__all__ = ["MetricsLog", "Progress", "can_plot", "json_line", "plot_losses", "write_metrics"]


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
