"""zoo.adapters.lora, the adapters themselves: a fresh adapter changes nothing, detaching gives the
base back bit for bit, merging computes what the adapter did, a fused layer's adapters are
the stack of per-part ones, targets and configs are checked. Parity with peft's files and
models is in tests/test_adapters_peft.py."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.adapters.lora import (
    LoRA,
    PartPlan,
    adapted_layers,
    adapter_parameters,
    adapter_state,
    attach_lora,
    detach_lora,
    load_adapter_state,
    merge_lora,
    plan_lora,
    target_names,
)

SMALL = {"d_model": 32, "vocab_size": 97, "context_length": 16, "d_ff": 48}


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return zoo.build("llama-tiny", **SMALL).eval()


def _randomize(model: torch.nn.Module, seed: int = 1) -> None:
    """Nonzero B (a fresh adapter has B = 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in adapter_parameters(model):
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1)


IDS = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(3))


def test_fresh_adapter_changes_nothing_and_detach_restores_bit_for_bit() -> None:
    model = _model()
    before = model(IDS)
    attach_lora(model, plan_lora(model, LoRA(rank=4)))
    assert torch.equal(model(IDS), before)  # B starts at zero
    _randomize(model)
    assert not torch.allclose(model(IDS), before)
    detach_lora(model)
    assert torch.equal(model(IDS), before)
    assert not adapted_layers(model)
    assert not any("lora" in k for k in model.state_dict())


def test_base_frozen_only_adapters_train_and_keys_are_part_paths() -> None:
    model = _model()
    attach_lora(model, plan_lora(model, LoRA(rank=2, targets=("attn.qkv", "ffn.proj"))))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora." in n for n in trainable)
    assert sorted(adapter_state(model)) == sorted(
        f"blocks.{i}.{part}.{m}"
        for i in range(2)
        for part in ("attn.q", "attn.k", "attn.v", "ffn.proj")
        for m in "AB"
    )
    base_keys = set(_model().state_dict())
    assert base_keys <= set(model.state_dict())  # the base keeps its keys


@pytest.mark.parametrize("per_part", [True, False])
def test_merge_equals_the_adapted_model(per_part: bool) -> None:
    model = _model()
    plans = plan_lora(model, LoRA(rank=3, alpha=5.0), per_part=lambda _: per_part)
    attach_lora(model, plans)
    _randomize(model)
    adapted = model(IDS)
    merge_lora(model)
    assert not adapted_layers(model)
    torch.testing.assert_close(model(IDS), adapted, rtol=0, atol=2e-5)


def test_fused_adapter_is_the_stack_of_per_part_ones() -> None:
    """One adapter on the queries only: the keys' and values' outputs are the base's, and
    the queries' update is B_q A_q x * scaling exactly."""
    model = _model()
    attach_lora(model, plan_lora(model, LoRA(rank=2, alpha=4.0, targets=("blocks.0.attn.q",))))
    _randomize(model)
    qkv = model.blocks[0].attn.qkv
    x = torch.randn(3, 32)
    base = torch.nn.functional.linear(x, qkv.weight)
    low = qkv.lora.low["q"]
    want_q = base[:, :32] + (x @ low.A.T @ low.B.T) * 2.0
    out = qkv(x)
    torch.testing.assert_close(out[:, :32], want_q)
    assert torch.equal(out[:, 32:], base[:, 32:])


def test_load_adapter_state_is_all_or_nothing() -> None:
    model = _model()
    attach_lora(model, plan_lora(model, LoRA(rank=2)))
    _randomize(model)
    state = {k: v.clone() for k, v in adapter_state(model).items()}
    other = _model()
    attach_lora(other, plan_lora(other, LoRA(rank=2)))
    before = {k: v.clone() for k, v in adapter_state(other).items()}
    bad = dict(state)
    bad["blocks.1.ffn.proj.B"] = torch.zeros(5, 2)
    with pytest.raises(ValueError, match=r"shapes: \['blocks.1.ffn.proj.B"):
        load_adapter_state(other, bad)
    assert all(torch.equal(v, before[k]) for k, v in adapter_state(other).items())
    with pytest.raises(ValueError, match="missing"):
        load_adapter_state(other, {k: v for k, v in state.items() if "blocks.0" in k})
    load_adapter_state(other, state)
    torch.testing.assert_close(other(IDS), model(IDS))


def test_targets_that_name_nothing_are_refused_with_the_names_there_are() -> None:
    model = _model()
    with pytest.raises(ValueError, match=r"\['attn.query'\] name no linear layer.*attn\.qkv"):
        plan_lora(model, LoRA(targets=("attn.query",)))
    assert {"attn.q", "attn.qkv", "ffn.gate", "ffn.up", "head"} <= set(target_names(model))
    with pytest.raises(ValueError, match="adapted as one layer"):
        plan_lora(model, LoRA(targets=("attn.q",)), per_part=lambda _: False)
    with pytest.raises(ValueError, match="no such linear layer parts"):
        attach_lora(model, {"blocks.9.attn.q": PartPlan(2, 1.0)})


def test_attaching_twice_is_refused() -> None:
    model = _model()
    attach_lora(model, plan_lora(model, LoRA(rank=2)))
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        attach_lora(model, plan_lora(model, LoRA(rank=2)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 0}, "rank must be a positive integer"),
        ({"rank": True}, "rank must be a positive integer"),
        ({"alpha": float("nan")}, "alpha must be positive and finite"),
        ({"alpha": -1}, "alpha must be positive"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"targets": "attn.qkv"}, "a sequence of names"),
        ({"targets": ()}, "non-empty"),
        ({"targets": ("attn/qkv",)}, "dotted module names"),
    ],
)
def test_lora_config_is_validated(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoRA(**kwargs)


def test_adapter_trains_on_an_int8_weight_base_forward() -> None:
    """The hook adds the update on any linear kind: here an int8 weight-only base."""
    from zoo.quant.layers import quantize_

    model = _model()
    quantize_(model, "int8-weight")
    before = model(IDS)
    attach_lora(model, plan_lora(model, LoRA(rank=2)))
    assert torch.equal(model(IDS), before)
    _randomize(model)
    assert adapted_layers(model) and not torch.equal(model(IDS), before)
    with pytest.raises(ValueError, match="without a float weight to merge into"):
        merge_lora(model)
