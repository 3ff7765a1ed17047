"""zoo's int8 kernels (zoo/kernels/_native_int8.c, zoo.kernels.native_int8) give FBGEMM's
numbers to the bit for any number of rows: torch.ao's dynamic int8 linear (FBGEMM, the weight
packed from the same int8 rows) against zoo's layer on the same inputs (random shapes with K
and N not multiples of 4, 8 or 32; one row, a few, and a prefill's many, each row at its own
scale so that the whole input's quantization differs from each row's; rows of any scale,
outliers, all-equal rows, zeros; with and without bias; weights at -128), on each instruction
set's variant; NaN and infinity left to FBGEMM, results independent of the thread count, rows
read again after ``load_state_dict`` or a change in place, the weights never packed for FBGEMM
(held once), and a tiny int8 GPT-2 decoding the same greedy tokens with and without the
kernels.

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

    import zoo
    from zoo.nn import Linear
    from zoo.quant import layers as quant
    from zoo.quant.layers import DynamicInt8Linear, dynamic_int8, quantize_
    from zoo.kernels.native_int8 import int8_linear
    from zoo.kernels.ops import fbgemm_int8

    def fbgemm(layer, x):  # torch.ao's dynamic linear on FBGEMM, its weight packed for the call
        return fbgemm_int8(x, layer.qweight, layer.scale, layer.bias)

    def same(layer, x):
        got = int8_linear(layer, x)
        assert got is not None, "the kernel declined a finite input"
        want = fbgemm(layer, x)
        assert got.shape == want.shape, (got.shape, want.shape)
        diff = (got - want).abs().max().item()
        assert torch.equal(got, want), f"differs by up to {diff}"

    def rows(kind, m, k, magnitude, seed):
        g = torch.Generator().manual_seed(seed)
        spread = torch.logspace(0, 2, m).view(m, 1) if m > 1 else 1.0  # rows at their own scales
        x = torch.randn(m, k, generator=g) * magnitude * spread
        if kind == "outlier":
            x[m // 2, seed % k] = 1000.0 * magnitude
        elif kind == "equal":
            x = torch.full((m, k), float(x[0, 0]))
        elif kind == "zeros":
            x = torch.zeros(m, k)
        elif kind == "positive":
            x = x.abs() + magnitude
        elif kind == "negative":
            x = -x.abs()
        return x

    shapes = st.tuples(st.integers(1, 200), st.integers(1, 70))
    counts = st.sampled_from([1, 2, 3, 5, 8, 9, 13])
    kinds = st.sampled_from(["plain", "outlier", "equal", "zeros", "positive", "negative"])
    magnitudes = st.sampled_from([1e-9, 1e-6, 3e-4, 0.01, 1.0, 7.5, 300.0, 1e5])

    @settings(max_examples=250, deadline=None, database=None, derandomize=True)
    @given(shapes, counts, kinds, magnitudes, st.booleans(), st.integers(0, 2**16))
    def zoo_layers(shape, m, kind, magnitude, bias, seed):
        k, n = shape
        torch.manual_seed(seed)
        layer = dynamic_int8(Linear(k, n, bias=bias))
        x = rows(kind, m, k, magnitude, seed)
        same(layer, x)
        same(layer, x.view(1, m, k))  # (B, T, K)

    @settings(max_examples=80, deadline=None, database=None, derandomize=True)
    @given(shapes, counts, kinds, st.booleans(), st.integers(0, 2**16))
    def extreme_weights(shape, m, kind, bias, seed):
        # int8 values over the whole range, -128 included, and scales of any size
        k, n = shape
        g = torch.Generator().manual_seed(seed)
        q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
        q[:, 0] = -128
        scale = torch.rand(n, generator=g) * 0.1 + 1e-4
        layer = DynamicInt8Linear(q, scale, torch.randn(n, generator=g) if bias else None)
        same(layer, rows(kind, m, k, 1.0, seed))

    zoo_layers()
    print("ok zoo layers")
    extreme_weights()
    print("ok extreme weights")

    for m, k, n in [(128, 768, 100), (67, 200, 37), (36, 3100, 9)]:  # a prefill's rows, tiled
        layer = dynamic_int8(Linear(k, n))
        same(layer, torch.randn(m, k) * 3)
    print("ok many rows")

    for k in (96, 99):  # the bad value among the eight-lane steps, and in the last few
        odd = dynamic_int8(Linear(k, 40))
        for bad in (float("nan"), float("inf"), float("-inf")):
            for m, where in ((3, 7), (3, k - 1), (1, k - 1), (200, k - 2)):
                x = torch.randn(m, k)
                x[m // 2, where] = bad
                assert int8_linear(odd, x) is None  # left to FBGEMM
                assert torch.equal(odd(x).isnan(), fbgemm(odd, x).isnan())
    layer = dynamic_int8(Linear(96, 40))
    assert bool(layer(torch.full((1, 96), float("nan"))).isnan().all())
    print("ok non-finite")

    x = torch.randn(1, 1, 96)
    big = dynamic_int8(Linear(96, 1000))
    several = torch.randn(2, 9, 96)
    torch.set_num_threads(1)
    one, many = int8_linear(big, x), int8_linear(big, several)
    torch.set_num_threads(2)
    assert torch.equal(one, int8_linear(big, x)) and torch.equal(one, fbgemm(big, x))
    assert torch.equal(many, int8_linear(big, several)) and torch.equal(many, fbgemm(big, several))
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

    other = dynamic_int8(Linear(96, 40))
    layer.load_state_dict(other.state_dict())  # new weights, copied in place: rows summed again
    same(layer, x)
    assert torch.equal(int8_linear(layer, x), fbgemm(other, x))
    third = dynamic_int8(Linear(96, 40))
    layer.qweight.copy_(third.qweight)  # changed in place: its version moved
    same(layer, several)
    print("ok new weight")

    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", n_layers=2, d_model=72, n_heads=4, d_ff=136, vocab_size=250)
    packed = torch.ops.quantized.linear_prepack
    def refuse(*args, **kwargs):
        raise AssertionError("the int8 weights were packed for FBGEMM: held twice")
    torch.ops.quantized.linear_prepack = refuse
    quantize_(model, "int8")
    assert model.head.qweight.data_ptr() == model.tok_emb.qweight.data_ptr()  # the tied rows
    ids = torch.tensor([[3, 17, 42, 9]])
    with torch.no_grad():
        fast = zoo.generate(model, ids, max_new_tokens=12, temperature=0)  # prefill, steps
        torch.ops.quantized.linear_prepack = packed
        quant.int8_linear = lambda layer, x: None  # FBGEMM everywhere
        slow = zoo.generate(model, ids, max_new_tokens=12, temperature=0)
    assert torch.equal(fast, slow), (fast, slow)
    print("ok greedy")
    """
)


@pytest.mark.slow  # ~20 s of fbgemm reference products over every shape
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_native_int8_kernels_give_fbgemm_numbers(isa):
    """Each instruction set's variant (``ZOO_NATIVE_ISA``; on a CPU without AVX-512 both runs
    take AVX2's, with a warning)."""
    assert run_native(CHILD, ZOO_NATIVE_ISA=isa) == [
        "ok zoo layers",
        "ok extreme weights",
        "ok many rows",
        "ok non-finite",
        "ok threads",
        "ok copies",
        "ok new weight",
        "ok greedy",
    ]
