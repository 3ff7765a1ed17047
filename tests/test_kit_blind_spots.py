"""The conformance kit's blind spots of its third round, each planted in a test plugin: a
family's layout with one thing wrong that the kit used to pass, and now fails.

- **missing weights**: the layout's config.json asks transformers for attention biases the
  model does not have; transformers fills them with zeros and only reports them, the logits
  agree, and the kit passed it. Now transformers' report of missing keys fails the check.
- **multi-query**: the layout writes one key/value head as "not grouped"; the kit checked
  every grouped model at 2 key/value heads, never at 1. Now its second draw has 1.
- **six heads**: the layout reorders the query heads wrongly unless their count is a power of
  two (as an ALiBi slope formula right only for powers of two is); the kit checked 4 heads
  only. Now its second draw has 6.
- **a config key**: the layout writes ``rope_theta`` under a key transformers does not read;
  on a model with transformers' default base the logits agree. Now the kit also compares a
  draw moved off the defaults (rope_theta 15000), where transformers computes with its 10000.
- **an activation**: the layout says GELU's tanh form for a model computing the exact one
  (7e-4 apart); the activations check proves the kit sees each such swap on this geometry.
- **a skip**: ``zoo check`` exits 1 when a check is skipped (``--allow-skip`` accepts it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from planted import Planted
from torch import Tensor

from zoo.api import resolve_config
from zoo.cli import main
from zoo.plugin.current import load_registry
from zoo.testing import run_check

pytest.importorskip("transformers")

_Q = "model.layers.{i}.self_attn.q_proj.weight"


def _llama(base: str) -> Any:
    arch, _, _ = resolve_config(base)
    return arch.checkpoint_layout("hf-llama")


def _writing(layout: Any, change: Any, undo: Any = None) -> Any:
    """``layout`` whose config.json writer passes its dict through ``change`` (and whose
    reader first through ``undo``)."""
    write, read = layout.config_to_foreign, layout.config_from_foreign
    return dataclasses.replace(
        layout,
        config_to_foreign=lambda config: change(write(config), config),
        config_from_foreign=(lambda data: read(undo(dict(data)))) if undo else read,
    )


def _biases_asked(written: dict[str, Any], config: Any) -> dict[str, Any]:
    return {**written, "attention_bias": True}


def _one_kv_head_as_many(written: dict[str, Any], config: Any) -> dict[str, Any]:
    if written["num_key_value_heads"] == 1:
        return {**written, "num_key_value_heads": written["num_attention_heads"]}
    return written


def _rope_base(written: dict[str, Any], config: Any) -> dict[str, Any]:
    out = dict(written)
    out["rope_base"] = out.pop("rope_theta")
    return out


def _rope_base_read(data: dict[str, Any]) -> dict[str, Any]:
    if "rope_base" in data:
        data["rope_theta"] = data.pop("rope_base")
    return data


def _reversed_unless_power_of_two(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """Each layer's query heads in reverse order where their count is not a power of two
    (its own inverse: export and import both apply it)."""
    heads = config.n_heads
    if heads & (heads - 1) == 0:
        return state
    out = dict(state)
    for i in range(config.n_layers):
        q = out[_Q.format(i=i)]
        out[_Q.format(i=i)] = q.view(heads, -1, q.shape[-1]).flip(0).reshape(q.shape)
    return out


def _plants() -> Planted:
    smol, tiny = _llama("smollm2-135m-instruct"), _llama("tinyllama-1.1b")
    heads = dataclasses.replace(
        smol,
        merge_foreign=_reversed_unless_power_of_two,
        split_foreign=_reversed_unless_power_of_two,
    )
    return Planted(
        "smollm2-135m-instruct",
        {
            "plant-missing": ("hf-llama", _writing(smol, _biases_asked)),
            "plant-mqa": ("hf-llama", _writing(smol, _one_kv_head_as_many)),
            "plant-heads": ("hf-llama", heads),
        },
    ), Planted(
        "tinyllama-1.1b", {"plant-rope": ("hf-llama", _writing(tiny, _rope_base, _rope_base_read))}
    )


@pytest.fixture
def plants(use_registry: Any) -> None:
    smol, tiny = _plants()
    use_registry(load_registry(plugins={"plants": smol, "plants-tiny": tiny}))


def test_a_weight_transformers_reports_missing_fails(plants: None) -> None:
    run_check("plant-missing-tiny", "checkpoint_layouts")  # zoo's own round trip passes
    with pytest.raises(AssertionError, match=r"loaded the exported checkpoint with keys missing"):
        run_check("plant-missing-tiny", "reference")


def test_a_bug_of_one_key_value_head_fails_on_the_second_draw(plants: None) -> None:
    with pytest.raises(
        AssertionError,
        match=r"^6 heads \(1 key/value\), 3 layers: hf-llama: LlamaForCausalLM loaded the "
        r"exported checkpoint with keys of another shape than the class expects: "
        r"\['model\.layers\.0\.self_attn\.k_proj\.weight \(16, 96\) in the file, \(96, 96\)",
    ):
        run_check("plant-mqa-tiny", "reference")


def test_a_bug_of_six_heads_fails_on_the_second_draw(plants: None) -> None:
    run_check("plant-heads-tiny", "checkpoint_layouts")
    with pytest.raises(
        AssertionError, match=r"^6 heads \(1 key/value\), 3 layers: .*logits differ"
    ):
        run_check("plant-heads-tiny", "reference")


def test_a_config_value_under_a_key_transformers_does_not_read_fails(plants: None) -> None:
    """tinyllama's rope_theta is transformers' default: only the draw moved off the defaults
    shows the misspelt key."""
    assert resolve_config("tinyllama-1.1b")[2].rope_theta == 10000.0
    with pytest.raises(AssertionError, match=r"rope_theta moved: hf-llama: logits differ"):
        run_check("plant-rope-tiny", "reference")


def test_an_activation_the_layout_misnames_fails_and_the_kit_proves_it_sees_it(
    use_registry: Any,
) -> None:
    arch, _, _ = resolve_config("gpt2-124m")
    layout = arch.checkpoint_layout("hf-gpt2")

    def tanh_named(written: dict[str, Any], config: Any) -> dict[str, Any]:
        return {**written, "activation_function": "gelu_new"}

    def exact_read(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "activation_function": "gelu"}

    plant = Planted(
        "gpt2-124m",
        {
            "plant-gelu": (
                "hf-gpt2",
                _writing(layout, tanh_named, exact_read),
                {"activation": "gelu"},
            )
        },
    )
    use_registry(load_registry(plugins={"plants": plant}))
    note = run_check("plant-gelu-tiny", "activations")
    assert note is not None and "gelu -> gelu_tanh" in note
    with pytest.raises(AssertionError, match="logits differ from the reference's"):
        run_check("plant-gelu-tiny", "reference")


def test_zoo_check_exits_1_on_a_skip_unless_allowed(plants: None, capsys: Any) -> None:
    """A reference check turned into a skip (transformers lacks the class) fails CI."""
    code = main(["check", "transformer-encdec-tiny", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 1 and "transformer-encdec-tiny reference (cpu): architecture" in out
    assert main(["check", "transformer-encdec-tiny", "--device", "cpu", "--allow-skip"]) == 0


def test_the_plants_are_the_only_difference(use_registry: Any) -> None:
    """Without a bug, each plant's base passes every draw (so what fails is the bug)."""
    for name in ("smollm2-135m-instruct", "tinyllama-1.1b"):
        note = run_check(name, "reference")
        assert note is not None and note.count("greedy tokens equal") == 3
