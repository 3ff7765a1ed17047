"""zoo's one-row int8 kernel (zoo/kernels/_native_int8.c, zoo.kernels.native_int8) gives FBGEMM's
numbers to the bit: torch.ao's dynamic int8 linear against it on the same rows (random
shapes with K and N not multiples of 8 or 32, rows of any scale, outliers, all-equal rows,
zeros, with and without bias, weights at -128), NaN and infinity left to FBGEMM, results
independent of the thread count, rows read again after ``set_weight_bias``, and a tiny int8
GPT-2 decoding the same greedy tokens with and without the kernel.

The cases run in a child process (tests/native_child.py)."""

from __future__ import annotations

import textwrap

import pytest
from native_child import run_native

CHILD = textwrap.dedent(
    """
    import copy, gc, warnings
    import torch
    from hypothesis import given, settings, strategies as st
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    import zoo
    from zoo.nn import Linear
    from zoo.quant import layers as quant
    from zoo.quant.layers import dynamic_int8, quantize_
    from zoo.kernels.native_int8 import int8_linear

    def fbgemm(layer, x):
        return DynamicLinear.forward(layer, x)  # torch.ao's own forward (FBGEMM)

    def same(layer, x):
        got = int8_linear(layer, x)
        assert got is not None, "the kernel declined a finite row"
        want = fbgemm(layer, x)
        assert got.shape == want.shape, (got.shape, want.shape)
        diff = (got - want).abs().max().item()
        assert torch.equal(got, want), f"differs by up to {diff}"

    def row(kind, k, magnitude, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(1, k, generator=g) * magnitude
        if kind == "outlier":
            x[0, seed % k] = 1000.0 * magnitude
        elif kind == "equal":
            x = torch.full((1, k), float(x[0, 0]))
        elif kind == "zeros":
            x = torch.zeros(1, k)
        elif kind == "positive":
            x = x.abs() + magnitude
        elif kind == "negative":
            x = -x.abs()
        return x

    shapes = st.tuples(st.integers(1, 200), st.integers(1, 70))
    kinds = st.sampled_from(["plain", "outlier", "equal", "zeros", "positive", "negative"])
    magnitudes = st.sampled_from([1e-9, 1e-6, 3e-4, 0.01, 1.0, 7.5, 300.0, 1e5])

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(shapes, kinds, magnitudes, st.booleans(), st.integers(0, 2**16))
    def zoo_layers(shape, kind, magnitude, bias, seed):
        k, n = shape
        torch.manual_seed(seed)
        layer = dynamic_int8(Linear(k, n, bias=bias))  # rows attached at quantize time
        x = row(kind, k, magnitude, seed)
        same(layer, x)
        same(layer, x.view(1, 1, k))  # (B, T, K) with one row

    @settings(max_examples=100, deadline=None, database=None, derandomize=True)
    @given(shapes, kinds, st.booleans(), st.integers(0, 2**16))
    def torch_layers(shape, kind, bias, seed):
        # a plain torch.ao layer (rows read from its packed weight), int8 values at -128
        k, n = shape
        g = torch.Generator().manual_seed(seed)
        q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
        q[:, 0] = -128
        scale = torch.rand(n, generator=g, dtype=torch.float64) * 0.1 + 1e-4
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            zero = torch.zeros(n, dtype=torch.long)
            weight = torch._make_per_channel_quantized_tensor(q, scale, zero, 0)
        layer = quant._dynamic_linear()(k, n, dtype=torch.qint8)
        layer.set_weight_bias(weight, torch.randn(n, generator=g) if bias else None)
        same(layer, row(kind, k, 1.0, seed))

    zoo_layers()
    print("ok zoo layers")
    torch_layers()
    print("ok torch layers")

    layer = dynamic_int8(Linear(96, 40))
    for bad in (float("nan"), float("inf"), float("-inf")):
        x = torch.randn(1, 96)
        x[0, 7] = bad
        assert int8_linear(layer, x) is None  # left to FBGEMM
    assert bool(layer(torch.full((1, 96), float("nan"))).isnan().all())
    print("ok non-finite")

    x = torch.randn(1, 1, 96)
    big = dynamic_int8(Linear(96, 1000))
    torch.set_num_threads(1)
    one = int8_linear(big, x)
    torch.set_num_threads(2)
    assert torch.equal(one, int8_linear(big, x)) and torch.equal(one, fbgemm(big, x))
    print("ok threads")

    source = dynamic_int8(Linear(96, 40))
    int8_linear(source, x)
    copied = copy.deepcopy(source)  # reads its own rows: none of the original's addresses
    del source
    gc.collect()
    same(copied, x)
    long = dynamic_int8(Linear(3100, 37))  # gpt2's widths and more: int32 sums stay exact
    same(long, torch.randn(1, 3100) * 4)
    print("ok copies")

    other = dynamic_int8(Linear(96, 40, bias=False))
    layer.set_weight_bias(other.weight(), None)  # a new weight: rows read again
    same(layer, x)
    assert torch.equal(int8_linear(layer, x), fbgemm(other, x))
    print("ok new weight")

    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", n_layers=2, d_model=72, n_heads=4, d_ff=136, vocab_size=250)
    quantize_(model, "int8")
    head_rows = model.head._zoo_int8_rows.q  # the tied head's rows are the embedding's
    assert head_rows.data_ptr() == model.tok_emb.qweight.data_ptr()
    ids = torch.tensor([[3, 17, 42, 9]])
    with torch.no_grad():
        fast = zoo.generate(model, ids, max_new_tokens=12, temperature=0)
        quant.int8_linear = lambda layer, x: None  # FBGEMM everywhere
        slow = zoo.generate(model, ids, max_new_tokens=12, temperature=0)
    assert torch.equal(fast, slow), (fast, slow)
    print("ok greedy")
    """
)


@pytest.mark.slow  # ~14 s of fbgemm reference products over every shape
def test_native_int8_kernel_gives_fbgemm_numbers():
    assert run_native(CHILD) == [
        "ok zoo layers",
        "ok torch layers",
        "ok non-finite",
        "ok threads",
        "ok copies",
        "ok new weight",
        "ok greedy",
    ]
