"""The block's seams for the next families: a parallel residual (GPT-J, GPT-NeoX) as a config
option, and per-head query/key normalisation inside attention (Qwen3, OLMo-2) as slots an
attention component fills; a model is built from a config plus Parts, so a plugin's
component reaches every block without the registry."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.config import DecoderConfig
from zoo.errors import CheckpointError, ConfigError
from zoo.nn import BUILTIN_COMPONENTS, DecoderLM, MultiHeadAttention, Parts, RMSNorm
from zoo.nn.blocks import TransformerBlock
from zoo.runtime import start_decoding

CONFIG = DecoderConfig(
    vocab_size=97, context_length=32, d_model=32, n_heads=4, d_ff=64, n_layers=2,
    positions="rotary", norm="rmsnorm", ffn="swiglu", bias=False,
)  # fmt: skip


def test_a_parallel_block_adds_both_branches_to_the_same_input():
    torch.manual_seed(0)
    config = dataclasses.replace(CONFIG, parallel_residual=True)
    block = TransformerBlock(config).eval()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want = x + block.attn(block.attn_norm(x), causal=True) + block.ffn(block.ffn_norm(x))
        assert torch.allclose(block(x, causal=True), want, atol=1e-6)
        sequential = TransformerBlock(CONFIG).eval()
        sequential.load_state_dict(block.state_dict())
        assert not torch.allclose(sequential(x, causal=True), want, atol=1e-3)


def test_a_parallel_residual_is_pre_ln_and_has_no_cross_attention():
    with pytest.raises(ConfigError, match=r"parallel_residual.*norm_first=True"):
        dataclasses.replace(CONFIG, parallel_residual=True, norm_first=False)
    with pytest.raises(ValueError, match="no cross-attention"):
        TransformerBlock(dataclasses.replace(CONFIG, parallel_residual=True), cross_attention=True)


def test_a_layout_that_cannot_hold_a_parallel_residual_refuses_to_export(tmp_path):
    model = zoo.build("gpt2-124m", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=300,
                      parallel_residual=True)  # fmt: skip
    with pytest.raises(CheckpointError, match="parallel_residual = True"):
        zoo.export(model, tmp_path)


def _qk_norm_attention(config):
    attention = MultiHeadAttention(config.d_model, config.n_heads, bias=False)
    head_dim = config.d_model // config.n_heads
    attention.q_norm, attention.k_norm = RMSNorm(head_dim), RMSNorm(head_dim)
    return attention


def test_q_and_k_norms_normalise_each_head_before_the_rotation():
    torch.manual_seed(0)
    attention = _qk_norm_attention(CONFIG).eval()
    with torch.no_grad():
        attention.q_norm.weight.uniform_(0.5, 1.5)
        attention.k_norm.weight.uniform_(0.5, 1.5)
        x = torch.randn(2, 6, 32)
        q, k, v = attention.qkv(x).view(2, 6, 3, 4, 8).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = attention.q_norm(q), attention.k_norm(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        want = attention.proj(y.transpose(1, 2).reshape(2, 6, 32))
        assert torch.allclose(attention(x, causal=True), want, atol=1e-6)
    assert {"q_norm.weight", "k_norm.weight"} <= set(attention.state_dict())


def test_a_component_given_as_parts_reaches_every_block_and_decodes_with_the_cache():
    """A q/k-norm attention passed in Parts (no registry): every block has it, and cached
    decoding gives the logits of a full forward pass."""
    torch.manual_seed(0)
    tables = {kind: table[getattr(CONFIG, kind)] for kind, table in BUILTIN_COMPONENTS.items()
              if getattr(CONFIG, kind, None) is not None}  # fmt: skip
    model = DecoderLM(CONFIG, Parts({**tables, "attention": _qk_norm_attention})).eval()
    assert all(block.attn.q_norm is not None for block in model.blocks)
    ids = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        full = model(ids)
        session = start_decoding(model, ids[:, :4], None, 3)
        steps = [session.prefill()] + [session.step(ids[:, i]) for i in range(4, 7)]
    assert torch.allclose(torch.stack(steps[:3], 1), full[:, 3:6], atol=1e-5)
