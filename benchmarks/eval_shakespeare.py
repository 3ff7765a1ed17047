"""Held-out loss of a byte-level model on Tiny Shakespeare's validation split (the last 10%,
nanoGPT's split), in nats per byte (= per character: the text is ASCII).

    python benchmarks/eval_shakespeare.py [CHECKPOINT]      # default: the shipped shakespeare-byte

Every byte of the split after the first is predicted once: non-overlapping windows of the
model's context, each token conditioned on the bytes before it in its window.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

import torch

import zoo


def val_loss(model: torch.nn.Module, data: bytes, batch: int = 32) -> float:
    val = torch.tensor(list(data[int(len(data) * 0.9) :]))
    context = model.config.context_length
    n = (len(val) - 1) // context
    inputs = val[: n * context].view(n, context)  # (n, context)
    targets = val[1 : n * context + 1].view(n, context)
    total = 0.0
    with torch.no_grad():
        for i in range(0, n, batch):
            logits = model(inputs[i : i + batch])
            total += float(
                torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1).float(), targets[i : i + batch].flatten(), reduction="sum"
                )
            )
    return total / (n * context)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", default="shakespeare-byte")
    args = parser.parse_args()
    model = zoo.load(args.checkpoint)
    data_dir = Path(str(resources.files("zoo_plugins.shakespeare").joinpath("data")))
    data = (data_dir / "tinyshakespeare.txt").read_bytes()
    print(f"{args.checkpoint}: val loss {val_loss(model, data):.4f} nats per byte")


if __name__ == "__main__":
    main()
