"""Components (position schemes, norms, feed-forwards, attention) are registered by kind and
name like architectures; each built-in one matches its reference; a plugin's component (the
toy plugin's ALiBi) is picked up by the shared decoder."""

from __future__ import annotations

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import zoo
import zoo.plugin.current
from zoo.errors import ConfigError, PluginContractError, PluginError, RegistryConflictError
from zoo.nn import GatedFeedForward, RMSNorm, RotaryPositions, self_attention_mask
from zoo.plugin.specs import ComponentSpec
from zoo.runtime import start_decoding

BUILTIN = {
    "positions": ["learned", "none", "rotary", "sinusoidal"],
    "norm": ["layernorm", "rmsnorm"],
    "ffn": ["geglu", "mlp", "swiglu"],
    "attention": ["mha"],
}


class _Supplies:
    """A plugin object whose zoo_components hook returns what it is given (or raises)."""

    def __init__(self, *specs: ComponentSpec, error: Exception | None = None) -> None:
        self.specs = list(specs)
        self.error = error

    @zoo.hookimpl
    def zoo_components(self):
        if self.error is not None:
            raise self.error
        return self.specs


def _identity(config) -> nn.Module:
    return nn.Identity()


def _use(use_registry, **kwargs):
    return use_registry(zoo.plugin.current.load_registry(**kwargs))


# -- the registry -------------------------------------------------------------------------------
def test_the_builtin_components_come_from_plugin_zoo():
    registry = zoo.get_registry()
    for kind, names in BUILTIN.items():
        assert set(names) <= set(registry.components(kind))
        assert {registry.source(kind, n) for n in names} == {"plugin zoo"}
    assert registry.components("positions")  # and the toy plugin's own:
    assert registry.source("positions", "alibi") == "plugin toy"


def test_a_component_claimed_twice_is_a_conflict_until_preferred(use_registry, capsys):
    shadow = _Supplies(ComponentSpec("norm", "rmsnorm", _identity))
    _use(use_registry, plugins={"shadow": shadow})
    with pytest.raises(RegistryConflictError, match=r"norm name 'rmsnorm'.*plugin zoo.*shadow"):
        zoo.build("llama-tiny")
    assert zoo.build("gpt2-124m", n_layers=1, d_model=32, n_heads=2, d_ff=64)  # the rest works
    from zoo.cli import main

    assert main(["plugins"]) == 0
    assert "conflict" in capsys.readouterr().out
    _use(use_registry, plugins={"shadow": shadow}, prefer=["shadow"])
    assert isinstance(zoo.build("llama-tiny").final_norm, nn.Identity)


def test_a_broken_component_plugin_does_not_take_the_registry_down(use_registry):
    broken = _Supplies(error=RuntimeError("boom"))
    registry = _use(use_registry, plugins={"broken": broken})
    (info,) = [p for p in registry.plugins if p.name == "broken"]
    assert info.status == "failed" and "zoo_components: RuntimeError: boom" in info.error
    assert zoo.build("llama-tiny")
    with pytest.raises(PluginError, match="boom"):
        zoo.plugin.current.load_registry(plugins={"broken": broken}, strict=True)


def test_an_unknown_component_is_a_config_error_listing_the_known_ones():
    with pytest.raises(ConfigError, match=r"norm: unknown norm component 'batchnorm'.*layernorm"):
        zoo.build("gpt2-124m", norm="batchnorm")


def test_a_factory_that_returns_no_module_breaks_the_contract(use_registry):
    odd = _Supplies(ComponentSpec("ffn", "odd", lambda config: "not a module"))
    _use(use_registry, plugins={"odd": odd})
    with pytest.raises(PluginContractError, match=r"ffn component 'odd'.*not a torch\.nn\.Module"):
        zoo.build("llama-tiny", ffn="odd")


def test_zoo_info_shows_the_components_and_who_supplied_them(capsys):
    from zoo.cli import main

    assert main(["info", "tinyllama-1.1b"]) == 0
    out = capsys.readouterr().out
    for kind, name in [("positions", "rotary"), ("norm", "rmsnorm"), ("ffn", "swiglu")]:
        assert f"{kind}" in out and f"{name} (from plugin zoo)" in out
    assert main(["info", "toy-alibi"]) == 0
    assert "alibi (from plugin toy)" in capsys.readouterr().out


# -- each component against its reference -------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_transformers(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    ours, theirs = RMSNorm(48, eps=1e-5), LlamaRMSNorm(48, eps=1e-5)
    with torch.no_grad():
        ours.weight.normal_()
        theirs.weight.copy_(ours.weight)
    x = torch.randn(3, 7, 48).to(dtype)
    torch.testing.assert_close(ours.to(dtype)(x), theirs.to(dtype)(x), rtol=0, atol=0)


def test_rotary_matches_transformers_llama():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, rope_theta=500.0)
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 2, 9, 16)
    positions = torch.arange(3, 12).expand(2, 9)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    turn = RotaryPositions(16, 16, 500.0).rotation(positions)
    torch.testing.assert_close(turn(q), want_q, rtol=0, atol=0)
    torch.testing.assert_close(turn(k), want_k, rtol=0, atol=0)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(0, 200),
    n=st.integers(0, 200),
    shift=st.integers(0, 200),
    fraction=st.sampled_from([0.25, 0.5, 1.0]),
)
def test_partial_rotary_is_relative_and_leaves_the_rest(m, n, shift, fraction):
    """q(m).k(n) depends on m - n only; features beyond rotary_dim pass through."""
    rotary_dim = int(32 * fraction)
    turn = RotaryPositions(32, rotary_dim, 10000.0).rotation
    g = torch.Generator().manual_seed(m * 1000 + n)
    q, k = torch.randn(1, 1, 1, 32, generator=g), torch.randn(1, 1, 1, 32, generator=g)

    def score(a: int, b: int) -> float:
        qa = turn(torch.tensor([[a]]))(q.double())
        kb = turn(torch.tensor([[b]]))(k.double())
        return float((qa * kb).sum())

    shifted = score(m + shift, n + shift)
    assert score(m, n) == pytest.approx(shifted, rel=1e-4, abs=1e-4)  # float32 angles
    turned = turn(torch.tensor([[m]]))(q)
    assert torch.equal(turned[..., rotary_dim:], q[..., rotary_dim:])


@pytest.mark.parametrize(
    ("name", "act"), [("swiglu", nn.functional.silu), ("geglu", nn.functional.gelu)]
)
def test_gated_feedforwards(name, act):
    model = zoo.build("llama-tiny", ffn=name)
    ffn = model.blocks[0].ffn
    assert isinstance(ffn, GatedFeedForward)
    x = torch.randn(2, 5, 64)
    gate, up = ffn.fc.weight.split(160)  # the fused weight: gate rows, then up rows
    want = (act(x @ gate.T) * (x @ up.T)) @ ffn.proj.weight.T
    torch.testing.assert_close(ffn(x), want, rtol=1e-5, atol=1e-6)


def test_silu_mlp():
    ffn = zoo.build("gpt2-124m", n_layers=1, d_model=32, n_heads=2, d_ff=64, activation="silu")
    mlp = ffn.blocks[0].ffn
    x = torch.randn(3, 32)
    torch.testing.assert_close(mlp(x), mlp.proj(nn.functional.silu(mlp.fc(x))))


def test_grouped_query_attention_caches_only_its_kv_heads():
    model = zoo.build("llama-tiny", n_heads=4, n_kv_heads=1).eval()
    assert model.blocks[0].attn.qkv.weight.shape == (64 + 2 * 16, 64)
    session = start_decoding(model, torch.randint(0, 320, (2, 5)), None, 3)
    session.prefill()
    assert session.cache.layers[0].k.shape == (2, 1, 8, 16)


def test_a_mask_with_a_window_and_a_score_bias():
    bias = torch.arange(2 * 3 * 5, dtype=torch.float32).view(2, 3, 5)  # (H, T, S)
    keep = torch.tensor([[False, True, True, True, True]])
    mask, causal = self_attention_mask(
        keep, q_len=3, start=2, window=2, bias=bias, device=torch.device("cpu"), dtype=torch.float32
    )
    assert not causal and mask.shape == (1, 2, 3, 5)
    allowed = torch.tensor(
        [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool
    )  # query i (index 2 + i) sees keys i+1, i+2: the window, the causal limit, no padding
    assert torch.equal(mask[0].isfinite(), allowed.expand(2, 3, 5))
    assert torch.equal(mask[0][allowed.expand(2, 3, 5)], bias[allowed.expand(2, 3, 5)])


def test_sliding_window_matches_transformers_mistral():
    """A Llama with sliding_window is Mistral: transformers' MistralForCausalLM agrees."""
    torch.manual_seed(0)
    hf_config = transformers.MistralConfig(
        vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        sliding_window=6, rms_norm_eps=1e-5, tie_word_embeddings=False,
    )  # fmt: skip
    hf = transformers.MistralForCausalLM(hf_config).eval()
    model = zoo.build("llama-tiny", sliding_window=6).eval()
    layout = zoo.get_registry().architecture("llama").checkpoint_layout("hf-llama")
    state, report = layout.to_zoo(dict(hf.state_dict()), model.config)
    assert not report.unexpected
    model.load_state_dict(state)
    ids = torch.randint(0, 320, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(zoo.build("llama-tiny").eval()(ids), model(ids))


def test_a_plugins_position_scheme_drives_the_shared_decoder():
    """The toy plugin's ALiBi: a score bias, no embedding vectors, no rotation."""
    model = zoo.build("toy-alibi").eval()
    assert type(model.pos_emb).__name__ == "ALiBi" and not list(model.pos_emb.parameters())
    ids = torch.randint(0, 257, (1, 12))
    with torch.no_grad():
        with_bias = model(ids)
        model.pos_emb.score_bias = lambda q_len, k_len, device: None  # no positions at all
        without = model(ids)
    assert not torch.allclose(with_bias, without)
    torch.testing.assert_close(with_bias[:, 0], without[:, 0])  # one key: nothing to penalise


def test_the_built_in_components_are_one_list():
    """``zoo.nn``'s tables and the registry's plugin ``zoo`` list the same components with
    the same factories: both read ``zoo.catalog.BUILTIN``."""
    from zoo._lazy import resolve
    from zoo.nn import BUILTIN_COMPONENTS
    from zoo.nn.blocks import BUILTIN_BLOCKS
    from zoo.plugin.components import zoo_components

    tables = {**BUILTIN_COMPONENTS, "block": BUILTIN_BLOCKS}
    specs = zoo_components()
    assert {(s.kind, s.name) for s in specs} == {(k, n) for k, t in tables.items() for n in t}
    assert all(resolve(s.factory) is tables[s.kind][s.name] for s in specs)
