"""Adapters through layouts that regroup a fused weight's rows: a fused query/key/value weight
stored per key/value group (Falcon's grouped ``query_key_value``: each group's queries, then
its key, then its value) is a row move (``KeyRule(per_kv_group=True)``), so a LoRA on zoo's
``attn.qkv`` is written as peft's adapter on the foreign module with ``B``'s rows regrouped,
exactly, and read back to the same adapter; a layout with a ``merge_foreign`` that only reads
other spellings (GPT-BigCode's, a no-op) no longer refuses adapters for the whole family."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from planted import Planted
from test_adapters_peft import _zoo_adapter

import zoo
from zoo.adapters import apply_adapter, read_adapter
from zoo.adapters.lora import LoRA, adapter_state
from zoo.api import resolve_config
from zoo.checkpoint.hf_layout import KeyRule
from zoo.plugin.current import load_registry

_QKV = KeyRule(
    "model.layers.{i}.self_attn.query_key_value.weight", "blocks.{i}.attn.qkv.weight",
    per_kv_group=True,
)  # fmt: skip
_SIZES = {"d_model": 48, "n_heads": 6, "n_kv_heads": 2, "n_layers": 2, "d_ff": 64,
          "vocab_size": 101}  # fmt: skip


def _grouped_layout() -> Any:
    arch, _, _ = resolve_config("smollm2-135m-instruct")
    llama = arch.checkpoint_layout("hf-llama")
    return dataclasses.replace(
        llama,
        fused=tuple(rule for rule in llama.fused if "qkv" not in rule.zoo),
        rules=(*llama.rules, _QKV),
        merge_foreign=lambda state, config: state,  # reads nothing otherwise (GPT-BigCode's)
    )


@pytest.fixture
def grouped(use_registry: Any) -> None:
    plant = Planted("smollm2-135m-instruct", {"llama-grouped": ("hf-llama", _grouped_layout())})
    use_registry(load_registry(plugins={"grouped": plant}))


def test_the_grouped_rows_are_falcons() -> None:
    """Against the way transformers' Falcon splits its fused weight: ``view(kv, per + 2,
    head_dim, d)``, the group's queries ``[:, :per]``, its key ``[:, per]``, value ``[:, -1]``."""
    config = resolve_config("smollm2-135m-instruct")[2].replace(**_SIZES)
    kv, per, hd = 2, 3, config.head_size
    ours = torch.randn((6 + 2 * kv) * hd, config.d_model)
    foreign = _QKV.convert(ours, config, side="zoo")
    grouped = foreign.view(kv, per + 2, hd, -1)
    q, k, v = ours.split([6 * hd, kv * hd, kv * hd])
    assert torch.equal(grouped[:, :per].reshape(6 * hd, -1), q)
    assert torch.equal(grouped[:, per].reshape(kv * hd, -1), k)
    assert torch.equal(grouped[:, -1].reshape(kv * hd, -1), v)
    assert torch.equal(_QKV.convert(foreign, config, side="foreign"), ours)


def test_an_adapter_goes_through_the_grouped_layout_exactly(grouped: None, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = zoo.build("llama-grouped-tiny", **_SIZES).eval()
    config = model.config
    _zoo_adapter(model, tmp_path, LoRA(rank=2, targets=("attn.qkv",)))  # random A and B
    tensors = safetensors.torch.load_file(tmp_path / "adapter_model.safetensors")
    stem = "base_model.model.model.layers.0.self_attn.query_key_value"
    assert sorted(tensors) == sorted(
        f"base_model.model.model.layers.{i}.self_attn.query_key_value.lora_{ab}.weight"
        for i in range(2) for ab in "AB"
    )  # fmt: skip
    state = adapter_state(model)  # one adapter over the whole fused layer, as stored
    a_ours, b_ours = state["blocks.0.attn.qkv.A"], state["blocks.0.attn.qkv.B"]
    assert torch.equal(tensors[f"{stem}.lora_A.weight"], a_ours)
    assert torch.equal(tensors[f"{stem}.lora_B.weight"], _QKV.convert(b_ours, config, side="zoo"))
    fresh = zoo.build("llama-grouped-tiny", **_SIZES).eval()
    fresh.load_state_dict({k: v for k, v in model.state_dict().items() if "lora" not in k},
                          strict=False)  # fmt: skip
    apply_adapter(fresh, read_adapter(tmp_path, model=fresh))
    for key, value in adapter_state(model).items():
        assert torch.equal(adapter_state(fresh)[key], value), key
