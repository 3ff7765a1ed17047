"""Adapters whose update overflows are refused on every path they enter, and a merge never
writes a non-finite tensor (``lora_alpha`` 1e308 or ``B`` holding 3e38 once
loaded without a word, ``zoo generate`` printed NUL bytes, ``zoo merge`` exited 0 having
written non-finite tensors). A tiny Llama-shaped model (``llama-tiny``, byte tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import zoo
from zoo.adapters import BaseRecord, apply_adapter, base_fingerprint, per_part, save_adapter
from zoo.adapters.folder import Adapter
from zoo.adapters.lora import adapter_parameters, adapter_state, attach_lora, merge_lora, plan_lora
from zoo.adapters.lora_bank import attach_bank
from zoo.adapters.lora_check import MAX_UPDATE, check_update, update_norm
from zoo.cli import main
from zoo.errors import CheckpointError

LORA = zoo.LoRA(rank=4, alpha=8.0, targets=("attn.qkv", "attn.proj", "ffn.fc"))
IDS = torch.tensor([[5, 17, 99, 3]])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return zoo.save(zoo.build("llama-tiny").eval(), tmp_path_factory.mktemp("base") / "tiny")


def _adapted(base: Path, fill_b: float | None = None) -> torch.nn.Module:
    model = zoo.load(base, onednn=False)
    attach_lora(model, plan_lora(model, LORA, per_part=per_part(model)))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in adapter_parameters(model):
            p.normal_(0.0, 0.1)
            if fill_b is not None and name.endswith(".B"):
                p.fill_(fill_b)
    return model


def _folder(base: Path, folder: Path, *, fill_b: float | None = None, **config) -> Path:
    """An adapter folder for ``base`` (``B`` filled with ``fill_b``; ``config`` keys written
    into its adapter_config.json)."""
    model = zoo.load(base, onednn=False)
    record = BaseRecord(name=None, repo=None, revision=None, sha256=base_fingerprint(model))
    save_adapter(_adapted(base, fill_b), folder, base=record, lora=LORA)
    if config:
        path = folder / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return folder


HOSTILE = {
    "B holds 3e38": ({"fill_b": 3e38}, r"lora_B\.weight @ lora_A\.weight.*update.*2\*\*64"),
    "B 1e19, alpha 2**32": (
        {"fill_b": 1e19, "lora_alpha": 2.0**32},
        r"lora_B\.weight @ lora_A\.weight.*update",
    ),
    "lora_alpha 1e308": ({"lora_alpha": 1e308}, r"'lora_alpha' must be a positive number at"),
    "alpha_pattern 1e300": (
        {"alpha_pattern": {"q_proj": 1e300}},
        r"'alpha_pattern' must be .* at most 2\*\*32",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_zoo_load_refuses_an_overflowing_adapter_by_name(base, tmp_path, case):
    change, message = HOSTILE[case]
    folder = _folder(base, tmp_path / "adapter", **change)
    with pytest.raises(CheckpointError, match=message):
        zoo.load(base, adapter=folder)
    with pytest.raises(CheckpointError, match=message):  # QLoRA: a quantized base
        zoo.load(base, adapter=folder, quantize="int8")


def test_zoo_generate_refuses_it_instead_of_printing_nul_bytes(base, tmp_path, capsys):
    folder = _folder(base, tmp_path / "adapter", fill_b=3e38)
    args = ["generate", str(base), "Hi", "--adapter", str(folder), "--max-new-tokens", "4"]
    assert main([*args, "--temperature", "0"]) == 2
    out, err = capsys.readouterr()
    assert "\x00" not in out and "lora_B.weight" in err and "Traceback" not in err


@pytest.mark.parametrize("case", ["B holds 3e38", "lora_alpha 1e308"])
def test_zoo_merge_refuses_and_writes_nothing(base, tmp_path, capsys, case):
    folder = _folder(base, tmp_path / "adapter", **HOSTILE[case][0])
    out = tmp_path / "merged"
    assert main(["merge", str(base), str(folder), str(out)]) == 2
    assert not out.exists() and "zoo: error:" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*hold NaN or infinite values:RuntimeWarning")
def test_merge_refuses_a_non_finite_output_whatever_its_cause(base, tmp_path, capsys):
    """The merged model's every tensor is checked before anything is written: here the base
    itself holds an infinity in a layer the adapter leaves alone."""
    model = zoo.load(base, onednn=False)
    with torch.no_grad():
        model.blocks[0].ffn.proj.weight[0, 0] = float("inf")
    broken = zoo.save(model, tmp_path / "broken")
    folder = _folder(broken, tmp_path / "adapter")
    out = tmp_path / "merged"
    assert main(["merge", str(broken), str(folder), str(out)]) == 2
    assert not out.exists()
    assert "blocks.0.ffn.proj.weight holds NaN or infinite" in capsys.readouterr().err


def test_merge_lora_checks_every_layer_before_changing_any(base):
    """In float16 a merged weight overflows where the update alone (run in float32) did
    not: merge_lora refuses before it changes any weight."""
    model = _adapted(base).half()
    state = {k: v.clone() for k, v in adapter_state(model).items()}
    last = sorted(k for k in state if k.endswith(".B"))[-1]  # earlier layers merge fine
    state[last].fill_(6e4)  # finite in float16, as its A of ones: the update, 4.8e5, is not
    state[last[:-2] + ".A"].fill_(1.0)
    with torch.no_grad():
        for name, p in adapter_parameters(model):
            p.copy_(state[name])
    before = {k: v.clone() for k, v in model.state_dict().items() if "lora" not in k}
    with pytest.raises(ValueError, match=r"would hold NaN or infinite values once merged"):
        merge_lora(model)
    after = {k: v for k, v in model.state_dict().items() if "lora" not in k}
    assert all(torch.equal(before[k], after[k]) for k in before)


def _bad_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = {k: v.clone() for k, v in adapter_state(model).items()}
    key = next(k for k in sorted(state) if k.endswith(".B"))
    state[key].fill_(3e38)
    return state


def test_loading_weights_into_attached_adapters_checks_them(base):
    """apply_adapter (every zoo.load path, a QLoRA base too) and load_adapter_state refuse
    an overflowing update even from an Adapter made in code, and load nothing."""
    source = _adapted(base)
    plans = plan_lora(source, LORA, per_part=per_part(source))
    adapter = Adapter(lora=LORA, plans=plans, state=_bad_state(source), base=None)
    for quantize in (None, "int8"):
        model = zoo.load(base, onednn=False, quantize=quantize)
        with pytest.raises(ValueError, match=r"update scaling \* B @ A reaches"):
            apply_adapter(model, adapter, check_base=False)
        assert not list(adapter_parameters(model))  # detached again: all or nothing


def test_a_serving_bank_checks_each_adapter(base):
    """zoo serve --adapter's bank (attach_bank) refuses an overflowing adapter by name."""
    source = _adapted(base)
    plans = plan_lora(source, LORA, per_part=per_part(source))
    good = Adapter(lora=LORA, plans=plans, state=adapter_state(source), base=None)
    bad = Adapter(lora=LORA, plans=plans, state=_bad_state(source), base=None)
    model = zoo.load(base, onednn=False)
    with pytest.raises(ValueError, match=r"adapter 'bad': .*update scaling \* B @ A"):
        attach_bank(model, {"good": good, "bad": bad})
    attach_bank(zoo.load(base, onednn=False), {"good": good})


def test_a_sane_adapter_loads_and_decodes_finite(base, tmp_path):
    folder = _folder(base, tmp_path / "adapter")
    model = zoo.load(base, adapter=folder)
    with torch.no_grad():
        assert bool(torch.isfinite(model(IDS)).all())


def test_the_norm_bound_never_refuses_what_the_exact_norm_passes():
    """Large rows of B whose products cancel: the cheap bound is over the limit, the exact
    norm (float64, by rows) is 0, and the adapter passes."""
    a = torch.full((2, 8), 1e19)
    b = torch.tensor([[1.0, -1.0]] * 3)
    assert update_norm(a, b, 1.0) == 0.0
    check_update("cancels", a, b, 1.0)
    with pytest.raises(ValueError, match="cancels"):
        check_update("cancels", a, torch.tensor([[1.0, 1.0]] * 3), 1.0)
    assert update_norm(torch.ones(2, 4), torch.ones(3, 2), 0.5) == 4.0  # 0.5 * 2 * 4
    assert MAX_UPDATE == 2.0**64


@pytest.mark.parametrize(
    ("a", "b", "scaling", "message"),
    [
        (torch.full((1, 2), float("nan")), torch.ones(2, 1), 1.0, "A holds NaN"),
        (torch.ones(1, 2), torch.full((2, 1), float("inf")), 1.0, "B holds NaN"),
        (torch.ones(1, 2), torch.ones(2, 1), float("inf"), "finite and positive"),
        (torch.ones(1, 2), torch.ones(2, 1), 2.0**33, "over 4.29e"),
    ],
)
def test_check_update_names_what_is_wrong(a, b, scaling, message):
    with pytest.raises(ValueError, match=message):
        check_update("part", a, b, scaling)


def test_a_lora_for_training_bounds_alpha():
    with pytest.raises(ValueError, match=r"alpha must be positive and finite, at most 2\*\*32"):
        zoo.LoRA(rank=8, alpha=1e308)
    assert zoo.LoRA(rank=8, alpha=2.0**32).alpha == 2.0**32
