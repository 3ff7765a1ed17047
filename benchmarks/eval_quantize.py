"""What quantization and bfloat16 cost in accuracy, measured on a trained model: top-1
agreement with float32 and the held-out loss, on Tiny Shakespeare's validation split (the
last 10%), for the shipped ``shakespeare-byte``.

    python benchmarks/eval_quantize.py --markdown benchmarks/RESULTS-quantize.md

Every byte of the split after the first is predicted once (non-overlapping windows of the
model's context); agreement is the share of those predictions whose most likely next byte is
the float32 model's.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

import torch
from common import machine_facts, publish

import zoo

VARIANTS = {
    "float32": {},
    "bfloat16": {"dtype": torch.bfloat16},
    "int8 (int8 weights, activations quantized per call)": {"quantize": "int8"},
    "int8-weight (weight-only)": {"quantize": "int8-weight"},
    "int4 (weight-only, groups of 32)": {"quantize": "int4"},
}


def predictions(model: torch.nn.Module, data: bytes, batch: int = 32) -> tuple[torch.Tensor, float]:
    """Top-1 predictions over the validation split and the mean loss, nats per byte."""
    val = torch.tensor(list(data[int(len(data) * 0.9) :]))
    context = model.config.context_length
    n = (len(val) - 1) // context
    inputs = val[: n * context].view(n, context)  # (n, context)
    targets = val[1 : n * context + 1].view(n, context)
    top, total = [], 0.0
    with torch.no_grad():
        for i in range(0, n, batch):
            logits = model(inputs[i : i + batch]).float()  # (b, context, vocab)
            top.append(logits.argmax(-1).flatten())
            total += float(
                torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), targets[i : i + batch].flatten(), reduction="sum"
                )
            )
    return torch.cat(top), total / (n * context)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", default="shakespeare-byte")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    data_dir = Path(str(resources.files("zoo_plugins.shakespeare").joinpath("data")))
    data = (data_dir / "tinyshakespeare.txt").read_bytes()
    reference, base = predictions(zoo.load(args.checkpoint), data)
    rows = ["| weights | top-1 agreement with float32 | val loss (nats/byte) | change |",
            "|---|---:|---:|---:|"]  # fmt: skip
    for label, options in VARIANTS.items():
        top, loss = predictions(zoo.load(args.checkpoint, **options), data)
        agree = float((top == reference).float().mean())
        rows.append(f"| {label} | {agree:.2%} | {loss:.4f} | {loss - base:+.4f} |")
    report = "\n".join(rows) + (
        f"\n\n`{args.checkpoint}`, {reference.numel():,} predictions over the validation split. "
        f"Machine: {machine_facts('torch')}."
    )
    publish(report, title="Accuracy of bfloat16 and quantized weights", markdown=args.markdown)


if __name__ == "__main__":
    main()
