"""``zoo.build`` builds once: the model it sizes on ``meta`` is the model it
returns, made real and initialised as its constructor would have, so seeded weights are the
ones a direct construction on the device gives."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import zoo
from zoo.api import resolve_config
from zoo.nn import DecoderLM
from zoo.nn.classifier import ClassifierConfig
from zoo.nn.materialize import replays_init
from zoo.plugin.current import get_registry
from zoo.testing import small_overrides


def test_a_build_runs_the_constructor_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """It ran twice: once on ``meta`` to size the model, once again on the device."""
    calls: list[Any] = []
    original = DecoderLM.__init__

    def counting(self: DecoderLM, *args: Any, **kwargs: Any) -> None:
        calls.append(args)
        original(self, *args, **kwargs)

    monkeypatch.setattr(DecoderLM, "__init__", counting)
    model = zoo.build("gpt2-124m", **small_overrides("gpt2-124m"))
    assert len(calls) == 1
    assert all(not p.is_meta for p in model.parameters())
    assert model.head.weight is model.tok_emb.weight  # ties made again


def _direct(config: Any, seed: int) -> torch.nn.Module:
    """The model as ``zoo.build`` made it before: constructed on the CPU."""
    arch, _, config = resolve_config(config)
    torch.manual_seed(seed)
    with torch.device("cpu"):
        return get_registry().model_factory(arch)(config)


def _assert_same(built: torch.nn.Module, direct: torch.nn.Module) -> None:
    expected = direct.state_dict()
    assert list(built.state_dict()) == list(expected)
    for key, tensor in built.state_dict().items():
        assert torch.equal(tensor, expected[key]), key


@pytest.mark.parametrize("name", zoo.list_models())
def test_seeded_weights_are_the_constructors(name: str) -> None:
    """zoo's own models follow the convention the replay needs (another plugin's is
    constructed on the device), and a seeded build gives bit for bit the weights (and leaves
    the random state) of a direct construction."""
    _, _, config = resolve_config(name, **small_overrides(name))
    torch.manual_seed(0)
    built = zoo.build(config)
    after = torch.get_rng_state()
    assert replays_init(built) or not type(built).__module__.startswith(("zoo.", "zoo_plugins."))
    _assert_same(built, _direct(config, 0))
    assert torch.equal(after, torch.get_rng_state())


def test_a_classifier_is_built_once_with_its_bodys_weights() -> None:
    _, _, body = resolve_config("gpt2-124m", **small_overrides("gpt2-124m"))
    config = ClassifierConfig(body="gpt2", body_config=body.to_dict(), labels=["neg", "pos"])
    torch.manual_seed(1)
    built = zoo.build(config)
    assert replays_init(built)
    _assert_same(built, _direct(config, 1))
