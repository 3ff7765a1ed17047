"""Parity against reference implementations on identical weights and inputs.

- gpt2-124m / gpt1: ``transformers.GPT2LMHeadModel`` / ``OpenAIGPTLMHeadModel`` state dicts,
  converted through each plugin's declared Hugging Face key map (Conv1D transposes included).
- wiki-gpt-wordpiece: ``torch.nn.TransformerEncoderLayer(norm_first=False, activation="relu")``
  under a causal mask, with padding.
- transformer-encdec: ``torch.nn.Transformer(norm_first=False)``, source length != target
  length, with padding on both sides.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import zoo
from zoo.nn import SinusoidalPositions
from zoo.testing import assert_logits_close

transformers = pytest.importorskip("transformers")

TINY = {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 48, "vocab_size": 211}


def _hf_model(kind: str, size: dict) -> nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(**size, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config).eval()
    return transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(**size)).eval()


def _zoo_from_hf(name: str, layout: str, hf: nn.Module) -> nn.Module:
    keymap = zoo.get_registry().architecture(zoo.resolve_config(name)[0].name)
    keymap = keymap.checkpoint_layout(layout)
    model = zoo.build(name, **keymap.config_from_foreign(hf.config.to_dict())).eval()
    state, report = keymap.to_zoo(hf.state_dict())
    assert report.unexpected == ()
    model.load_state_dict(state, strict=True)
    return model


HF_CASES = [("gpt2-124m", "hf-gpt2", "gpt2"), ("gpt1", "hf-openai-gpt", "openai-gpt")]


@pytest.mark.parametrize(("name", "layout", "kind"), HF_CASES)
def test_tiny_hf_parity(name, layout, kind):
    hf = _hf_model("gpt2" if kind == "gpt2" else "gpt1", TINY)
    model = _zoo_from_hf(name, layout, hf)
    ids = torch.randint(0, TINY["vocab_size"], (3, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0  # right padding
    with torch.no_grad():
        ours = model(ids, attention_mask=mask)
        theirs = hf(ids, attention_mask=mask).logits
    keep = mask.bool()
    assert_logits_close(ours[keep], theirs[keep], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layout", "kind"), HF_CASES)
def test_full_size_hf_parity(name, layout, kind):
    hf = _hf_model("gpt2" if kind == "gpt2" else "gpt1", {})
    model = _zoo_from_hf(name, layout, hf)
    expected = {"gpt2-124m": 124_439_808, "gpt1": 116_534_784}[name]
    assert model.num_parameters() == expected == zoo.info(name).parameters
    assert model.head.weight is model.tok_emb.weight
    ids = torch.randint(
        0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(2)
    )
    with torch.no_grad():
        assert_logits_close(model(ids), hf(ids).logits, atol=1e-5)


# -- wiki-gpt vs torch.nn.TransformerEncoderLayer -------------------------------------------
def _copy_self_attention(ref: nn.MultiheadAttention, ours) -> None:
    ref.in_proj_weight.data.copy_(ours.qkv.weight)
    ref.in_proj_bias.data.copy_(ours.qkv.bias)
    ref.out_proj.weight.data.copy_(ours.proj.weight)
    ref.out_proj.bias.data.copy_(ours.proj.bias)


def _copy_linear_norm(dst: nn.Module, src: nn.Module) -> None:
    dst.weight.data.copy_(src.weight)
    dst.bias.data.copy_(src.bias)


def _copy_encoder_layer(ref: nn.TransformerEncoderLayer, block) -> None:
    _copy_self_attention(ref.self_attn, block.attn)
    _copy_linear_norm(ref.linear1, block.ffn.fc)
    _copy_linear_norm(ref.linear2, block.ffn.proj)
    _copy_linear_norm(ref.norm1, block.attn_norm)
    _copy_linear_norm(ref.norm2, block.ffn_norm)


def _reference_encoder_layer(block, c) -> nn.TransformerEncoderLayer:
    ref = nn.TransformerEncoderLayer(
        c.d_model,
        c.n_heads,
        c.d_ff,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=False,
        layer_norm_eps=c.layer_norm_eps,
    )
    _copy_encoder_layer(ref, block)
    return ref.eval()


@pytest.mark.parametrize("overrides", [{}, {"d_model": 48, "n_heads": 6, "n_layers": 2}])
def test_wiki_gpt_matches_torch_encoder_layers(overrides):
    torch.manual_seed(0)
    model = zoo.build("wiki-gpt-wordpiece", **overrides).eval()
    c = model.config
    refs = [_reference_encoder_layer(b, c) for b in model.blocks]
    b, t = 3, 37
    ids = torch.randint(0, c.vocab_size, (b, t), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(b, t, dtype=torch.long)
    mask[0, 30:] = 0
    mask[2, 11:] = 0
    causal = torch.ones(t, t, dtype=torch.bool).triu(1)  # True = not allowed (torch convention)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask)
        x = model.embed(ids, torch.arange(t).expand(b, t))
        for ref in refs:
            x = ref(x, src_mask=causal, src_key_padding_mask=~mask.bool(), is_causal=True)
        theirs = model.head(x)
    keep = mask.bool()
    assert_logits_close(ours[keep], theirs[keep], atol=1e-5)


# -- transformer-encdec vs torch.nn.Transformer ---------------------------------------------
def _reference_transformer(model) -> nn.Transformer:
    c = model.config
    ref = nn.Transformer(
        c.d_model,
        c.n_heads,
        c.n_encoder_layers,
        c.n_decoder_layers,
        c.d_ff,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=False,
        layer_norm_eps=c.layer_norm_eps,
    )
    for ref_layer, block in zip(ref.encoder.layers, model.encoder, strict=True):
        _copy_encoder_layer(ref_layer, block)
    for ref_layer, block in zip(ref.decoder.layers, model.decoder, strict=True):
        _copy_self_attention(ref_layer.self_attn, block.attn)
        cross = ref_layer.multihead_attn
        cross.in_proj_weight.data.copy_(
            torch.cat([block.cross_attn.q.weight, block.cross_attn.kv.weight])
        )
        cross.in_proj_bias.data.copy_(
            torch.cat([block.cross_attn.q.bias, block.cross_attn.kv.bias])
        )
        _copy_linear_norm(cross.out_proj, block.cross_attn.proj)
        _copy_linear_norm(ref_layer.linear1, block.ffn.fc)
        _copy_linear_norm(ref_layer.linear2, block.ffn.proj)
        _copy_linear_norm(ref_layer.norm1, block.attn_norm)
        _copy_linear_norm(ref_layer.norm2, block.cross_norm)
        _copy_linear_norm(ref_layer.norm3, block.ffn_norm)
    if c.final_norm:
        _copy_linear_norm(ref.encoder.norm, model.encoder_norm)
        _copy_linear_norm(ref.decoder.norm, model.decoder_norm)
    else:
        ref.encoder.norm = None
        ref.decoder.norm = None
    return ref.eval()


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"n_encoder_layers": 2, "n_decoder_layers": 3, "d_model": 64, "n_heads": 4, "d_ff": 96},
        {
            "n_encoder_layers": 1,
            "n_decoder_layers": 1,
            "d_model": 64,
            "n_heads": 2,
            "final_norm": False,
            "tie_embeddings": False,
            "head_bias": True,
        },
    ],
)
def test_encdec_matches_torch_transformer(overrides):
    torch.manual_seed(0)
    model = zoo.build("transformer-encdec", **overrides).eval()
    ref = _reference_transformer(model)
    c = model.config
    g = torch.Generator().manual_seed(4)
    b, s, t = 3, 29, 17  # source and target lengths differ
    src = torch.randint(0, c.vocab_size, (b, s), generator=g)
    tgt = torch.randint(0, c.vocab_size, (b, t), generator=g)
    src_mask = torch.ones(b, s, dtype=torch.long)
    src_mask[1, 20:] = 0
    tgt_mask = torch.ones(b, t, dtype=torch.long)
    tgt_mask[2, 9:] = 0
    causal = torch.ones(t, t, dtype=torch.bool).triu(1)
    with torch.no_grad():
        ours = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
        out = ref(
            model.embed(src, torch.arange(s).expand(b, s)),
            model.embed(tgt, torch.arange(t).expand(b, t)),
            tgt_mask=causal,
            src_key_padding_mask=~src_mask.bool(),
            memory_key_padding_mask=~src_mask.bool(),
            tgt_key_padding_mask=~tgt_mask.bool(),
            tgt_is_causal=True,
        )
        theirs = model.head(out)
    keep = tgt_mask.bool()
    assert_logits_close(ours[keep], theirs[keep], atol=1e-5)


def test_encdec_encode_decode_equals_forward():
    model = zoo.build("transformer-encdec-tiny").eval()
    src = torch.randint(0, 100, (2, 11))
    tgt = torch.randint(0, 100, (2, 5))
    src_mask = torch.tensor([[1] * 11, [1] * 6 + [0] * 5])
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        assert_logits_close(
            model.decode(tgt, memory, src_mask=src_mask), model(src, tgt, src_mask), atol=0.0
        )


# -- position schemes -----------------------------------------------------------------------
@pytest.mark.parametrize("d_model", [8, 512, 7])
def test_sinusoidal_positions_follow_vaswani(d_model):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    pe = SinusoidalPositions(600, d_model)(torch.arange(600)[None])[0]
    for pos in (0, 1, 17, 511, 599):
        for j in range(d_model):
            angle = pos / 10000 ** ((j - j % 2) / d_model)
            expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
            assert pe[pos, j].item() == pytest.approx(expected, abs=2e-4)
    assert not torch.equal(pe[1], pe[2]), "positions must differ (exponent 0 makes all equal)"


def test_left_padding_gives_the_unpadded_logits():
    """Positions count real tokens only, so padding on the left changes nothing."""
    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", n_layers=2, d_model=64, n_heads=4, d_ff=128).eval()
    ids = torch.randint(0, 1000, (1, 9))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0] * 4 + [1] * 9])
    with torch.no_grad():
        assert_logits_close(model(padded, attention_mask=mask)[:, 4:], model(ids), atol=1e-5)


@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("gpt1", "transformers.models.openai.modeling_openai:ACT_FNS.gelu"),
        ("gpt2-124m", "transformers.activations:ACT2FN.gelu_new"),
    ],
)
def test_activation_matches_hf_over_a_wide_range(name, reference):
    """Tiny random models cannot tell GELU-erf from GELU-tanh at 1e-5, so check the function
    itself where the two differ (|x| of a few units)."""
    import importlib

    module, _, path = reference.partition(":")
    table, key = path.split(".")
    hf_act = getattr(importlib.import_module(module), table)[key]
    ours = zoo.build(name, device="meta").blocks[0].ffn.act
    x = torch.linspace(-8, 8, 20001)
    assert (ours(x) - hf_act(x)).abs().max().item() < 1e-6
