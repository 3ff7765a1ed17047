"""The shared decoder's seams for third-party families, on every decoding path: per-layer
windows and rotary bases (``layer_types``, ``rope_local_theta``), soft-capped attention scores
and logits, a logit scale, declared blocks (a plugin's block is told its layer index).

Each path (full recomputation, the dynamic session, the fixed-shape step that CUDA graphs
record and ``compile=True`` compiles, the serving slot batch, a left-padded batch, int8) must
give the same logits; the families' own tests compare the arithmetic with transformers.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import zoo
from zoo.config import DecoderConfig
from zoo.errors import ConfigError
from zoo.nn import DecoderLM, MultiHeadAttention
from zoo.quant.layers import quantize_
from zoo.runtime.decoding import DecoderSession, StaticDecoderSession
from zoo.runtime.slots import SlotBatch

TINY = {"vocab_size": 97, "context_length": 64, "d_model": 32, "n_heads": 4, "n_kv_heads": 2,
        "n_layers": 3, "d_ff": 48, "positions": "rotary", "norm": "rmsnorm1p", "ffn": "geglu",
        "activation": "gelu_tanh", "block": "sandwich", "bias": False, "tie_embeddings": True,
        "scale_embeddings": True}  # fmt: skip
MIXED = {**TINY, "sliding_window": 3, "rope_local_theta": 10.0,
         "layer_types": ("sliding_attention", "full_attention", "sliding_attention"),
         "attn_softcap": 1.5, "final_softcap": 2.0, "logit_scale": 0.5,
         "attn_scale": 0.3}  # fmt: skip


def model_of(**values: object) -> DecoderLM:
    torch.manual_seed(0)
    model = DecoderLM(DecoderConfig(**values)).eval()  # type: ignore[arg-type]
    with torch.no_grad():  # weights large enough that every seam shows, norms not identity
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def recomputed(model: DecoderLM, ids: list[int], forced: list[int]) -> torch.Tensor:
    """Next-token logits after the prompt and each forced token, each by a full forward."""
    rows = [model(torch.tensor([ids + forced[:k]]))[0, -1] for k in range(len(forced))]
    return torch.stack(rows)  # (N, V)


PROMPT, FORCED = [5, 17, 3, 44, 9, 61, 2, 30], [7, 12, 90, 4, 55, 8]


@pytest.fixture(scope="module")
def mixed() -> DecoderLM:
    return model_of(**MIXED)


def test_the_mixed_layers_change_the_logits(mixed: DecoderLM) -> None:
    """The test can fail: each seam moves the logits (a path that dropped one would differ)."""
    ids = torch.tensor([PROMPT + FORCED])
    with torch.no_grad():
        base = mixed(ids)
        for change in ({"layer_types": None, "sliding_window": None}, {"rope_local_theta": None},
                       {"attn_softcap": None}, {"final_softcap": None}, {"logit_scale": 1.0},
                       {"attn_scale": None}):  # fmt: skip
            other = copy.deepcopy(mixed)
            other.__init__(mixed.config.replace(**change))  # type: ignore[misc]
            other.load_state_dict(mixed.state_dict())
            assert (other.eval()(ids) - base).abs().max() > 1e-2, change


def test_every_decoding_path_gives_the_recomputed_logits(mixed: DecoderLM) -> None:
    with torch.no_grad():
        want = recomputed(mixed, PROMPT, FORCED)
        ids = torch.tensor([PROMPT])
        for session in (DecoderSession(mixed, ids, None, 20),
                        StaticDecoderSession(mixed, ids, None, 20, record=False)):  # fmt: skip
            got = [session.prefill()[0]]
            for token in FORCED[:-1]:
                got.append(session.step(torch.tensor([token]))[0])
            torch.testing.assert_close(torch.stack(got), want, rtol=0, atol=1e-5)
        batch: SlotBatch[str] = SlotBatch(mixed, max_rows=2, max_len=20)
        batch.add("other", torch.tensor([8, 1, 2]))  # a second row at another position
        got = [batch.add("row", torch.tensor(PROMPT))]
        for token in FORCED[:-1]:
            got.append(batch.step(torch.tensor([3, token]))[1])
        torch.testing.assert_close(torch.stack(got), want, rtol=0, atol=1e-5)


def test_a_left_padded_batch_decodes_each_row_as_alone(mixed: DecoderLM) -> None:
    short = PROMPT[:3]
    ids = torch.tensor([PROMPT, [0] * (len(PROMPT) - len(short)) + short])
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[1, : len(PROMPT) - len(short)] = False
    with torch.no_grad():
        for static in (False, True):
            session = (StaticDecoderSession(mixed, ids, keep, 20, record=False) if static
                       else DecoderSession(mixed, ids, keep, 20))  # fmt: skip
            first = session.prefill()
            second = session.step(torch.tensor([FORCED[0], FORCED[0]]))
            for row, prompt in enumerate((PROMPT, short)):
                want = recomputed(mixed, prompt, FORCED[:2])
                torch.testing.assert_close(first[row], want[0], rtol=0, atol=1e-5)
                torch.testing.assert_close(second[row], want[1], rtol=0, atol=1e-5)


def test_int8_keeps_the_logit_scale_and_cap() -> None:
    """The scale and the cap act after the head, whatever module the head became."""
    model = model_of(**{**TINY, "tie_embeddings": False, "logit_scale": 0.25})
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        full = model(ids)
        small = quantize_(copy.deepcopy(model), "int8")(ids)
        unscaled = model.head(model.states(ids, None, torch.arange(len(PROMPT))[None]))
    torch.testing.assert_close(full, unscaled * 0.25)
    ratio = float(small.abs().mean() / full.abs().mean())
    assert 0.9 < ratio < 1.1, f"int8 logits are {ratio:.2f}x the float ones"


def test_capped_attention_is_the_formula() -> None:
    """Scores ``cap * tanh(s * scale / cap)``, masked, softmax in float32, grouped keys."""
    torch.manual_seed(1)
    attn = MultiHeadAttention(32, 4, n_kv_heads=2, bias=False, scale=0.2, softcap=1.5).eval()
    x = torch.randn(2, 5, 32)
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[1, ..., :2] = False  # left padding of row 1
    mask[1, ..., 0, 0] = mask[1, ..., 1, 1] = True
    q, k, v = attn.qkv(x).split((32, 16, 16), dim=-1)
    q = q.view(2, 5, 4, 8).transpose(1, 2)  # (B, H, T, hd)
    k, v = (t.view(2, 5, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1) for t in (k, v))
    scores = 1.5 * torch.tanh(q @ k.transpose(-1, -2) * 0.2 / 1.5)
    weights = scores.masked_fill(~mask, -math.inf).softmax(-1)
    want = attn.proj((weights @ v).transpose(1, 2).reshape(2, 5, 32))
    with torch.no_grad():
        torch.testing.assert_close(attn(x, mask=mask), want, rtol=0, atol=1e-6)
        causal = attn(x, causal=True)
    torch.testing.assert_close(causal[0], want[0], rtol=0, atol=1e-6)


class _Tagged(nn.Module):
    """A plugin's block: a pre-LN block that scales its branches by 1 / (layer + 1)."""

    def __init__(self, config: DecoderConfig, parts: zoo.nn.Parts, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.attn = parts.build("attention", config)
        self.ffn = parts.build("ffn", config)
        self.norm = parts.build("norm", config)

    def forward(self, x, *, mask=None, causal=False, cache=None, start=0, rotation=None):  # type: ignore[no-untyped-def]
        h = self.attn(self.norm(x), mask=mask, causal=causal, cache=cache, start=start,
                      rotation=rotation)  # fmt: skip
        x = x + h / (self.layer + 1)
        return x + self.ffn(self.norm(x)) / (self.layer + 1)


class _BlockPlugin:
    @zoo.hookimpl
    def zoo_components(self) -> list[zoo.ComponentSpec]:
        return [zoo.ComponentSpec("block", "tagged", _Tagged, "branches scaled by depth")]

    @zoo.hookimpl
    def zoo_models(self) -> list[zoo.ModelSpec]:
        config = {**TINY, "block": "tagged", "norm": "rmsnorm"}
        return [zoo.ModelSpec(name="tagged-tiny", architecture="llama", tokenizer="byte",
                              config=config)]  # fmt: skip


def test_a_plugin_declares_its_block_and_it_is_told_its_layer(use_registry) -> None:  # type: ignore[no-untyped-def]
    from zoo.plugin.current import load_registry
    from zoo.testing import run_check

    use_registry(load_registry(plugins={"tagged": _BlockPlugin()}))
    model = zoo.build("tagged-tiny")
    assert [block.layer for block in model.blocks] == [0, 1, 2]
    assert all(isinstance(block, _Tagged) for block in model.blocks)
    for check in ("forward", "backward", "decoding", "save_load_roundtrip"):
        run_check("tagged-tiny", check)


@pytest.mark.parametrize(
    ("values", "field"),
    [({"layer_types": ("full_attention",)}, "layer_types"),
     ({"layer_types": ("sliding_attention",) * 3}, "layer_types"),
     ({"layer_types": ("global",) * 3, "sliding_window": 4}, "layer_types"),
     ({"rotary_dim": 7}, "rotary_dim"), ({"rotary_dim": 10}, "rotary_dim"),
     ({"attn_softcap": 0.0}, "attn_softcap"), ({"final_softcap": -1.0}, "final_softcap")],
)  # fmt: skip
def test_bad_layer_settings_are_refused_naming_the_field(values: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        DecoderConfig(**{**TINY, **values})  # type: ignore[arg-type]


def test_layer_types_round_trip_through_a_checkpoint(mixed: DecoderLM, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(zoo.CheckpointError, match="names no architecture"):
        zoo.save(mixed, tmp_path / "nameless")  # a bare DecoderConfig: nothing could load it
    assert not (tmp_path / "nameless").exists()
    config = zoo.get_registry().architecture("llama").config_class(**MIXED)
    model = zoo.build(config)
    model.load_state_dict(mixed.state_dict())
    zoo.save(model, tmp_path / "llama")
    loaded = zoo.load(tmp_path / "llama", tokenizer=False)
    assert loaded.config == config and loaded.config.layer_types == MIXED["layer_types"]
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        assert torch.equal(loaded(ids), mixed(ids))


def test_scaled_embeddings_round_the_scale_to_their_dtype() -> None:
    """transformers' Gemma multiplies by ``tensor(sqrt(d), dtype=activations)``: in bfloat16
    ``sqrt(3584) = 59.87`` is 59.75, and a third of the products differ from a multiply by
    the Python float. float32 is unchanged."""
    from zoo.nn.base import embed_tokens
    from zoo.nn.positions import NoPositions

    emb = nn.Embedding(50, 3584)
    ids = torch.arange(50)[None]
    for dtype in (torch.bfloat16, torch.float32):
        table = emb.to(dtype)
        got = embed_tokens(table, NoPositions(), nn.Identity(), ids, ids, scale_by_width=True)
        want = table(ids) * torch.tensor(3584**0.5, dtype=dtype)
        assert torch.equal(got, want), dtype
