"""zoo's one-row norm and attention kernels (zoo/kernels/_native.c, zoo.kernels.native) against
PyTorch's on the same inputs: ``layer_norm`` against ``F.layer_norm``, ``rms_norm`` against
zoo's RMSNorm formulas, ``attend_one`` against ``LayerCache.write`` plus
``scaled_dot_product_attention`` (grouped-query heads, head sizes that are not multiples of
eight, long caches, saturated scores, one to three sequences, each with its bits alone), with
the cache written at the same place, and ``attend_memory`` (cross-attention, with and without
a key padding mask) against ``scaled_dot_product_attention``; the cases
they must decline; gradients still flowing where autograd records; and a tiny GPT-2 and a
tiny grouped-query Llama decoding the same greedy tokens with and without the kernels, which
must really run (on the per-module path: the one-call block step, which would otherwise take
these steps, is tested in tests/test_native_block.py).

Everything runs in one child process, which the test asserts on: a crash in the C code is a
failed test, not a dead test run."""

from __future__ import annotations

import textwrap

from native_child import run_native

CHILD = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from hypothesis import given, settings, strategies as st

    import zoo
    from zoo.kernels import native
    from zoo.runtime import native_block
    from zoo.runtime.cache import LayerCache
    from zoo.nn.norms import LayerNorm, RMSNorm, UnitOffsetRMSNorm

    def rows(seed, d, scale, shift):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(1, 1, d, generator=g) * scale + shift, g

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.integers(1, 2100), st.sampled_from([1e-3, 1.0, 300.0]), st.floats(-5, 5),
           st.booleans(), st.booleans(), st.integers(0, 99))
    def layer_norms(d, scale, shift, weight, bias, seed):
        x, g = rows(seed, d, scale, shift)
        w = torch.randn(d, generator=g) if weight else None
        b = torch.randn(d, generator=g) if bias else None
        got = native.layer_norm(x, w, b, 1e-5)
        assert got is not None and got.shape == x.shape
        exact = F.layer_norm(x.double(), (d,), *(t if t is None else t.double() for t in (w, b)),
                             1e-5)
        ours = (got - exact).abs().max().item()
        theirs = (F.layer_norm(x, (d,), w, b, 1e-5) - exact).abs().max().item()
        assert ours <= 2 * theirs + 1e-5, (ours, theirs)  # as close to float64 as PyTorch's

    layer_norms()
    x = torch.full((1, 300), 0.1)  # no variance: the bias alone, as PyTorch's gives it
    torch.testing.assert_close(native.layer_norm(x, None, None, 1e-5), torch.zeros(1, 300),
                               rtol=0, atol=1e-3)
    print("ok layer norm")

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.integers(1, 2100), st.sampled_from([1e-3, 1.0, 300.0]), st.integers(0, 99))
    def rms_norms(d, scale, seed):
        x, g = rows(seed, d, scale, 0.0)
        for norm in (RMSNorm(d, eps=1e-6), UnitOffsetRMSNorm(d, eps=1e-6)):
            with torch.no_grad():
                norm.weight.normal_(generator=g)
                got = norm(x)
                native._library, kept = (lambda: None), native._library  # PyTorch's formula
                try:
                    want = norm(x)
                finally:
                    native._library = kept
            torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)

    rms_norms()
    print("ok rms norm")

    def reference(q, k, v, ck, cv, start):
        ck, cv = ck.clone(), cv.clone()
        keys, values = LayerCache(ck, cv).write(start, k, v)
        y = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)  # (B, H, 1, hd)
        return y.transpose(1, 2).reshape(q.shape[0], 1, -1), ck, cv

    @settings(max_examples=120, deadline=None, derandomize=True)
    @given(st.sampled_from([(1, 1), (4, 4), (4, 2), (8, 1), (12, 12)]),
           st.sampled_from([1, 7, 20, 64, 80]), st.integers(0, 299),
           st.sampled_from([0.1, 1.0, 30.0]), st.integers(0, 99), st.integers(1, 3))
    def attention(heads, hd, start, scale, seed, b):
        h, h_kv = heads
        g = torch.Generator().manual_seed(seed)
        qkv = torch.randn(b, 1, (h + 2 * h_kv) * hd, generator=g) * scale  # a fused projection
        q, k, v = qkv.split((h * hd, h_kv * hd, h_kv * hd), dim=-1)
        q = q.view(b, 1, h, hd).transpose(1, 2)  # (B, H, 1, hd) views of the rows
        k, v = (t.view(b, 1, h_kv, hd).transpose(1, 2) for t in (k, v))
        ck, cv = (torch.randn(b, h_kv, 300, hd, generator=g) for _ in range(2))
        want, want_k, want_v = reference(q, k, v, ck, cv, start)
        alone = [native.attend_one(q[i : i + 1], k[i : i + 1], v[i : i + 1], ck[i : i + 1].clone(),
                                   cv[i : i + 1].clone(), start, hd**-0.5) for i in range(b)]
        got = native.attend_one(q, k, v, ck, cv, start, hd**-0.5)
        assert got is not None and got.shape == (b, 1, h * hd)
        # the outputs are averages of values of about `scale`: their rounding scales with it
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)
        assert torch.equal(ck, want_k) and torch.equal(cv, want_v)  # the same cache written
        assert torch.equal(got, torch.cat(alone))  # each sequence's bits, as alone

    @settings(max_examples=120, deadline=None, derandomize=True)
    @given(st.sampled_from([(1, 1), (4, 4), (4, 2), (8, 1), (12, 12)]),
           st.sampled_from([1, 7, 20, 64, 80]), st.integers(1, 80),
           st.sampled_from([0.1, 1.0, 30.0]), st.integers(0, 99), st.integers(1, 4),
           st.booleans())
    def memory_attention(heads, hd, length, scale, seed, b, padded):
        # cross-attention: keys and values of one (B, S, 2 * H_kv * hd) projection, as
        # MultiHeadAttention.memory_kv makes them; a key padding mask of each row's length
        h, h_kv = heads
        g = torch.Generator().manual_seed(seed)
        q = (torch.randn(b, 1, h * hd, generator=g) * scale).view(b, 1, h, hd).transpose(1, 2)
        kv = torch.randn(b, length, 2 * h_kv * hd, generator=g) * scale
        k, v = (t.view(b, length, h_kv, hd).transpose(1, 2) for t in kv.split(h_kv * hd, -1))
        lengths = torch.randint(1, length + 1, (b,), generator=g)
        keep = (torch.arange(length) < lengths[:, None]) if padded else None  # (B, S)
        mask = None if keep is None else keep[:, None, None, :]

        def sdpa(*tensors):
            y = F.scaled_dot_product_attention(*tensors, attn_mask=mask, enable_gqa=True)
            return y.transpose(1, 2).reshape(b, 1, h * hd)

        got = native.attend_memory(q, k, v, keep, hd**-0.5)
        assert got is not None and got.shape == (b, 1, h * hd)
        exact = sdpa(q.double(), k.double(), v.double())
        # float32 scores are off by up to hd roundings of sum |q_i k_i| * scale each, which
        # moves each softmax weight by about twice that (relative) and the output by that
        # times the largest value: saturated scores (scale 30) make every float32 attention
        # (SDPA's math backend too) miss float64 by far more than 1e-5
        keys = k.double().abs().repeat_interleave(h // h_kv, dim=1)  # (B, H, S, hd)
        sums = (q.double().abs() @ keys.transpose(-1, -2)).max().item() * hd**-0.5
        bound = 4 * hd * 2.0**-24 * sums * v.abs().max().item() + 1e-5
        assert (got - exact).abs().max().item() <= bound

    attention()
    memory_attention()
    print("ok attention")

    q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    ck, cv = torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8)
    declined = [
        native.attend_one(q, k, v, ck, cv, 5, 1.0),  # past the cache
        native.attend_one(q.double(), k, v, ck, cv, 0, 1.0),
        native.attend_one(torch.randn(1, 4, 2, 8), k, v, ck, cv, 0, 1.0),  # two queries
        native.attend_one(q, k, v, ck.transpose(2, 3).contiguous().transpose(2, 3), cv, 0, 1.0),
        native.attend_one(torch.randn(1, 3, 1, 8), k, v, ck, cv, 0, 1.0),  # 3 heads on 2
        native.attend_one(torch.randn(2, 4, 1, 8), k, v, ck, cv, 0, 1.0),  # 2 queries, 1 cache
        native.attend_memory(q, ck, cv, torch.ones(1, 4, dtype=torch.bool), 1.0),  # 4 keys of 5
        native.attend_memory(q, ck, cv, torch.ones(1, 5), 1.0),  # a float mask
        native.attend_memory(q, ck, cv.transpose(2, 3).contiguous().transpose(2, 3), None, 1.0),
        native.attend_memory(torch.randn(1, 4, 2, 8), ck, cv, None, 1.0),  # two queries
        native.attend_memory(q.double(), ck.double(), cv.double(), None, 1.0),
        native.layer_norm(torch.randn(2, 8), None, None, 1e-5),  # two rows
        native.layer_norm(torch.randn(1, 8), torch.ones(7), None, 1e-5),
        native.rms_norm(torch.randn(1, 8).t(), torch.ones(1), 1e-5),  # not contiguous
        native.rms_norm(torch.randn(1, 8, dtype=torch.bfloat16), torch.ones(8), 1e-5),
    ]
    assert all(d is None for d in declined), declined
    assert not ck.any() and not cv.any()  # nothing written by a declined call
    print("ok declines")

    norm = LayerNorm(16)
    x = torch.randn(1, 16, requires_grad=True)
    norm(x).square().sum().backward()  # autograd records: PyTorch's layer norm, with gradients
    assert x.grad is not None and norm.weight.grad is not None
    print("ok gradients")

    def greedy(name, **sizes):
        torch.manual_seed(0)
        model = zoo.build(name, dropout=0.0, **sizes).eval()
        ids = torch.tensor([[3, 17, 42, 9, 100]])
        calls = []
        kept = {f: getattr(native, f) for f in ("attend_one", "layer_norm", "rms_norm")}
        for f, kernel in kept.items():
            def counted(*args, _f=f, _kernel=kernel):
                out = _kernel(*args)
                calls.append((_f, out is not None))
                return out
            setattr(native, f, counted)
        one_call, native_block.decode = native_block.decode, lambda *args: None  # per module
        with torch.no_grad():
            fast = zoo.generate(model, ids, max_new_tokens=16, temperature=0)
            native._library, kept_library = (lambda: None), native._library
            slow = zoo.generate(model, ids, max_new_tokens=16, temperature=0)
            native._library = kept_library
        native_block.decode = one_call
        assert torch.equal(fast, slow), (name, fast, slow)
        ran = {f for f, used in calls if used}
        return ran

    ran = greedy("gpt2-124m", n_layers=2, d_model=64, n_heads=4, d_ff=128, vocab_size=300)
    assert ran == {"attend_one", "layer_norm"}, ran
    ran = greedy("llama-tiny")
    assert ran == {"attend_one", "rms_norm"}, ran
    print("ok greedy")
    """
)


def test_native_norms_and_attention_give_pytorchs_numbers():
    assert run_native(CHILD) == [
        "ok layer norm",
        "ok rms norm",
        "ok attention",
        "ok declines",
        "ok gradients",
        "ok greedy",
    ]
