"""The model zoo trained and ships: shakespeare-byte loads offline from the package,
generates reproducibly, and has learned its data."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import torch

import zoo

DATA = Path(str(resources.files("zoo_plugins.shakespeare").joinpath("data")))


def test_the_text_is_the_vendored_one():
    digest = hashlib.sha256((DATA / "tinyshakespeare.txt").read_bytes()).hexdigest()
    assert (DATA / "SHA256SUMS").read_text().split()[0] == digest
    assert digest == "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def test_the_shipped_model_loads_offline_and_generates_reproducibly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = zoo.load("shakespeare-byte", verify=True)  # the sha256 config.json records
    assert model.name == "shakespeare-byte" and model.tokenizer.name == "byte"
    texts = {zoo.generate(model, "ROMEO:", max_new_tokens=40, seed=1) for _ in range(2)}
    assert len(texts) == 1


def test_the_shipped_model_has_learned_shakespeare():
    """Held-out loss on the last 10% (nanoGPT's validation split) in nats per byte, on 16 fixed
    windows: far below a uniform model's ln(257) = 5.55."""
    model = zoo.load("shakespeare-byte")
    data = (DATA / "tinyshakespeare.txt").read_bytes()
    val = torch.tensor(list(data[int(len(data) * 0.9) :]))
    context = model.config.context_length
    starts = torch.arange(16) * ((len(val) - context - 1) // 16)
    windows = torch.stack([val[s : s + context + 1] for s in starts.tolist()])
    with torch.no_grad():
        logits = model(windows[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
    assert loss < 1.9, f"val loss {loss:.3f}"
