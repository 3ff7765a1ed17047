"""A config's repeating layer pattern (``layer_pattern``): every registered named model takes
an ``n_layers`` override (Gemma 2 and 3 once stored 26-entry ``layer_types``
lists, so ``zoo.build("gemma-2-2b-it", n_layers=2)`` was a ConfigError), the layers' kinds
match transformers' for Gemma 2 and 3, the Hugging Face export still writes the whole list,
and an explicit irregular list is never resized in silence. Built on the meta device."""

from __future__ import annotations

import json

import pytest

import zoo
from zoo.api import resolve_config
from zoo.errors import ConfigError

SLIDE, FULL = "sliding_attention", "full_attention"


def _named_models() -> list[str]:
    return [name for name in zoo.list_models() if "n_layers" in _fields(name)]


def _fields(name: str) -> tuple[str, ...]:
    _, _, config = resolve_config(name)
    return type(config).field_names()


@pytest.mark.parametrize("name", _named_models())
@pytest.mark.parametrize("layers", [1, 2, 7])
def test_every_named_model_takes_an_n_layers_override(name, layers):
    model = zoo.build(name, n_layers=layers, device="meta")
    config = model.config
    assert config.n_layers == layers
    kinds = [config.layer_type(i) for i in range(layers)]
    assert set(kinds) <= {SLIDE, FULL}


@pytest.mark.parametrize("layers", [1, 2, 3, 6, 7, 13, 26])
def test_gemma_layer_kinds_are_transformers(layers):
    transformers = pytest.importorskip("transformers")
    expected = {
        "gemma-2-2b-it": transformers.Gemma2Config(num_hidden_layers=layers).layer_types,
        "gemma-3-1b-it": transformers.Gemma3TextConfig(num_hidden_layers=layers).layer_types,
    }
    for name, kinds in expected.items():
        _, _, config = resolve_config(name, n_layers=layers)
        assert [config.layer_type(i) for i in range(layers)] == list(kinds), name
        model = zoo.build(name, n_layers=layers, device="meta")
        window = config.sliding_window
        assert list(model.layer_windows) == [window if k == SLIDE else None for k in kinds]


def test_the_named_gemmas_keep_their_26_layers():
    for name, every in (("gemma-2-2b-it", 2), ("gemma-3-1b-it", 6)):
        _, _, config = resolve_config(name)
        kinds = [config.layer_type(i) for i in range(26)]
        assert [i for i, k in enumerate(kinds) if k == FULL] == list(range(every - 1, 26, every))


def test_the_hf_export_writes_every_layer(tmp_path):
    pytest.importorskip("transformers")
    model = zoo.build(
        "gemma-3-1b-it",
        n_layers=7,
        d_model=64,
        n_heads=4,
        head_dim=16,
        d_ff=64,
        vocab_size=300,
        context_length=64,
    )
    zoo.export(model, tmp_path / "hf")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["layer_types"] == [SLIDE] * 5 + [FULL, SLIDE]
    back = zoo.load(tmp_path / "hf", tokenizer=False)
    kinds = [back.config.layer_type(i) for i in range(7)]
    assert kinds == written["layer_types"]


def test_an_explicit_list_is_not_resized():
    irregular = (SLIDE, FULL, FULL, SLIDE)
    with pytest.raises(ConfigError, match=r"layer_types.*4 layers.*n_layers = 2.*layer_pattern"):
        zoo.build(
            "gemma-2-2b-it", layer_pattern=None, layer_types=irregular, n_layers=2, device="meta"
        )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"layer_types": (SLIDE, FULL) * 13, "layer_pattern": (SLIDE,)}, "layer_pattern"),  # both
        ({"layer_pattern": ()}, "layer_pattern"),
        ({"layer_pattern": (FULL,), "sliding_window": None}, None),
        ({"layer_pattern": (SLIDE,), "sliding_window": None}, "layer_pattern"),
        ({"layer_pattern": ("chunked_attention",)}, "layer_pattern"),
    ],
)
def test_a_bad_pattern_is_refused_by_name(change, field):
    if field is None:
        resolve_config("gemma-2-2b-it", **change)
        return
    with pytest.raises(ConfigError, match=field):
        resolve_config("gemma-2-2b-it", **change)


@pytest.mark.parametrize("name", ["gemma-2-2b-it", "gemma-3-1b-it"])
def test_either_spelling_of_the_layer_kinds_overrides_the_other(name):
    """``layer_types`` and ``layer_pattern`` say one thing two ways: overriding one, on a named
    model or on a config, supersedes the other (it was 'give either ..., not both')."""
    kinds = ("full_attention", "sliding_attention", "full_attention")
    config = resolve_config(name, n_layers=3, layer_types=kinds)[2]
    assert config.layer_types == kinds and config.layer_pattern is None
    back = config.replace(layer_pattern=("sliding_attention",), layer_types=None)
    assert [back.layer_type(i) for i in range(3)] == ["sliding_attention"] * 3
    again = back.replace(layer_types=kinds)
    assert again.layer_types == kinds and again.layer_pattern is None
    with pytest.raises(ConfigError, match="not both"):  # both given at once: still refused
        resolve_config(name, n_layers=3, layer_types=kinds, layer_pattern=("full_attention",))
