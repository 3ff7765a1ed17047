"""Registry-driven: every registered model (the built-ins, the test-installed third-party
``toy-gpt-tiny``, and whatever else is installed) passes every conformance check on every
available device. A new architecture is tested by registering it."""

from __future__ import annotations

import pytest
import torch

import zoo
import zoo.plugin.current
from zoo.nn import DecoderLM
from zoo.nn.masks import positions_from_mask
from zoo.runtime.cache import LayerCache
from zoo.runtime.decoding import DecoderSession, start_session
from zoo.testing import CHECKS, CheckSkipped, conformance_cases, run_check, run_conformance


def test_the_registry_drives_the_cases():
    names = {case[0] for case in conformance_cases()}
    assert {"gpt1", "gpt2-124m", "wiki-gpt-wordpiece", "transformer-encdec"} <= names
    assert "toy-gpt-tiny" in names, "the third-party test plugin must be covered too"


_NO_LAYOUT = {"checkpoint_layouts": "declares no checkpoint layout",
              "reference": "has no reference: no Hugging Face layout"}  # fmt: skip
_ALIBI = "hf-gpt2 cannot hold the small model (positions = 'alibi'"

#: The checks that cannot run on a registered model, and why (a skip the kit reports; any
#: other skip fails here, so a model that loses its reference is noticed).
EXPECTED_SKIPS: dict[tuple[str, str], str] = {
    **{(name, check): why for name in ("transformer-encdec", "transformer-encdec-tiny",
                                       "wiki-gpt-wordpiece")
       for check, why in _NO_LAYOUT.items()},
    ("toy-alibi", "checkpoint_layouts"): _ALIBI,
    ("toy-alibi", "reference"): "hf-gpt2: the layout cannot hold the small model",
}  # fmt: skip


@pytest.mark.parametrize(("model", "check", "device"), conformance_cases())
def test_conformance(model: str, check: str, device: str) -> None:
    try:
        run_check(model, check, device=device)
    except CheckSkipped as exc:
        expected = EXPECTED_SKIPS.get((model, check))
        assert expected is not None, f"{check} skipped: {exc}"
        assert expected in str(exc)


# -- the kit itself must be able to fail ---------------------------------------------------


_SIZES = {"vocab_size": 512, "context_length": 64, "d_model": 32, "n_heads": 2, "n_layers": 2,
          "d_ff": 64}  # fmt: skip


def _plugin_with(model_ref: str, name: str):
    """A throwaway plugin whose architecture is a deliberately broken variant of gpt2."""

    class Plugin:
        @zoo.hookimpl
        def zoo_architectures(self):
            return [zoo.ArchitectureSpec(name=name, config=_config_for(name), model=model_ref)]

        @zoo.hookimpl
        def zoo_models(self):
            return [zoo.ModelSpec(name=f"{name}-m", architecture=name, config=_SIZES)]

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


class _WriteAtZero(LayerCache):
    """Writes new keys/values at index 0 but returns views of the right length: decoding runs
    without an error and is silently wrong."""

    def write(self, start, k, v):
        super().write(0, k, v)
        end = start + k.shape[2]
        return self.k.narrow(2, 0, end), self.v.narrow(2, 0, end)


class _BrokenCacheWrite(DecoderLM):
    """Its KV cache writes every step at index 0 (``cache.write(0, ...)``)."""

    def start_decoding(self, input_ids, keep, max_new_tokens, *, start_id=None):
        session = start_session(self, input_ids, keep, max_new_tokens)
        session.cache.layers = [_WriteAtZero(c.k, c.v) for c in session.cache.layers]
        return session


class _PaddingBlindSession(DecoderSession):
    def __init__(self, model, ids, keep, max_len):
        super().__init__(model, ids, keep, max_len)
        self.next_position = positions_from_mask(ids, None)[:, -1:] + 1  # counts the padding


class _BrokenPaddingOffset(DecoderLM):
    """After a left-padded prompt, generated tokens get positions that count the padding."""

    def start_decoding(self, input_ids, keep, max_new_tokens, *, start_id=None):
        return _PaddingBlindSession(self, input_ids, keep, input_ids.shape[1] + max_new_tokens)


class _OffByOneSession(DecoderSession):
    def step(self, tokens):
        self.next_position = self.next_position + 1  # one position too far
        return super().step(tokens)


class _PositionOffByOne(DecoderLM):
    """Each decoded token gets the position after its own."""

    def start_decoding(self, input_ids, keep, max_new_tokens, *, start_id=None):
        return _OffByOneSession(self, input_ids, keep, input_ids.shape[1] + max_new_tokens)


@pytest.mark.parametrize(
    ("cls", "check"),
    [
        ("_CPUPositions", "meta"),
        ("_IndexError", "bad_input"),
        ("_BrokenCacheWrite", "decoding"),
        ("_BrokenPaddingOffset", "decoding"),
        ("_PositionOffByOne", "decoding"),
    ],
)
def test_the_kit_catches_broken_models(monkeypatch, cls, check, use_registry):
    registry = zoo.plugin.current.load_registry(
        plugins={"broken": _plugin_with(f"{__name__}:{cls}", "broken-gpt")}
    )
    use_registry(registry)
    with pytest.raises(AssertionError):
        run_check("broken-gpt-m", check)
    failed = [r for r in run_conformance("broken-gpt-m", checks=[check]) if not r.ok]
    assert failed and failed[0].error


@pytest.mark.parametrize("name", ["gpt2-124m", "transformer-encdec"])
def test_the_kit_catches_the_cache_written_at_index_zero(monkeypatch, name):
    """The reported mutation itself, `cache.write(0, k, v)` in the attention of the built-in
    models (decoder and encoder-decoder sessions): `zoo check` said "all checks passed". With
    zoo's kernels off: where they run, a decoding step's attention writes the cache in C
    (`zoo.kernels.native.attend_one`) and `LayerCache.write` is not reached."""
    from zoo.kernels import native

    monkeypatch.setattr(native, "_library", lambda: None)
    monkeypatch.setattr(native, "_kernels", lambda: None)
    real = LayerCache.write
    monkeypatch.setattr(LayerCache, "write", lambda self, start, k, v: real(self, 0, k, v))
    (result,) = run_conformance(name, checks=["decoding"], devices=["cpu"])
    assert not result.ok and result.error


def test_the_kit_catches_the_cache_written_at_index_zero_by_zoos_kernel(monkeypatch):
    """The same mutation where zoo's kernel writes the cache (one new token of each row, an
    encoder-decoder's decoding session): `zoo.kernels.native.attend_one` told position 0. (A
    decoder's batch-1 step is one C call, `zoo_decode_step_f32`: tests/test_native_block.py.)"""
    from zoo.kernels import native

    if not native.available():
        pytest.skip("needs zoo's native kernels (zoo.kernels._native not built, or no AVX2+FMA)")
    real = native.attend_one
    monkeypatch.setattr(
        native, "attend_one", lambda q, k, v, ck, cv, start, scale: real(q, k, v, ck, cv, 0, scale)
    )
    (result,) = run_conformance("transformer-encdec", checks=["decoding"], devices=["cpu"])
    assert not result.ok and result.error


def test_every_check_is_documented():
    assert all(func.__doc__ for func in CHECKS.values())


class _PlainModule(torch.nn.Module):
    """A model class that is not a ZooModel (an nn.Module wrapped without the base class)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.lin = torch.nn.Linear(4, 4)


def test_a_model_that_is_not_a_zoo_model_is_refused_at_first_build(monkeypatch, use_registry):
    registry = zoo.plugin.current.load_registry(
        plugins={"plain": _plugin_with(f"{__name__}:_PlainModule", "plain-gpt")}
    )
    use_registry(registry)
    assert "plain-gpt-m" in zoo.list_models()  # registration stays lazy and torch-free
    with pytest.raises(
        zoo.PluginContractError, match=r"not a subclass of zoo\.nn\.ZooModel.*docs/plugins\.md"
    ):
        zoo.build("plain-gpt-m")
    (result,) = run_conformance("plain-gpt-m", checks=["forward"], devices=["cpu"])
    assert not result.ok and "PluginContractError" in result.error
