"""zoo.adapters against peft: an adapter zoo trained and saved loads in
``peft.PeftModel.from_pretrained`` on transformers' model with zoo's logits, and an adapter
peft made loads in zoo with peft's logits (float32, <= 1e-5), for a per-part layout (Llama,
Qwen2: q/k/v and gate/up apart), whole fused layers (Phi-3's ``qkv_proj``), regrouped rows
(GPT-NeoX's ``query_key_value``) and Conv1D (GPT-2's ``c_attn``, ``fan_in_fan_out``). Every
config key zoo cannot honour is refused naming it, so is every weight that fits nothing, and
an adapter refuses a base other than its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import peft
import pytest
import safetensors.torch
import torch
import transformers
from parity import max_logit_diff, padded_batch
from test_families import COMMON, reference

import zoo
from zoo.adapters import (
    BaseRecord,
    apply_adapter,
    base_fingerprint,
    per_part,
    read_adapter,
    save_adapter,
)
from zoo.adapters.lora import LoRA, adapter_parameters, adapter_state, attach_lora, plan_lora
from zoo.errors import CheckpointError

#: family -> the names peft targets for every projection of attention and the MLP
PEFT_TARGETS = {
    "smollm2-like": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "gpt-neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}


def _base(family: str, folder: Path, seed: int = 0) -> torch.nn.Module:
    """transformers' tiny random model of ``family``, saved to ``folder``."""
    if family != "gpt2":
        return reference(family, folder, seed)
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=COMMON["vocab_size"], n_embd=64, n_layer=2, n_head=4, n_positions=128
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(folder)
    return model


def _randomize(model: torch.nn.Module, seed: int = 1) -> None:
    """Random A and nonzero B (a fresh adapter has B = 0 and changes nothing)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in adapter_parameters(model):
            param.copy_(torch.randn(param.shape, generator=gen) * 0.2)


def _zoo_adapter(model: torch.nn.Module, folder: Path, lora: LoRA, **record: Any) -> None:
    """Attach ``lora`` to ``model`` (random weights) and save it to ``folder``."""
    fingerprint = base_fingerprint(model)
    attach_lora(model, plan_lora(model, lora, per_part=per_part(model)))
    _randomize(model)
    save_adapter(
        model, folder, base=BaseRecord(record.get("name"), None, None, fingerprint), lora=lora
    )


#: Qwen2 adds only q/k/v biases (no part of an adapter) to Llama's layout: run with the slow.
FAMILY_CASES = [
    pytest.param(f, marks=pytest.mark.slow) if f == "qwen2" else f for f in PEFT_TARGETS
]


@pytest.mark.parametrize("family", FAMILY_CASES)
def test_zoo_adapter_loads_in_peft_with_equal_logits(family: str, tmp_path: Path) -> None:
    ref = _base(family, tmp_path / "base")
    model = zoo.load(tmp_path / "base")
    batch = padded_batch(COMMON["vocab_size"])
    _zoo_adapter(model, tmp_path / "adapter", LoRA(rank=4, alpha=6.0))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == sorted(PEFT_TARGETS[family])
    assert config["fan_in_fan_out"] is (family == "gpt2")
    theirs = peft.PeftModel.from_pretrained(ref, tmp_path / "adapter").eval()
    diff = max_logit_diff(model, theirs, *batch)
    print(f"{family}: zoo adapter in peft, max |zoo - peft| = {diff:.2e}")
    assert diff <= 1e-5  # peft skipping a key would leave its adapter at B = 0: logits differ


@pytest.mark.parametrize("family", FAMILY_CASES)
def test_peft_adapter_loads_in_zoo_with_equal_logits(family: str, tmp_path: Path) -> None:
    ref = _base(family, tmp_path / "base", seed=1)
    model = zoo.load(tmp_path / "base")
    torch.manual_seed(2)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=PEFT_TARGETS[family], init_lora_weights=False,
        task_type="CAUSAL_LM", fan_in_fan_out=family == "gpt2",
    )  # fmt: skip
    theirs = peft.get_peft_model(ref, config).eval()
    theirs.save_pretrained(tmp_path / "adapter")
    adapter = read_adapter(tmp_path / "adapter", model=model)
    assert adapter.base is None  # peft records no fingerprint
    apply_adapter(model, adapter)
    diff = max_logit_diff(model, theirs, *padded_batch(COMMON["vocab_size"]))
    print(f"{family}: peft adapter in zoo, max |zoo - peft| = {diff:.2e}")
    assert diff <= 1e-5


def test_peft_rank_and_alpha_patterns_rslora_and_some_layers_are_honoured(tmp_path: Path) -> None:
    ref = _base("smollm2-like", tmp_path / "base", seed=3)
    model = zoo.load(tmp_path / "base")
    torch.manual_seed(4)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
        rank_pattern={"v_proj": 2}, alpha_pattern={"down_proj": 3}, use_rslora=True,
        layers_to_transform=[1], init_lora_weights=False,
    )  # fmt: skip
    theirs = peft.get_peft_model(ref, config).eval()
    theirs.save_pretrained(tmp_path / "adapter")
    adapter = read_adapter(tmp_path / "adapter", model=model)
    assert sorted(adapter.plans) == ["blocks.1.attn.q", "blocks.1.attn.v", "blocks.1.ffn.proj"]
    assert adapter.plans["blocks.1.attn.v"].rank == 2
    assert adapter.plans["blocks.1.ffn.proj"].scaling == pytest.approx(3 / 2)  # alpha / sqrt(r)
    apply_adapter(model, adapter)
    assert max_logit_diff(model, theirs, *padded_batch(COMMON["vocab_size"])) <= 1e-5
    # saved again by zoo, the patterns come back: peft loads zoo's copy as its own
    save_adapter(
        model,
        tmp_path / "again",
        base=BaseRecord(None, "org/base", "main", base_fingerprint(model)),
        lora=adapter.lora,
    )
    back = peft.PeftModel.from_pretrained(
        _base("smollm2-like", tmp_path / "b2", seed=3), tmp_path / "again"
    )
    assert max_logit_diff(model, back.eval(), *padded_batch(COMMON["vocab_size"])) <= 1e-5


def test_zoo_round_trip_keeps_weights_and_writes_peft_keys(tmp_path: Path) -> None:
    ref = _base("qwen2", tmp_path / "base")
    model = zoo.load(tmp_path / "base")
    _zoo_adapter(model, tmp_path / "adapter", LoRA(rank=2, targets=("attn.q", "blocks.1.ffn.fc")))
    tensors = safetensors.torch.load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert sorted(tensors) == sorted(
        f"base_model.model.model.layers.{i}.{m}.lora_{ab}.weight"
        for i, m in [(0, "self_attn.q_proj"), (1, "self_attn.q_proj"), (1, "mlp.gate_proj"),
                     (1, "mlp.up_proj")]
        for ab in "AB"
    )  # fmt: skip
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == [
        "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj", "q_proj"
    ]  # fmt: skip
    theirs = peft.get_peft_model(ref, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    theirs.save_pretrained(tmp_path / "peft")
    peft_keys = set(json.loads((tmp_path / "peft" / "adapter_config.json").read_text()))
    assert set(config) == peft_keys - {"peft_version"}
    again = zoo.load(tmp_path / "base")
    adapter = read_adapter(tmp_path / "adapter", model=again)
    assert adapter.lora.targets == ("attn.q", "blocks.1.ffn.gate", "blocks.1.ffn.up")
    apply_adapter(again, adapter)
    for key, value in adapter_state(model).items():
        assert torch.equal(adapter_state(again)[key], value), key


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("wiki-gpt-wordpiece", {"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 48,
                                "vocab_size": 120}),
        ("transformer-encdec", {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1,
                                "n_decoder_layers": 1, "d_ff": 48, "vocab_size": 120}),
    ],
)  # fmt: skip
def test_a_family_without_a_layout_writes_zoo_names(
    name: str, values: dict[str, Any], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = zoo.build(name, **values).eval()
    fresh = zoo.build(name, **values).eval()
    fresh.load_state_dict(model.state_dict())
    _zoo_adapter(model, tmp_path / "adapter", LoRA(rank=2))
    tensors = safetensors.torch.load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert all(k.startswith("base_model.model.") for k in tensors)
    assert any(".attn.q.lora_A" in k for k in tensors)
    apply_adapter(fresh, read_adapter(tmp_path / "adapter", model=fresh))
    for key, value in adapter_state(model).items():
        assert torch.equal(adapter_state(fresh)[key], value), key


def test_per_part_follows_the_layout(tmp_path: Path) -> None:
    _base("phi3", tmp_path / "phi3")
    _base("smollm2-like", tmp_path / "llama")
    assert per_part(zoo.load(tmp_path / "phi3"))("blocks.0.attn.qkv") is False
    assert per_part(zoo.load(tmp_path / "llama"))("blocks.0.attn.qkv") is True


# -- refusals ------------------------------------------------------------------------------

SMALL = {"d_model": 32, "vocab_size": 97, "context_length": 16, "d_ff": 48}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A zoo adapter on llama-tiny (Llama's layout), and a fresh copy of its base."""
    folder = tmp_path_factory.mktemp("saved")
    torch.manual_seed(0)
    model = zoo.build("llama-tiny", **SMALL).eval()
    base = zoo.build("llama-tiny", **SMALL).eval()
    base.load_state_dict(model.state_dict())
    _zoo_adapter(model, folder / "adapter", LoRA(rank=2, targets=("attn.qkv", "attn.proj")))
    return folder / "adapter", base


def _copy(saved: Path, to: Path, config: dict[str, Any] | None = None, tensors: Any = None) -> Path:
    """A plain folder with ``saved``'s files, the config updated and tensors replaced."""
    to.mkdir()
    text = json.loads((saved / "adapter_config.json").read_text())
    (to / "adapter_config.json").write_text(json.dumps({**text, **(config or {})}))
    shutil.copyfile(saved / "adapter_model.safetensors", to / "adapter_model.safetensors")
    if tensors is not None:
        with safetensors.safe_open(str(saved / "adapter_model.safetensors"), "pt") as f:
            metadata = f.metadata()
        state = safetensors.torch.load_file(saved / "adapter_model.safetensors")
        changed = {k: v.clone() for k, v in tensors(state).items()}  # no shared memory
        safetensors.torch.save_file(changed, to / "adapter_model.safetensors", metadata)
    return to


Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = Q_A.replace("lora_A", "lora_B")


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"use_dora": True}, "'use_dora'"),
        ({"bias": "all"}, "'bias'"),
        ({"lora_bias": True}, "'lora_bias'"),
        ({"modules_to_save": ["lm_head"]}, "'modules_to_save'"),
        ({"target_parameters": ["experts.w1"]}, "'target_parameters'"),
        ({"peft_type": "LOHA"}, "'peft_type'"),
        ({"some_future_key": {"x": 1}}, "'some_future_key'"),
        ({"target_modules": ["q_proj", "nope"]}, "'nope'"),
        ({"r": 0}, "'r'"),
        ({"r": 4}, "'r'"),  # the weights have rank 2
        ({"rank_pattern": {"q_proj": 3}}, "'rank_pattern'"),
        ({"alpha_pattern": {"(.*)*x": 3}}, "'alpha_pattern'"),  # a nested repeat: no time bomb
        ({"lora_alpha": "8"}, "'lora_alpha'"),
    ],
)
def test_config_keys_zoo_cannot_honour_are_refused_by_name(
    saved: tuple[Path, torch.nn.Module], tmp_path: Path, config: dict[str, Any], named: str
) -> None:
    folder = _copy(saved[0], tmp_path / "a", config=config)
    with pytest.raises(CheckpointError, match=named.replace("'", "'?")):
        read_adapter(folder, model=saved[1])


def _nan(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state[Q_B] = state[Q_B].clone()
    state[Q_B][0, 0] = float("nan")
    return state


MAGNITUDE = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"


def _elsewhere(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    far = {k.replace("q_proj", "nowhere"): state[k] for k in (Q_A, Q_B)}
    return {**state, **far}


@pytest.mark.parametrize(
    ("tensors", "named"),
    [
        (lambda s: {**s, MAGNITUDE: s[Q_B][:, 0]}, "lora_magnitude_vector"),
        (_elsewhere, "nowhere"),
        (lambda s: {k: v for k, v in s.items() if k != Q_B}, "lora_B"),
        (lambda s: {**s, Q_B: s[Q_B][:-1]}, "q_proj"),
        (lambda s: {**s, Q_A: s[Q_A].to(torch.int32)}, "q_proj"),
        (_nan, "NaN"),
    ],
)
def test_weights_that_fit_nothing_are_refused_by_key(
    saved: tuple[Path, torch.nn.Module], tmp_path: Path, tensors: Any, named: str
) -> None:
    folder = _copy(saved[0], tmp_path / "a", tensors=tensors)
    with pytest.raises(CheckpointError, match=named):
        read_adapter(folder, model=saved[1])


def test_a_pickle_or_a_bad_file_is_refused(
    saved: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "adapter_model.bin").write_bytes(b"\x80\x02}q\x00.")
    with pytest.raises(CheckpointError, match="pickle"):
        read_adapter(tmp_path / "bin", model=saved[1])
    folder = _copy(saved[0], tmp_path / "json")
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_adapter(folder, model=saved[1])
    folder = _copy(saved[0], tmp_path / "meta")
    state = safetensors.torch.load_file(folder / "adapter_model.safetensors")
    safetensors.torch.save_file(state, folder / "adapter_model.safetensors", {"zoo.base": "[1]"})
    with pytest.raises(CheckpointError, match="base record"):
        read_adapter(folder, model=saved[1])


def test_another_base_is_refused_naming_both(saved: tuple[Path, torch.nn.Module]) -> None:
    adapter = read_adapter(saved[0], model=saved[1])
    torch.manual_seed(9)
    other = zoo.build("llama-tiny", **SMALL).eval()
    with pytest.raises(
        CheckpointError, match=r"trained on .*sha256 .*not on this model.*sha256"
    ) as err:
        apply_adapter(other, adapter)
    assert err.value.expected == adapter.base.sha256  # type: ignore[union-attr]
    assert not any("lora" in k for k in other.state_dict())  # nothing attached
    apply_adapter(other, adapter, check_base=False)


def test_fingerprint_is_the_weights_not_the_folder(tmp_path: Path) -> None:
    _base("smollm2-like", tmp_path / "hf")
    from_hf = zoo.load(tmp_path / "hf")
    zoo.save(from_hf, tmp_path / "zoo")
    fingerprint = base_fingerprint(from_hf)
    assert base_fingerprint(zoo.load(tmp_path / "zoo")) == fingerprint
    attach_lora(from_hf, plan_lora(from_hf, LoRA(rank=2)))
    assert base_fingerprint(from_hf) == fingerprint  # adapters excluded
    with torch.no_grad():
        from_hf.final_norm.weight[0] += 1e-3
    assert base_fingerprint(from_hf) != fingerprint


def test_gpt2_names_carry_the_lm_models_prefix_and_bare_names_are_read(tmp_path: Path) -> None:
    torch.manual_seed(0)
    small = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 48, "vocab_size": 97}
    model = zoo.build("gpt2-124m", **small).eval()
    base = zoo.build("gpt2-124m", **small).eval()
    base.load_state_dict(model.state_dict())
    _zoo_adapter(model, tmp_path / "adapter", LoRA(rank=2, targets=("attn.qkv", "head")))
    keys = sorted(safetensors.torch.load_file(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert keys[0] == "base_model.model.lm_head.lora_A.weight"  # beside the base model
    assert keys[2] == "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"
    # peft on GPT2Model (no LM head) names the modules without "transformer."
    bare = _copy(
        tmp_path / "adapter",
        tmp_path / "bare",
        tensors=lambda s: {k.replace("transformer.", ""): v for k, v in s.items()},
    )
    assert read_adapter(bare, model=base).plans.keys() == {"blocks.0.attn.qkv", "head"}


@pytest.mark.parametrize("mode", ["int8", "int8-weight", "int4"])
def test_a_quantized_base_takes_the_fingerprint_of_its_float_weights(
    saved: tuple[Path, torch.nn.Module], mode: str
) -> None:
    """Every mode: int8's layer holds plain int8 tensors, as int8-weight's and int4's do, so
    the refusal reads the model's mode, not its tensors' kind."""
    from zoo.quant.layers import quantize_

    base = zoo.build("llama-tiny", **SMALL).eval()
    base.load_state_dict(saved[1].state_dict())
    fingerprint = base_fingerprint(base)
    quantize_(base, mode)
    adapter = read_adapter(saved[0], model=base)  # the layers keep their names and shapes
    with pytest.raises(ValueError, match="before quantizing"):
        apply_adapter(base, adapter)
    apply_adapter(base, adapter, fingerprint=fingerprint)
    assert len(adapter.plans) == 2 * 4  # q, k, v and proj of 2 blocks


def test_a_whole_fused_adapter_is_written_as_exact_per_part_pieces(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = zoo.build("llama-tiny", **SMALL).eval()
    base = zoo.build("llama-tiny", **SMALL).eval()
    base.load_state_dict(model.state_dict())
    lora = LoRA(rank=2, targets=("attn.qkv",))
    attach_lora(model, plan_lora(model, lora, per_part=lambda layer: False))  # one over qkv
    _randomize(model)
    save_adapter(model, tmp_path / "a", base=BaseRecord(None, None, None, "0" * 64), lora=lora)
    adapter = read_adapter(tmp_path / "a", model=base)  # q, k, v apart, as Llama's layout
    assert sorted(adapter.plans)[:3] == ["blocks.0.attn.k", "blocks.0.attn.q", "blocks.0.attn.v"]
    apply_adapter(base, adapter, check_base=False)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(base(ids), model(ids), rtol=0, atol=1e-6)


def test_a_layout_that_changes_values_is_refused_one_that_only_reads_is_not(
    saved: tuple[Path, torch.nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from zoo.adapters import layout
    from zoo.plugin.current import get_registry

    arch = get_registry().architecture("llama")
    keymap = arch.checkpoint_layout("hf-llama")
    # a transform that changes a linear layer's values (not only where its rows go)
    scaled = dataclasses.replace(
        keymap,
        merge_foreign=lambda s, c: s,
        split_foreign=lambda s, c: {k: v * 2 for k, v in s.items()},
    )
    fake = dataclasses.replace(arch, checkpoint_layouts={"hf-llama": scaled})
    monkeypatch.setattr(layout, "architecture", lambda *a, **k: fake)
    with pytest.raises(CheckpointError, match="changes the values of"):
        read_adapter(saved[0], model=saved[1])
    # one that only reads other spellings on import (export writes its rules' output, as
    # GPT-BigCode's layout does): the same adapter as through the plain layout
    one_way = dataclasses.replace(keymap, merge_foreign=lambda s, c: s)
    other = dataclasses.replace(arch, checkpoint_layouts={"hf-llama": one_way})
    monkeypatch.setattr(layout, "architecture", lambda *a, **k: other)
    through = read_adapter(saved[0], model=saved[1])
    monkeypatch.undo()
    plain = read_adapter(saved[0], model=saved[1])
    assert through.lora == plain.lora
    assert all(torch.equal(through.state[k], v) for k, v in plain.state.items())
