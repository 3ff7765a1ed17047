"""Checkpoint layouts: what a layout can hold, every key it needs, the model types it reads,
and the package boundary (the checkpoint package loads directories, never the Hub)."""

from __future__ import annotations

import dataclasses

import pytest

import zoo
from zoo.checkpoint.hf_layout import KeyRule
from zoo.checkpoint.readers import foreign_layouts
from zoo.plugin.specs import ArchitectureSpec

TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "context_length": 32}


def test_export_refuses_a_model_the_layout_cannot_hold(tmp_path):
    """A post-LN GPT-2 with sinusoidal positions written as hf-gpt2 would load in
    transformers as a different model; export refuses it, naming each field, and writes
    nothing (`zoo convert --to hf-gpt2` goes through the same check)."""
    model = zoo.build("gpt2-124m", **TINY, norm_first=False, positions="sinusoidal")
    with pytest.raises(zoo.CheckpointError) as caught:
        zoo.export(model, tmp_path / "out", layout="hf-gpt2")
    message = str(caught.value)
    assert "norm_first = False (the layout holds only True)" in message
    assert "positions = 'sinusoidal' (the layout holds only 'learned')" in message
    assert not (tmp_path / "out").exists()
    zoo.save(model, tmp_path / "zoo")
    with pytest.raises(zoo.CheckpointError, match="norm_first"):
        zoo.convert_checkpoint(tmp_path / "zoo", tmp_path / "hf", to="hf-gpt2")
    assert not (tmp_path / "hf").exists()


def test_export_writes_every_key_the_layout_needs(monkeypatch, tmp_path):
    arch = zoo.get_registry().architecture("gpt2")
    real = ArchitectureSpec.checkpoint_layout
    keymap = real(arch, "hf-gpt2")
    extra = dataclasses.replace(keymap, rules=(*keymap.rules, KeyRule("h.{i}.extra", "nowhere")))
    monkeypatch.setattr(
        ArchitectureSpec,
        "checkpoint_layout",
        lambda self, layout: extra if self.name == "gpt2" else real(self, layout),
    )
    model = zoo.build("gpt2-124m", **TINY)
    with pytest.raises(zoo.CheckpointError, match=r"leave \['h\.0\.extra', 'h\.1\.extra'\]"):
        zoo.export(model, tmp_path / "out", layout="hf-gpt2")
    assert not (tmp_path / "out").exists()


def test_the_model_types_zoo_reads_come_from_the_layouts():
    found = {
        model_type: (arch.name, layout) for model_type, (arch, layout) in foreign_layouts().items()
    }
    assert found["gpt2"] == ("gpt2", "hf-gpt2")
    assert found["openai-gpt"] == ("gpt1", "hf-openai-gpt")
    assert found["llama"] == ("llama", "hf-llama")


def test_a_model_type_no_layout_reads_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "mamba"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(
        zoo.UnknownArchitectureError, match=r"'mamba'.*model types zoo reads: .*gpt2"
    ):
        zoo.load(tmp_path)
