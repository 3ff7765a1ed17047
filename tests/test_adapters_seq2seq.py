"""PEFT LoRA adapters of Marian, BART and T5, both ways: zoo names each of its linear layers'
pieces exactly as transformers' modules are named (peft's names: BART's and Marian's
``model.encoder.layers.0.self_attn.q_proj``, T5's ``encoder.block.0.layer.0.SelfAttention.q``
and a gated feed-forward's ``wi_0``/``wi_1``, which T5's layout writes from zoo's fused
``ffn.fc``), an adapter peft trained and saved loads in zoo with the logits of peft's merged
model, and one zoo saved loads with ``PeftModel.from_pretrained`` with zoo's logits. Tiny
random folders (:mod:`seq2seq_tiny`), right-padded batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import peft
import pytest
import torch
from seq2seq_parity import logits_pair, padded_pair
from seq2seq_tiny import FAMILIES, VOCAB, reload, save_folder

import zoo
from zoo.adapters import BaseRecord, base_fingerprint, per_part, save_adapter
from zoo.adapters.layout import pieces
from zoo.adapters.lora import LoRA, adapter_parameters, attach_lora, plan_lora

#: peft's short names of every projection (attention, cross-attention, feed-forward).
PROJECTIONS = {
    "marian": ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"],
    "bart": ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"],
    "t5": ["q", "k", "v", "o", "wi_0", "wi_1", "wo"],
}
ZOO_TARGETS = ("attn.qkv", "attn.proj", "cross_attn.q", "cross_attn.kv", "cross_attn.proj",
               "ffn.fc", "ffn.proj")  # fmt: skip


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(family, folder)."""
    folder = tmp_path_factory.mktemp(request.param) / "model"
    save_folder(request.param, folder)
    return request.param, folder


def _batch() -> tuple[torch.Tensor, ...]:
    return padded_pair(VOCAB, VOCAB, seed=3)


def test_every_linear_layer_is_named_as_transformers_names_it(family):
    _, folder = family
    theirs = reload(folder)
    linear = {n for n, m in theirs.named_modules() if isinstance(m, torch.nn.Linear)}
    found = pieces(zoo.load(folder))
    assert {p.module for p in found} == linear
    assert len(found) == len(linear)  # each once


def _peft_adapter(name: str, folder: Path, out: Path) -> Any:
    """peft's LoRA on every projection of transformers' model of ``folder``, its ``B`` drawn
    (a fresh one is zero), rank 4 with an odd rank and alpha for some modules; saved in
    ``out``. Returns the peft model."""
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=PROJECTIONS[name], task_type="SEQ_2_SEQ_LM",
        rank_pattern={PROJECTIONS[name][-1]: 2}, alpha_pattern={PROJECTIONS[name][0]: 3},
    )  # fmt: skip
    model = peft.get_peft_model(reload(folder), config)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "lora_" in key:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    model.save_pretrained(out)
    return model.eval()


def test_an_adapter_peft_saved_loads_in_zoo(family, tmp_path):
    name, folder = family
    theirs = _peft_adapter(name, folder, tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "adapter_model.bin").exists()
    ours = zoo.load(folder, adapter=tmp_path / "adapter")
    merged = theirs.merge_and_unload().eval()
    got, want = logits_pair(ours, merged, _batch())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain, _ = logits_pair(zoo.load(folder), merged, _batch())
    assert float((plain - want).abs().max()) > 1e-3  # the adapter moves the logits


def _zoo_adapter(folder: Path, targets: tuple[str, ...]) -> tuple[Any, LoRA, str]:
    """zoo's model of ``folder`` with a LoRA on ``targets``, its weights drawn; the LoRA and
    the base's fingerprint."""
    ours = zoo.load(folder)
    sha = base_fingerprint(ours)
    lora = LoRA(rank=4, alpha=8.0, targets=targets)
    attach_lora(ours, plan_lora(ours, lora, per_part=per_part(ours)))
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for _, weight in adapter_parameters(ours):
            weight.copy_(torch.randn(weight.shape, generator=g) * 0.2)
    return ours.eval(), lora, sha


@pytest.mark.parametrize(
    "targets", [ZOO_TARGETS, ("decoder.1.attn.q", "encoder.0.ffn.fc")], ids=["all", "some"]
)
def test_an_adapter_zoo_saved_loads_in_peft(family, targets, tmp_path):
    """Every projection (peft's short names), and a few modules only (full names: the
    decoder's self-attention queries but not its cross-attention's, one feed-forward)."""
    name, folder = family
    ours, lora, sha = _zoo_adapter(folder, targets)
    save_adapter(ours, tmp_path, base=BaseRecord(name, None, None, sha), lora=lora)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_2_SEQ_LM"
    if targets == ZOO_TARGETS:
        assert sorted(config["target_modules"]) == sorted(PROJECTIONS[name])
    else:
        assert all(
            m.startswith(("model.", "encoder.", "decoder.")) for m in config["target_modules"]
        )
    theirs = peft.PeftModel.from_pretrained(reload(folder), tmp_path).eval()
    got, want = logits_pair(ours, theirs, _batch())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    again = zoo.load(folder, adapter=tmp_path)  # and back, its base checked
    torch.testing.assert_close(logits_pair(again, theirs, _batch())[0], got, rtol=0, atol=1e-6)


def test_an_encoder_decoder_family_adapts_its_cross_attention_by_default() -> None:
    """Marian's, BART's and T5's default LoRA targets include the decoder's cross-attention
    (peft's encoder_attn / EncDecAttention), beside attention's and the feed-forward's."""
    from zoo.adapters.lora_config import DEFAULT_TARGETS

    for name in ("marian", "bart", "mbart", "t5"):
        targets = zoo.get_registry().architecture(name).lora_targets
        assert set(DEFAULT_TARGETS) < set(targets), name
        assert {"cross_attn.q", "cross_attn.kv", "cross_attn.proj"} <= set(targets), name
