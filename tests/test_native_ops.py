"""zoo's one-row norm and attention kernels (zoo/kernels/_native.c, zoo.kernels.native) against
PyTorch's on the same inputs: ``layer_norm`` against ``F.layer_norm``, ``rms_norm`` against
zoo's RMSNorm formulas, and ``attend_one`` against ``LayerCache.write`` plus
``scaled_dot_product_attention`` (grouped-query heads, head sizes that are not multiples of
eight, long caches, saturated scores), with the cache written at the same place; the cases
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
        y = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)  # (1, H, 1, hd)
        return y.transpose(1, 2).reshape(1, 1, -1), ck, cv

    @settings(max_examples=120, deadline=None, derandomize=True)
    @given(st.sampled_from([(1, 1), (4, 4), (4, 2), (8, 1), (12, 12)]),
           st.sampled_from([1, 7, 20, 64, 80]), st.integers(0, 299),
           st.sampled_from([0.1, 1.0, 30.0]), st.integers(0, 99))
    def attention(heads, hd, start, scale, seed):
        h, h_kv = heads
        g = torch.Generator().manual_seed(seed)
        qkv = torch.randn(1, 1, (h + 2 * h_kv) * hd, generator=g) * scale  # a fused projection
        q, k, v = qkv.split((h * hd, h_kv * hd, h_kv * hd), dim=-1)
        q = q.view(1, 1, h, hd).transpose(1, 2)  # (1, H, 1, hd) views of the row
        k, v = (t.view(1, 1, h_kv, hd).transpose(1, 2) for t in (k, v))
        ck, cv = (torch.randn(1, h_kv, 300, hd, generator=g) for _ in range(2))
        want, want_k, want_v = reference(q, k, v, ck, cv, start)
        got = native.attend_one(q, k, v, ck, cv, start, hd**-0.5)
        assert got is not None
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(ck, want_k) and torch.equal(cv, want_v)  # the same cache written

    attention()
    print("ok attention")

    q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    ck, cv = torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8)
    declined = [
        native.attend_one(q, k, v, ck, cv, 5, 1.0),  # past the cache
        native.attend_one(q.double(), k, v, ck, cv, 0, 1.0),
        native.attend_one(torch.randn(1, 4, 2, 8), k, v, ck, cv, 0, 1.0),  # two queries
        native.attend_one(q, k, v, ck.transpose(2, 3).contiguous().transpose(2, 3), cv, 0, 1.0),
        native.attend_one(torch.randn(1, 3, 1, 8), k, v, ck, cv, 0, 1.0),  # 3 heads on 2
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
