"""zoo's C kernels as the custom operators ``torch.ops.zoo.*`` (:mod:`zoo.kernels.ops`), called
under ``torch.compile``.

- A compiled one-row step through zoo's norms (LayerNorm, RMSNorm, Gemma's RMSNorm), the row
  product (:func:`zoo.kernels.native.linear`) and the attention of one new token over a
  grouped-query cache (:func:`zoo.kernels.native.attend_one`), traced with ``fullgraph=True``
  (no graph break), gives eager's numbers to the bit, writes the same cache, and runs the C
  kernels at every call (their ctypes functions counted); two rows, or no kernels, compile
  to PyTorch's ops (no ``zoo`` operator in the traced graph).
- A tiny GPT-2 and a tiny grouped-query Llama compiled whole (``model.logits``, one token a
  step over a KV cache) run the same kernels as many times as eager decoding and give its
  logits and caches (to float32 rounding: the compiled code around the kernels rounds in
  its own order).
- A compiled int8 layer gives FBGEMM's numbers to the bit on zoo's int8 kernel, FBGEMM's
  answer to a row holding infinity or NaN, and traces again for a weight set after
  compiling (once an eager call has read its rows).
- A tensor subclass handed to each operator (``TwoTensor``, which the dispatcher splits into
  its halves, and a bare subclass the operator itself is handed) does not crash and gives
  PyTorch's numbers; so does every layout the kernels decline.
- ``torch.library.opcheck`` passes on each operator, on inputs the kernel takes and on inputs
  it leaves to PyTorch.

Each test runs in a child process (tests/native_child.py): a crash in C fails the test, not
the run; it skips where the kernels do not run."""

from __future__ import annotations

import textwrap

import pytest
from native_child import run_native

#: Counts each call of a C kernel: the ctypes functions of the library the operators call.
COUNTER = textwrap.dedent(
    """
    import collections
    import torch
    from zoo.kernels import native

    calls = collections.Counter()
    _lib = native._library()
    for _name in ("zoo_gemv_f32", "zoo_layer_norm_f32", "zoo_rms_norm_f32",
                  "zoo_attend_rows_f32", "zoo_linear_int8"):
        def _counted(*args, _kernel=getattr(_lib, _name), _name=_name):
            calls[_name] += 1
            return _kernel(*args)
        setattr(_lib, _name, _counted)

    def zoo_ops(fn, *args):
        # the zoo operators in the graph dynamo traces for fn(*args) (fullgraph, no compile)
        seen = []
        def backend(gm, example_inputs):
            seen.extend(str(n.target) for n in gm.graph.nodes if "zoo." in str(n.target))
            return gm.forward
        torch._dynamo.reset()
        torch.compile(fn, backend=backend, fullgraph=True)(*args)
        return seen
    """
)

STEP = COUNTER + textwrap.dedent(
    """
    import copy
    import torch.nn.functional as F
    from zoo.nn.norms import LayerNorm, RMSNorm, UnitOffsetRMSNorm

    class Step(torch.nn.Module):
        # one row through zoo's norms, a row product, and one token's attention (4 heads
        # on 2 key/value heads, head size 12) that writes the caches
        def __init__(self):
            super().__init__()
            self.norms = torch.nn.Sequential(LayerNorm(48), RMSNorm(48), UnitOffsetRMSNorm(48))
            self.qkv = torch.nn.Parameter(torch.randn(96, 48) / 7)
            self.bias = torch.nn.Parameter(torch.randn(96))

        def forward(self, x, cache_k, cache_v, start):
            h = self.norms(x)
            qkv = native.linear(h, self.qkv, self.bias)
            if qkv is None:  # more rows than the kernel takes: PyTorch's product
                return h, F.linear(h, self.qkv, self.bias)
            q, k, v = qkv.split((48, 24, 24), dim=-1)
            q = q.view(1, 1, 4, 12).transpose(1, 2)
            k, v = (t.view(1, 1, 2, 12).transpose(1, 2) for t in (k, v))
            return h, native.attend_one(q, k, v, cache_k, cache_v, start, 12**-0.5)

    torch.manual_seed(0)
    step = Step().eval()
    for norm in step.norms:
        torch.nn.init.normal_(norm.weight)
    compiled = torch.compile(step, fullgraph=True)  # one graph, no break, or it raises
    caches = {"eager": torch.randn(2, 1, 2, 9, 12), "compiled": None}
    caches["compiled"] = caches["eager"].clone()
    per_step = {"zoo_layer_norm_f32": 1, "zoo_rms_norm_f32": 2, "zoo_gemv_f32": 1,
                "zoo_attend_rows_f32": 1}
    with torch.no_grad():
        for start in (0, 1, 2, 5, 8):
            x = torch.randn(1, 1, 48)
            calls.clear()
            want = step(x, *caches["eager"], start)
            assert dict(calls) == per_step, calls
            calls.clear()
            got = compiled(x, *caches["compiled"], start)
            assert dict(calls) == per_step, calls  # the kernels ran in the compiled code
            assert all(torch.equal(a, b) for a, b in zip(got, want)), start
            assert torch.equal(caches["compiled"], caches["eager"]), start  # the same writes
    print("ok compiled step")

    from zoo.kernels.ops import FEW_ROWS

    x = torch.randn(FEW_ROWS + 1, 1, 48)  # more rows than the kernels take: PyTorch's ops
    calls.clear()
    with torch.no_grad():
        got, want = compiled(x, *caches["compiled"], 0), step(x, *caches["eager"], 0)
    assert not calls, calls
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        one = torch.randn(1, 1, 48)
        assert zoo_ops(step, one, *caches["eager"], 3) == [
            "zoo.layer_norm", "zoo.rms_norm", "zoo.rms_norm", "zoo.gemv_f32", "zoo.attend_one"]
        assert zoo_ops(step, x, *caches["eager"], 3) == []
        wide = copy.deepcopy(step).double()  # float64: PyTorch's ops
        assert zoo_ops(wide, one.double(), *caches["eager"].double(), 3) == []
        assert zoo_ops(step, one, *caches["eager"], 9) == [  # past the cache: SDPA's
            "zoo.layer_norm", "zoo.rms_norm", "zoo.rms_norm", "zoo.gemv_f32"]
        native._library, kept = (lambda: None), native._library  # no kernels here
        try:
            assert zoo_ops(step, one, *caches["eager"], 3) == []
        finally:
            native._library = kept
    print("ok declines")
    """
)


def test_a_compiled_step_runs_the_kernels_and_gives_eagers_numbers():
    assert run_native(STEP) == ["ok compiled step", "ok declines"]


MODELS = COUNTER + textwrap.dedent(
    """
    import zoo
    from zoo.kernels.onednn import prepare_compile
    from zoo.runtime.cache import KVCache

    prepare_compile()  # as zoo does where it compiles (oneDNN's checks as constants)

    def decode(model, logits):
        attn = model.blocks[0].attn
        cache = KVCache(len(model.blocks), 1, attn.n_kv_heads, 12, attn.head_dim,
                        dtype=torch.float32, device=torch.device("cpu"))
        with torch.no_grad():
            model.logits(torch.tensor([[3, 17, 42, 9]]), None, torch.arange(4)[None],
                         cache=cache)
            calls.clear()
            out = [logits(torch.tensor([[t]]), None, torch.tensor([[cache.length]]),
                          cache=cache) for t in (7, 1, 99)]
        filled = [(layer.k[:, :, :7], layer.v[:, :, :7]) for layer in cache.layers]
        return torch.cat(out, 1), filled, dict(calls)

    for name, sizes in (
        ("gpt2-124m", dict(n_layers=2, d_model=64, n_heads=4, d_ff=128, vocab_size=300)),
        ("llama-tiny", {}),
    ):
        torch.manual_seed(0)
        model = zoo.build(name, dropout=0.0, **sizes).eval()
        want, want_cache, eager_calls = decode(model, model.logits)
        got, got_cache, compiled_calls = decode(model, torch.compile(model.logits,
                                                                     fullgraph=True))
        assert compiled_calls == eager_calls and eager_calls, (compiled_calls, eager_calls)
        assert eager_calls.get("zoo_attend_rows_f32") == 3 * len(model.blocks), eager_calls
        # the compiled code around the kernels (projections, activations, rotary positions)
        # rounds in its own order: the last bits may differ
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for pair in zip(got_cache, want_cache):
            for a, b in zip(*pair):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        print("ok", name)
    """
)


@pytest.mark.slow  # two models compiled whole: ~40 s on a loaded 2-core machine
def test_compiled_models_run_the_kernels_and_give_eagers_logits():
    assert run_native(MODELS) == ["ok gpt2-124m", "ok llama-tiny"]


INT8 = COUNTER + textwrap.dedent(
    """
    from zoo.nn import Linear
    from zoo.quant.layers import dynamic_int8
    from zoo.kernels.ops import fbgemm_int8

    def fbgemm(layer, x):
        return fbgemm_int8(x, layer.qweight, layer.scale, layer.bias)

    torch.manual_seed(0)
    layer = dynamic_int8(Linear(96, 40))
    compiled = torch.compile(layer, fullgraph=True)
    with torch.no_grad():
        for rows in (1, 1, 5, 5, 1):
            x = torch.randn(1, rows, 96) * 3
            calls.clear()
            got = compiled(x)
            assert calls == {"zoo_linear_int8": 1}, calls
            assert torch.equal(got, fbgemm(layer, x))  # FBGEMM's, to the bit
        print("ok int8")
        for bad in (float("inf"), float("nan")):
            x = torch.randn(1, 1, 96)
            x[0, 0, 5] = bad
            got, want = compiled(x), layer(x)  # the layer's answer: FBGEMM's
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got.nan_to_num(), want.nan_to_num())
        print("ok non-finite")
        other = dynamic_int8(Linear(96, 40, bias=False))
        layer.load_state_dict(other.state_dict(), strict=False)  # new weights, in place
        x = torch.randn(1, 1, 96)
        # the eager call and the compiled layer both compute from the new weights' rows
        assert torch.equal(layer(x), fbgemm(layer, x))
        calls.clear()
        assert torch.equal(compiled(x), fbgemm(layer, x))
        assert calls == {"zoo_linear_int8": 1}, calls
        print("ok new weight")
    """
)


def test_a_compiled_int8_layer_gives_fbgemms_numbers_on_the_kernel():
    assert run_native(INT8) == ["ok int8", "ok non-finite", "ok new weight"]


SUBCLASSES = COUNTER + textwrap.dedent(
    """
    import torch.nn.functional as F
    from torch.testing._internal.two_tensor import TwoTensor
    from zoo.nn import Linear
    from zoo.quant.layers import dynamic_int8
    from zoo.kernels.ops import FEW_ROWS, fbgemm_int8

    class Bare(torch.Tensor):  # a subclass the operator itself is handed (no dispatch of its own)
        pass

    def two(t):
        return TwoTensor(t.clone(), t.clone())

    def bare(t):
        return t.clone().as_subclass(Bare)

    ops = torch.ops.zoo
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(1, 1, 32, generator=g), torch.randn(32, generator=g), torch.randn(32)
    weight = torch.randn(20, 32, generator=g)

    def rms(x, w, eps, offset):  # zoo.nn.RMSNorm's and UnitOffsetRMSNorm's formulas
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        if offset == 0.0:
            return w * h.to(x.dtype)
        return (h * (offset + w.float())).to(x.dtype)

    cases = [
        (ops.gemv_f32, (x, weight, b[:20]), F.linear),
        (ops.layer_norm, (x, w, b, 1e-5), lambda x, w, b, eps: F.layer_norm(x, (32,), w, b, eps)),
        (ops.rms_norm, (x, w, 1e-6, 0.0), rms),
        (ops.rms_norm, (x, w, 1e-6, 1.0), rms),
    ]
    for op, args, torch_op in cases:
        kernel = op(*args)
        pytorch = torch_op(*args)
        torch.testing.assert_close(kernel, pytorch, rtol=1e-5, atol=1e-5)
        for i, t in enumerate(args):
            if not isinstance(t, torch.Tensor):
                continue
            for wrap in (two, bare):
                wrapped = list(args)
                wrapped[i] = wrap(t)
                calls.clear()
                got = op(*wrapped)
                if wrap is two:  # each half through the operator: the kernel's numbers
                    assert calls and torch.equal(got.a, kernel) and torch.equal(got.b, kernel)
                else:  # the operator handed the subclass itself: PyTorch's, not C
                    assert not calls and torch.equal(got, pytorch), (op, i)
                    assert torch.equal(got, torch_op(*wrapped))
        # every layout the kernel declines: PyTorch's numbers, no C
        calls.clear()
        assert torch.equal(op(*(t.double() if isinstance(t, torch.Tensor) else t
                                for t in args)),
                           torch_op(*(t.double() if isinstance(t, torch.Tensor) else t
                                      for t in args)))
        many = (torch.randn(FEW_ROWS + 1, 32, generator=g),) + tuple(args[1:])  # too many rows
        assert torch.equal(op(*many), torch_op(*many))
        assert not calls, calls
    print("ok rows")

    def reference(q, k, v, ck, cv, start, scale):
        ck.narrow(2, start, 1).copy_(k)
        cv.narrow(2, start, 1).copy_(v)
        y = F.scaled_dot_product_attention(q, ck[:, :, :start + 1], cv[:, :, :start + 1],
                                           scale=scale, enable_gqa=True)
        return y.transpose(1, 2).reshape(1, 1, -1)

    q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    caches = torch.randn(2, 1, 2, 6, 8)
    start = 3
    c = caches.clone()
    kernel = ops.attend_one(q, k, v, c[0], c[1], start, 0.3)
    r = caches.clone()
    pytorch = reference(q, k, v, r[0], r[1], start, 0.3)
    torch.testing.assert_close(kernel, pytorch, rtol=1e-5, atol=1e-5)
    assert torch.equal(c, r)
    for i in range(5):
        for wrap in (two, bare):
            args = [q, k, v, caches[0].clone(), caches[1].clone()]
            args[i] = wrap(args[i])
            calls.clear()
            got = ops.attend_one(*args, start, 0.3)
            written = [getattr(t, "a", t) for t in args[3:]]
            assert torch.equal(written[0], r[0]) and torch.equal(written[1], r[1]), (i, wrap)
            if wrap is two:
                assert calls and torch.equal(got.a, kernel) and torch.equal(got.b, kernel)
            else:
                assert not calls and torch.equal(got, pytorch), i
    c = caches.clone()
    t_cache = c.transpose(3, 4).contiguous().transpose(3, 4)  # not one block: PyTorch's
    t_ref = t_cache.transpose(3, 4).clone().transpose(3, 4)  # the same layout
    calls.clear()
    got = ops.attend_one(q, k, v, t_cache[0], t_cache[1], start, 0.3)
    assert not calls
    assert torch.equal(got, reference(q, k, v, t_ref[0], t_ref[1], start, 0.3))
    assert torch.equal(t_cache, r)
    for bad in ((q, k, v, c[0], c[1], 6, 0.3), (q[:, :3], k, v, c[0], c[1], 0, 0.3)):
        try:
            ops.attend_one(*bad)
        except ValueError as error:
            assert "zoo::attend_one" in str(error), error
        else:
            raise AssertionError("accepted a position or shape it cannot write")
    print("ok attention")

    layer = dynamic_int8(Linear(32, 20))
    rows = layer._zoo_int8_rows
    for x in (torch.randn(1, 1, 32), torch.randn(3, 32)):
        fbgemm = fbgemm_int8(x, rows.q, rows.scale, rows.bias)
        parts = (x, rows.q, rows.scale, rows.colsum, rows.bias)
        assert torch.equal(ops.linear_int8(*parts), fbgemm)
        for i in range(5):
            for wrap in (two, bare):
                wrapped = list(parts)
                wrapped[i] = wrap(parts[i])
                got = ops.linear_int8(*wrapped)
                assert torch.equal(getattr(got, "a", got), fbgemm), (i, wrap)
    print("ok int8")
    """
)


def test_a_subclass_or_a_declined_layout_gets_pytorchs_numbers_from_each_operator():
    assert run_native(SUBCLASSES) == ["ok rows", "ok attention", "ok int8"]


OPCHECK = COUNTER + textwrap.dedent(
    """
    from zoo.nn import Linear
    from zoo.quant.layers import dynamic_int8

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(1, 1, 24, generator=g), torch.randn(24, generator=g), torch.randn(24)
    several = torch.randn(3, 24, generator=g)
    weight = torch.randn(16, 24, generator=g)
    q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    layer = dynamic_int8(Linear(24, 16))
    rows = layer._zoo_int8_rows
    ops = torch.ops.zoo
    samples = [
        (ops.gemv_f32.default, (x, weight, b[:16])),
        (ops.gemv_f32.default, (several, weight, None)),
        (ops.layer_norm.default, (x, w, b, 1e-5)),
        (ops.layer_norm.default, (several, None, None, 1e-5)),
        (ops.rms_norm.default, (x, w, 1e-6, 0.0)),
        (ops.rms_norm.default, (several, w, 1e-6, 1.0)),
        (ops.attend_one.default, (q, k, v, torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8),
                                  2, 0.35)),
        (ops.attend_one.default, (q.double(), k.double(), v.double(),
                                  torch.randn(1, 2, 5, 8, dtype=torch.float64),
                                  torch.randn(1, 2, 5, 8, dtype=torch.float64), 4, 0.35)),
        (ops.linear_int8.default, (x, rows.q, rows.scale, rows.colsum, rows.bias)),
        (ops.linear_int8.default, (several, rows.q, rows.scale, rows.colsum, None)),
    ]
    for op, args in samples:
        calls.clear()
        result = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in result.values()), (op, result)
    print("ok opcheck")
    """
)


def test_opcheck_passes_on_each_operator():
    assert run_native(OPCHECK) == ["ok opcheck"]
