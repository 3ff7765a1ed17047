"""The seams between a decoder's embedding and its first block, and after its head: fields
for what families share (Granite's ``embedding_multiplier``, BLOOM's ``embedding_norm``) and
component kinds for the rest (``embedding``, ``head``), so that none of it lives in layer 0
of a custom block (as ``blocks.0.emb_norm`` did). zoo's one-call CPU step declines a model
with an embedding seam, so cached decoding keeps recomputation's tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import zoo
from zoo.plugin.current import load_registry
from zoo.plugin.specs import ComponentSpec
from zoo.testing import run_check

_TINY = {"vocab_size": 97, "context_length": 32, "d_model": 32, "n_heads": 4, "n_kv_heads": 2,
         "n_layers": 2, "d_ff": 64, "tie_embeddings": False}  # fmt: skip
_IDS = torch.tensor([[3, 14, 15, 92, 65, 35]])


class _Times(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: Tensor) -> Tensor:
        return x * self.factor


class _Seams:
    @zoo.hookimpl
    def zoo_components(self) -> list[ComponentSpec]:
        return [
            ComponentSpec("embedding", "times-three", lambda config: _Times(3.0)),
            ComponentSpec("head", "halved", lambda config: _Times(0.5)),
        ]

    @zoo.hookimpl
    def zoo_models(self) -> list[zoo.ModelSpec]:
        seams = {"multiplier": {"embedding_multiplier": 12.0}, "norm": {"embedding_norm": True},
                 "component": {"embedding": "times-three", "head": "halved"}}  # fmt: skip
        return [
            zoo.ModelSpec(name=f"seam-{name}", architecture="llama", config={**_TINY, **extra})
            for name, extra in seams.items()
        ]


@pytest.fixture
def seams(use_registry: Any) -> None:
    use_registry(load_registry(plugins={"seams": _Seams()}))


def _logits(model: Any) -> Tensor:
    with torch.no_grad():
        return model.eval()(_IDS)


def _plain(model: Any, **config: Any) -> Any:
    """``model``'s weights in a Llama without the seams (``config`` changes)."""
    torch.manual_seed(0)
    other = zoo.build("llama-tiny", **{**_TINY, **config})
    other.load_state_dict(model.state_dict(), strict=False)
    return other


def test_the_multiplier_scales_the_token_vectors(seams: None) -> None:
    model = zoo.build("seam-multiplier")
    plain = _plain(model)
    with torch.no_grad():
        plain.tok_emb.weight.mul_(12.0)
    assert torch.equal(_logits(model), _logits(plain))


def test_the_embedding_norm_is_a_module_of_its_own_before_the_first_block(seams: None) -> None:
    model = zoo.build("seam-norm")
    assert "emb_norm.weight" in model.state_dict()
    assert not any(key.startswith("blocks.0.emb") for key in model.state_dict())
    with torch.no_grad():
        model.emb_norm.weight.uniform_(0.5, 1.5)
    plain = _plain(model)
    seen = []
    plain.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    _logits(plain), _logits(model)
    assert torch.allclose(seen[1], model.emb_norm(seen[0]))


def test_plugin_components_sit_after_the_embedding_and_after_the_head(seams: None) -> None:
    model = zoo.build("seam-component")
    assert isinstance(model.post_embedding, _Times) and isinstance(model.post_head, _Times)
    plain = _plain(model, embedding_multiplier=3.0, logit_scale=0.5)
    assert torch.equal(_logits(model), _logits(plain))


@pytest.mark.parametrize("name", ["seam-multiplier", "seam-norm", "seam-component"])
def test_cached_decoding_gives_recomputations_logits(name: str, seams: None) -> None:
    """At batch 1 on the CPU the one-call step would embed as a plain Llama does: it
    declines, and the kit's decoding check passes."""
    run_check(name, "decoding")
    model = zoo.build(name).eval()
    greedy = zoo.generate(model, _IDS, max_new_tokens=6, temperature=0.0)
    expected = _IDS
    with torch.no_grad():
        for _ in range(6):
            expected = torch.cat([expected, model(expected)[:, -1:].argmax(-1)], 1)
    assert torch.equal(greedy, expected)
