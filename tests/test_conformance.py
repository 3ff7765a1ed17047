"""Registry-driven: every registered model (the built-ins, the test-installed third-party
``toy-gpt-tiny``, and whatever else is installed) passes every conformance check on every
available device. A new architecture is tested by registering it."""

from __future__ import annotations

import pytest
import torch

import zoo
import zoo.registry
from zoo.nn import DecoderLM
from zoo.testing import CHECKS, conformance_cases, run_check, run_conformance


def test_the_registry_drives_the_cases():
    names = {case[0] for case in conformance_cases()}
    assert {"gpt1", "gpt2-124m", "wiki-gpt-wordpiece", "transformer-encdec"} <= names
    assert "toy-gpt-tiny" in names, "the third-party test plugin must be covered too"


@pytest.mark.parametrize(("model", "check", "device"), conformance_cases())
def test_conformance(model: str, check: str, device: str) -> None:
    run_check(model, check, device=device)


# -- the kit itself must be able to fail ---------------------------------------------------


def _plugin_with(model_ref: str, name: str):
    """A throwaway plugin whose architecture is a deliberately broken variant of gpt2."""

    class Plugin:
        @zoo.hookimpl
        def zoo_architectures(self):
            return [zoo.ArchitectureSpec(name=name, config=_config_for(name), model=model_ref)]

        @zoo.hookimpl
        def zoo_models(self):
            return [zoo.ModelSpec(name=f"{name}-m", architecture=name)]

    return Plugin()


def _config_for(arch: str):
    import dataclasses
    from typing import ClassVar

    from zoo_plugins.gpt2.config import GPT2Config

    return dataclasses.make_dataclass(
        "BrokenConfig",
        [("architecture", ClassVar[str], arch)],
        bases=(GPT2Config,),
        frozen=True,
        kw_only=True,
    )


class _CPUPositions(DecoderLM):
    """Builds its positions on a hard-coded CPU device (works on CPU, breaks on any other)."""

    def forward(self, input_ids, attention_mask=None):
        positions = torch.arange(input_ids.shape[1], device="cpu")
        x = self.tok_emb(input_ids) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x, causal=True)
        return self.head(self.final_norm(x))


class _IndexError(DecoderLM):
    """Skips input validation: out-of-range ids fail deep inside torch."""

    def forward(self, input_ids, attention_mask=None):
        x = self.tok_emb(input_ids) + self.pos_emb(torch.arange(input_ids.shape[-1]))
        return self.head(x)


@pytest.mark.parametrize(
    ("cls", "check"), [("_CPUPositions", "meta"), ("_IndexError", "bad_input")]
)
def test_the_kit_catches_broken_models(monkeypatch, cls, check):
    registry = zoo.registry.load_registry(
        plugins={"broken": _plugin_with(f"{__name__}:{cls}", "broken-gpt")}
    )
    monkeypatch.setattr(zoo.registry, "_default", registry)
    with pytest.raises(AssertionError):
        run_check("broken-gpt-m", check)
    failed = [r for r in run_conformance("broken-gpt-m", checks=[check]) if not r.ok]
    assert failed and failed[0].error


def test_every_check_is_documented():
    assert all(func.__doc__ for func in CHECKS.values())
