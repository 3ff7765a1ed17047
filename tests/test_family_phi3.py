"""Phi-3 beyond its ``FAMILIES`` entry (tests/test_families.py: grouped-query attention,
window 7 on every layer, half the head rotary): a second geometry against transformers'
``Phi3ForCausalLM`` (full multi-head attention, heads apart from the width, tied embeddings,
18 of 24 features rotary, another rotary base), the official file's own keys (transformers
4.x spelling, ``auto_map``, dropouts) read as inert, the keys zoo cannot honour refused by
name (the 128k models' ``longrope``), a tiny export loading in transformers, the named model
at full size, and the conformance kit's ``reference`` check with and without a planted bug.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from parity import max_logit_diff, padded_batch
from planted import Planted
from zoo_plugins.phi3.convert import HF_PHI3, PHI3_CONFIG, phi3_rules

import zoo
from zoo.checkpoint.hf_config import HFConfigError

OFFICIAL = Path(__file__).parent / "data/hub/microsoft/Phi-3-mini-4k-instruct/config.json"

#: Multi-head attention (no num_key_value_heads), heads of 24 apart from the width 64,
#: 18 of 24 features rotary, base 500, tied embeddings, no window.
SECOND = {"vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "head_dim": 24, "intermediate_size": 96,
          "max_position_embeddings": 128, "tie_word_embeddings": True,
          "rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                              "partial_rotary_factor": 0.75}}  # fmt: skip


def _random_norms(model: torch.nn.Module) -> None:
    with torch.no_grad():  # transformers initialises norms to 1: make them count
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.1)


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """transformers' Phi-3 of the second geometry, random, saved once for the module."""
    folder = tmp_path_factory.mktemp("phi3-second")
    torch.manual_seed(0)
    config = transformers.Phi3Config(**SECOND, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.Phi3ForCausalLM(config).eval()
    _random_norms(model)
    model.save_pretrained(folder)
    return model, folder


def test_a_second_geometry_matches_transformers(second: tuple[torch.nn.Module, Path]) -> None:
    reference, folder = second
    model = zoo.load(folder)
    config = model.config
    assert (config.n_kv_heads, config.head_size, config.rotary_dim) == (4, 24, 18)
    assert config.tie_embeddings and config.rope_theta == 500.0
    assert config.sliding_window is None
    diff = max_logit_diff(model, reference, *padded_batch(300))
    print(f"phi3 second geometry: max |zoo - transformers| = {diff:.2e}")
    assert diff <= 1e-5


def test_the_official_files_keys_load_the_same_model(second, tmp_path: Path) -> None:
    """The keys of the official config.json that change nothing here, spelled as it spells
    them (transformers 4.x: top-level ``rope_theta``, ``partial_rotary_factor``, ``rope_scaling:
    null``), with ``auto_map``, ``original_max_position_embeddings``, ``attention_bias: false``
    and training dropouts that an eval forward pass never applies."""
    reference, folder = second
    data = json.loads((folder / "config.json").read_text())
    rope = data.pop("rope_parameters")
    data.update(rope_theta=rope["rope_theta"], partial_rotary_factor=0.75, rope_scaling=None,
                auto_map={"AutoConfig": "configuration_phi3.Phi3Config"},
                original_max_position_embeddings=4096, attention_bias=False,
                resid_pdrop=0.1, embd_pdrop=0.1, attention_dropout=0.1,
                transformers_version="4.40.2", torch_dtype=data.pop("dtype"))  # fmt: skip
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(data))
    model = zoo.load(tmp_path)
    assert model.config.rotary_dim == 18
    assert max_logit_diff(model, reference, *padded_batch(300)) <= 1e-5


def _longrope(data: dict[str, Any]) -> None:  # the 128k models' file (transformers 4.x)
    data["rope_scaling"] = {"type": "longrope", "short_factor": [1.0] * 48,
                            "long_factor": [1.1] * 48}  # fmt: skip
    data["max_position_embeddings"] = 131072


REFUSED = [
    ("rope_scaling", _longrope),
    ("rope_scaling", lambda d: d.update(rope_scaling={"type": "su", "short_factor": [1.0]})),
    ("rope_parameters.rope_type = 'longrope'",
     lambda d: d.update(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0})),
    ("hidden_act", lambda d: d.update(hidden_act="gelu")),
    ("attention_bias", lambda d: d.update(attention_bias=True)),
    ("partial_rotary_factor", lambda d: d.update(partial_rotary_factor=0.5 + 1 / 96)),  # 49
    ("sliding_window", lambda d: d.update(sliding_window="2047")),
]  # fmt: skip


@pytest.mark.parametrize(("key", "change"), REFUSED, ids=[f"{i}-{k}" for i, (k, _) in
                                                          enumerate(REFUSED)])  # fmt: skip
def test_keys_zoo_cannot_honour_are_refused_by_name(key: str, change: Any) -> None:
    """The official config.json, edited: what zoo cannot compute is refused, naming the key
    (an odd rotary count: 96 * (0.5 + 1/96) = 49 features)."""
    data = json.loads(OFFICIAL.read_text())
    change(data)
    with pytest.raises(HFConfigError, match=key.replace(".", r"\.").replace("'", "'?")):
        HF_PHI3.config_from_foreign(data)


def test_a_tiny_export_loads_with_from_pretrained(tmp_path: Path) -> None:
    """Phi3Config's defaults are pad_token_id = eos_token_id = 32000: an export whose
    config.json left them out failed ``from_pretrained`` for any vocabulary under 32,001
    (``padding_idx must be within num_embeddings``). Exports write them (null without a
    tokenizer)."""
    torch.manual_seed(0)
    model = zoo.build("phi-3-mini-4k-instruct", vocab_size=300, d_model=64, n_heads=4,
                      n_kv_heads=2, n_layers=2, d_ff=96, context_length=128).eval()  # fmt: skip
    zoo.export(model, tmp_path)
    theirs = transformers.Phi3ForCausalLM.from_pretrained(tmp_path).eval()
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["pad_token_id"] is None and written["sliding_window"] == 2047
    ids = padded_batch(300)[0]
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, model(ids), rtol=0, atol=1e-5)


def test_phi3_mini_builds_on_meta_at_full_size() -> None:
    model = zoo.build("phi-3-mini-4k-instruct", device="meta")
    assert sum(p.numel() for p in model.parameters()) == 3_821_079_552  # as transformers counts
    assert tuple(model.blocks[0].attn.qkv.weight.shape) == (3 * 3072, 3072)
    assert tuple(model.blocks[0].ffn.fc.weight.shape) == (2 * 8192, 3072)
    assert {model.config.layer_window(i) for i in range(32)} == {2047}


# -- the kit: zoo check's reference check, with and without a planted bug -------------------


#: The issue's planted bug: the two norms of each block swapped in the layout. It is its own
#: inverse, so a round trip zoo -> Hugging Face -> zoo returns every tensor to its place.
_SWAPPED = dataclasses.replace(
    HF_PHI3, rules=phi3_rules(attn_norm="post_attention_layernorm", ffn_norm="input_layernorm")
)
_PLANTED = Planted("phi-3-mini-4k-instruct", {"phi3-swapped": ("hf-phi3", _SWAPPED)})


def test_the_kit_proves_phi3_against_transformers_and_catches_swapped_norms(use_registry):
    from zoo.plugin.current import load_registry
    from zoo.testing import run_check

    note = run_check("phi-3-mini-4k-instruct", "reference")
    print(note)
    assert note is not None and "Phi3ForCausalLM" in note and "greedy tokens equal" in note
    use_registry(load_registry(plugins={"planted": _PLANTED}))
    run_check("phi3-swapped-tiny", "checkpoint_layouts")  # the round trip cannot see it
    with pytest.raises(AssertionError, match="logits differ"):
        run_check("phi3-swapped-tiny", "reference")


def test_the_planted_layout_only_swaps_the_norms() -> None:
    """The planted bug is the issue's: the real layout with exactly two keys exchanged."""
    real = {r.zoo: r.foreign for r in HF_PHI3.rules}
    planted = {r.zoo: r.foreign for r in _SWAPPED.rules}
    changed = {k for k in real if real[k] != planted[k]}
    assert changed == {"blocks.{i}.attn_norm.weight", "blocks.{i}.ffn_norm.weight"}
    assert planted["blocks.{i}.attn_norm.weight"] == real["blocks.{i}.ffn_norm.weight"]
    assert _SWAPPED.model_type == PHI3_CONFIG.model_type == "phi3"  # read as a phi3 file
