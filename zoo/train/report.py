"""What people look at during and after a run: a progress bar, a JSONL metrics log and a
loss-curve PNG next to the checkpoint."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["Progress", "plot_losses", "write_metrics"]


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


def write_metrics(path: Path, history: Sequence[dict[str, Any]]) -> None:
    """One JSON object per step: ``step``, ``loss``, ``lr`` and, when evaluated, ``val_loss``."""
    with open(path, "w", encoding="utf-8") as f:
        for record in history:
            f.write(json.dumps(record) + "\n")


def plot_losses(path: Path, history: Sequence[dict[str, Any]], *, title: str) -> bool:
    """Training and held-out loss against step, as a PNG (matplotlib, headless). Returns
    whether it was written (``False`` when matplotlib is not installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
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
    figure.savefig(path)
    plt.close(figure)
    return True
