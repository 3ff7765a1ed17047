"""zoo's one-call decoding step (``zoo.runtime.native_block``, ``zoo/kernels/_native_block.c``: the
embedding, every block, the final norm and the head of one batch-1 token) against the
per-module path it replaces and against transformers.

Each case runs in a child process (``native_child.run_native``), so a crash in the C code
fails the test instead of killing the run; the child ends early (and the test is skipped)
where the kernels are not built or the CPU lacks AVX2 and FMA.

- Models drawn over every block layout (pre-norm, post-norm, parallel), norm, feed-forward,
  activation, grouped-query geometry, position scheme (learned, rotary of full or half
  width, none), bias, final norm, tied head and embedding scale decode the same logits and
  write the same cache as the per-module path (to the bit with ReLU, whose activation
  both compute exactly; within float32 rounding of the activation otherwise), in float32
  and with ``quantize="int8"``.
- Batch-1 greedy decoding of GPT-2 and Llama gives transformers' logits and tokens, and the
  one call is what ran at every step.
- It declines, and the per-module path runs, wherever its conditions fail: forward hooks,
  gradients, a mask, a subclass, a LoRA-wrapped linear, dropout in training; it follows a
  weight replaced or changed between steps, and a copy of the model its own weights; an
  overridden ``embed`` (on the class or the instance) declines, a block subclass that
  declares ``same_forward`` and plain ``torch.nn.Linear`` layers run fused; a model
  that has decoded still copies and pickles; an int8 step that meets NaN falls back.
"""

from __future__ import annotations

import textwrap

import pytest
from native_child import run_native

COMMON = textwrap.dedent(
    """
    import torch
    import zoo
    from zoo.runtime import native_block
    from zoo.runtime.cache import KVCache

    def session_logits(model, ids, keep, positions, cache):
        # what a decoding session computes for new ids: the one-call step where it applies
        # (zoo.runtime.native_block.one_call), else the model's forward pass
        fused = native_block.one_call(model, ids, keep, positions, cache)
        if fused is not None:
            return fused
        return model.logits(ids, keep, positions, cache=cache)

    from zoo.kernels import onednn

    onednn.MIN_WEIGHTS = 0  # the per-module path's products on zoo's kernel too, at any size
    fused_decode = native_block.decode
    calls = []

    def counted(*args):
        out = fused_decode(*args)
        calls.append(out is not None)
        return out

    native_block.decode = counted

    def decode(model, ids, steps, fused=True, length=32):
        '''Prefill ``ids`` (1, T), then feed ``steps`` (1, n) one at a time: the logits of
        every step (1, n, vocab) and the cache; ``fused=False`` runs the per-module path.'''
        c = model.config
        heads = c.n_kv_heads or c.n_heads
        cache = KVCache(c.n_layers, 1, heads, length, c.head_size, dtype=torch.float32,
                        device=torch.device("cpu"))
        native_block.decode = fused_decode if fused else (lambda *args: None)
        out = []
        with torch.inference_mode():
            session_logits(model, ids, None, torch.arange(ids.shape[1])[None], cache=cache)
            if fused:
                native_block.decode = counted  # count the steps, not the prompt
            for i in range(steps.shape[1]):
                pos = torch.tensor([[cache.length]])
                out.append(session_logits(model, steps[:, i : i + 1], None, pos, cache=cache))
        native_block.decode = counted
        return torch.cat(out, 1), cache

    def same(a, b, exact):
        if exact:
            return torch.equal(a, b)
        return torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    """
)

PROPERTY = COMMON + textwrap.dedent(
    """
    from hypothesis import given, settings, strategies as st
    from zoo.quant.layers import quantize_

    @st.composite
    def blocks(draw):
        heads = draw(st.sampled_from([2, 4]))
        head_dim = draw(st.sampled_from([8, 12, 16]))
        layout = draw(st.sampled_from(["pre", "post", "parallel"]))
        ffn = draw(st.sampled_from(["mlp", "swiglu", "geglu"]))
        act = draw(st.sampled_from(["gelu", "gelu_tanh", "relu", "silu"]))
        positions = draw(st.sampled_from(["learned", "rotary", "none"]))
        config = dict(
            n_layers=2, vocab_size=97, context_length=64, dropout=0.0,
            d_model=draw(st.sampled_from([24, 32, 40])), n_heads=heads, head_dim=head_dim,
            n_kv_heads=draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0])),
            d_ff=draw(st.sampled_from([20, 36, 64])), norm=draw(
                st.sampled_from(["layernorm", "rmsnorm", "rmsnorm1p"])),
            ffn=ffn, activation=act, bias=draw(st.booleans()),
            norm_first=layout != "post", parallel_residual=layout == "parallel",
            positions=positions,
            rotary_dim=draw(st.sampled_from([None, head_dim // 2]))
            if positions == "rotary" else None,
            final_norm=draw(st.booleans()), tie_embeddings=draw(st.booleans()),
            scale_embeddings=draw(st.booleans()),
        )
        return config, ffn == "mlp" and act == "relu"

    @settings(max_examples=30, deadline=None, derandomize=True)
    @given(blocks(), st.integers(0, 2**16), st.booleans())
    def fused_equals_per_module(drawn, seed, int8):
        config, exact = drawn
        torch.manual_seed(seed)
        model = zoo.build("gpt2-124m", **config).eval()
        with torch.no_grad():  # weights large enough that every branch matters
            for p in model.parameters():
                p.add_(torch.randn(p.shape) * 0.2)
        if int8:
            quantize_(model, "int8")
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 97, (1, 5), generator=g)
        steps = torch.randint(0, 97, (1, 6), generator=g)
        calls.clear()
        fast, fast_cache = decode(model, ids, steps)
        assert calls and all(calls), (config, calls)  # the one call ran at every step
        slow, slow_cache = decode(model, ids, steps, fused=False)
        assert same(fast, slow, exact), (config, int8, (fast - slow).abs().max())
        for a, b in zip(fast_cache.layers, slow_cache.layers):
            assert same(a.k[:, :, :11], b.k[:, :, :11], exact)
            assert same(a.v[:, :, :11], b.v[:, :, :11], exact)

    fused_equals_per_module()
    print("ok property")
    """
)


def test_the_block_step_equals_the_per_module_path():
    assert run_native(PROPERTY) == ["ok property"]


REFERENCE = COMMON + textwrap.dedent(
    """
    import transformers

    def parity(name, layout, hf_class, hf_config, **sizes):
        torch.manual_seed(0)
        config = getattr(transformers, hf_config)(**sizes)
        hf = getattr(transformers, hf_class)(config).eval()
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(torch.randn(p.shape) * 0.1)
        keymap = zoo.get_registry().architecture(zoo.resolve_config(name)[0].name)
        keymap = keymap.checkpoint_layout(layout)
        model = zoo.build(name, **keymap.config_from_foreign(config.to_dict())).eval()
        model.load_state_dict(keymap.to_zoo(hf.state_dict())[0])
        ids = torch.tensor([[5, 80, 3, 250, 17, 9]])
        with torch.no_grad():
            want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20,
                               do_sample=False, eos_token_id=None, pad_token_id=0,
                               output_logits=True, return_dict_in_generate=True)
        calls.clear()
        got = zoo.generate(model, ids, max_new_tokens=20, temperature=0)
        assert calls == [True] * 19, calls  # every step after the prompt in one call
        assert torch.equal(got, want.sequences), (got, want.sequences)
        assert len(set(got[0, 6:].tolist())) > 3
        steps = want.sequences[:, 6:-1]
        logits, _ = decode(model, ids, steps)
        theirs = torch.stack(want.logits[1:], 1)
        assert torch.allclose(logits, theirs, rtol=1e-4, atol=1e-4), (logits - theirs).abs().max()

    parity("gpt2-124m", "hf-gpt2", "GPT2LMHeadModel", "GPT2Config",
           n_embd=64, n_head=4, n_layer=2, n_positions=64, vocab_size=300)
    print("ok gpt2")
    parity("llama-tiny", "hf-llama", "LlamaForCausalLM", "LlamaConfig", hidden_size=64,
           num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
           intermediate_size=96, vocab_size=300, max_position_embeddings=64)
    print("ok llama")
    """
)


@pytest.mark.slow  # ~11 s: transformers' reference model decodes beside zoo's
def test_batch_one_decoding_equals_transformers_on_the_block_step():
    assert run_native(REFERENCE) == ["ok gpt2", "ok llama"]


DECLINES = COMMON + textwrap.dedent(
    """
    from zoo.nn.blocks import TransformerBlock

    def tiny(**overrides):
        torch.manual_seed(0)
        sizes = dict(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=97, dropout=0.0)
        return zoo.build("gpt2-124m", **{**sizes, **overrides}).eval()

    ids, steps = torch.tensor([[3, 1, 4, 1, 5]]), torch.tensor([[9, 2, 6, 5]])

    def check(model, fused_expected):
        calls.clear()
        fast, _ = decode(model, ids, steps)
        assert any(calls) == fused_expected, calls
        slow, _ = decode(model, ids, steps, fused=False)
        assert torch.allclose(fast, slow, rtol=1e-4, atol=1e-5)
        return fast

    # forward hooks on a module inside a block, or on a block: the one call would skip them
    model = tiny()
    seen = []
    handle = model.blocks[0].ffn.fc.register_forward_hook(lambda m, a, out: seen.append(1))
    check(model, fused_expected=False)
    assert len(seen) == 2 * 5, seen  # the hook ran at every step, in both runs
    handle.remove()
    check(model, fused_expected=True)
    handle = model.blocks[1].register_forward_pre_hook(lambda m, a: seen.append(2))
    check(model, fused_expected=False)
    assert seen.count(2) == 2 * 5, seen
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: None)
    check(model, fused_expected=False)
    handle.remove()
    check(model, fused_expected=True)
    print("ok hooks")

    # gradients recorded: the per-module path, with a graph
    model = tiny()
    native_block.decode = counted
    calls.clear()
    cache = KVCache(2, 1, 4, 16, 8, dtype=torch.float32, device=torch.device("cpu"))
    session_logits(model, ids, None, torch.arange(5)[None], cache=cache)
    out = session_logits(model, steps[:, :1], None, torch.tensor([[5]]), cache=cache)
    assert out.requires_grad and not any(calls), calls
    print("ok gradients")

    # dropout in training mode declines; eval runs fused
    model = tiny(dropout=0.1)
    model.train()
    calls.clear()
    torch.manual_seed(1)
    with torch.inference_mode():
        cache = KVCache(2, 1, 4, 16, 8, dtype=torch.float32, device=torch.device("cpu"))
        session_logits(model, ids, None, torch.arange(5)[None], cache=cache)
        session_logits(model, steps[:, :1], None, torch.tensor([[5]]), cache=cache)
    assert not any(calls), calls
    model.eval()
    check(model, fused_expected=True)
    print("ok training")

    # a subclass of TransformerBlock may compute otherwise: it is never fused
    class Doubled(TransformerBlock):
        def _residual(self, x, norm, branch):
            return super()._residual(x, norm, branch) * 2

    model = tiny()
    for block in model.blocks:
        block.__class__ = Doubled
    check(model, fused_expected=False)
    # ... unless it declares, in its own body, that its forward is TransformerBlock's
    class Renamed(TransformerBlock):
        same_forward = True

    class Inherits(Renamed):  # the declaration is not inherited: it may override forward
        pass

    for kind, fused in ((Renamed, True), (Inherits, False)):
        model = tiny()
        for block in model.blocks:
            block.__class__ = kind
        check(model, fused_expected=fused)
    print("ok subclass")

    # a DecoderLM that embeds otherwise (an embedding multiplier, as Granite's): the one call
    # would read tok_emb itself and decode as if the method were DecoderLM's
    from zoo.nn import DecoderLM

    class Scaled(DecoderLM):
        def embed(self, input_ids, position_ids):
            return super().embed(input_ids, position_ids) * 12.0

    plain = tiny()
    model = Scaled(plain.config, zoo.get_registry().parts(plain.config))
    model.load_state_dict(plain.state_dict())
    model.eval()
    scaled = check(model, fused_expected=False)
    assert not torch.allclose(scaled, check(plain, fused_expected=True), atol=1e-3)
    greedy = zoo.generate(model, ids, max_new_tokens=8, temperature=0.0)
    expected = ids
    with torch.no_grad():
        for _ in range(8):  # recomputation, no session
            expected = torch.cat([expected, model(expected)[:, -1:].argmax(-1)], 1)
    assert torch.equal(greedy, expected), (greedy, expected)
    # the same override set on an instance that has already decoded in one call
    check(plain, fused_expected=True)
    plain.embed = lambda ids, positions: DecoderLM.embed(plain, ids, positions) * 12.0
    assert torch.allclose(check(plain, fused_expected=False), scaled)
    print("ok embed")

    # plain torch.nn.Linear layers (a plugin's own): the same parameters and forward, fused
    model = tiny()
    for block in model.blocks:
        for owner in (block.attn, block.ffn):
            for name in ("qkv", "proj", "fc"):
                layer = getattr(owner, name, None)
                if layer is not None:
                    layer.__class__ = torch.nn.Linear
    check(model, fused_expected=True)
    print("ok torch linear")

    # a weight replaced, or changed in place, between steps: the next step reads it
    model = tiny()
    decode(model, ids, steps)
    block = model.blocks[1]
    block.ffn.fc.weight = torch.nn.Parameter(torch.randn_like(block.ffn.fc.weight))
    first = check(model, fused_expected=True)
    with torch.no_grad():
        block.attn.qkv.weight.data = torch.randn_like(block.attn.qkv.weight)
        block.ffn_norm.weight.mul_(3.0)
    second = check(model, fused_expected=True)
    assert not torch.allclose(first, second)
    print("ok weights")

    # a model that has decoded copies, pickles, and its copy decodes on its own weights
    import copy, io
    copied = copy.deepcopy(model)
    torch.save(model, io.BytesIO())
    with torch.no_grad():
        copied.blocks[0].ffn.proj.weight.mul_(-1.0)
    assert not torch.allclose(check(copied, fused_expected=True), second)
    assert torch.equal(check(model, fused_expected=True), second)
    print("ok copy")

    # a LoRA-wrapped linear is not one the kernel computes
    from zoo.adapters.lora import LoRA, attach_lora, plan_lora
    model = tiny()
    attach_lora(model, plan_lora(model, LoRA(rank=4, targets=("attn.qkv",))))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora" in name:
                p.normal_()
    check(model, fused_expected=False)
    print("ok lora")

    # int8 weights with a NaN reaching a product: the step declines, and the per-module
    # path gives NaN as the float layer would
    from zoo.quant.layers import quantize_
    model = tiny()
    quantize_(model, "int8")
    with torch.no_grad():
        model.blocks[0].attn_norm.weight[0] = float("nan")
    calls.clear()
    fast, _ = decode(model, ids, steps)
    assert not any(calls) and fast.isnan().all(), calls
    print("ok nan")
    """
)


def test_the_block_step_declines_where_it_would_differ():
    assert run_native(DECLINES) == [
        "ok hooks",
        "ok gradients",
        "ok training",
        "ok subclass",
        "ok embed",
        "ok torch linear",
        "ok weights",
        "ok copy",
        "ok lora",
        "ok nan",
    ]
