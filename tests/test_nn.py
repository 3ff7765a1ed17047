"""Shared components: the fast linear kernel and the masks."""

from __future__ import annotations

import functools
import sys

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.kernels.onednn import cpu_linear as linear
from zoo.nn import Linear, sdpa_mask, use_onednn
from zoo.nn.masks import causal_self_mask


@pytest.mark.parametrize("shape", [(1, 768), (3, 1, 64), (2, 17, 64), (5, 64)])
@pytest.mark.parametrize("bias", [True, False])
def test_fast_linear_matches_f_linear(shape, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(96, shape[-1], generator=g)
    b = torch.randn(96, generator=g) if bias else None
    with torch.no_grad():
        assert torch.allclose(linear(x, w, b), F.linear(x, w, b), atol=1e-5, rtol=1e-5)
        strided = torch.randn(shape[-1] * 2, *shape[:-1], generator=g).movedim(0, -1)[..., ::2]
        assert torch.allclose(linear(strided, w, b), F.linear(strided, w, b), atol=1e-5, rtol=1e-5)


def test_fast_linear_keeps_gradients():
    layer = Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fast_linear_other_dtypes_use_the_default_kernel(dtype):
    x, w = torch.randn(2, 8, dtype=dtype), torch.randn(4, 8, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(linear(x, w), F.linear(x, w))


@pytest.mark.parametrize("native", [True, False])
def test_bfloat16_products_of_many_rows_widen_where_the_cpu_lacks_bfloat16(monkeypatch, native):
    """Without native bfloat16 matrix units, 16+ rows multiply in float32 and round back."""
    monkeypatch.setattr(sys.modules["zoo.kernels.onednn"], "native_bf16", lambda: native)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 768, generator=g).bfloat16()
    w, b = torch.randn(1024, 768, generator=g).bfloat16(), torch.randn(1024, generator=g).bfloat16()
    with torch.no_grad():
        got = linear(x, w, b)
        widened = linear(x.float(), w.float(), b.float()).bfloat16()
        assert got.dtype is torch.bfloat16
        assert torch.equal(got, F.linear(x, w, b) if native else widened)
        few = x[:1, :15]  # under 16 rows: always the bfloat16 kernel
        assert torch.equal(linear(few, w, b), F.linear(few, w, b))
    x.requires_grad_(True)
    linear(x, w, b).float().sum().backward()
    assert x.grad is not None and x.grad.dtype is torch.bfloat16


def test_linear_state_dict_is_nn_linear():
    assert Linear(8, 4).state_dict().keys() == torch.nn.Linear(8, 4).state_dict().keys()


def test_padding_and_causal_masks():
    keep = torch.tensor([[True, True, True], [False, True, True]])
    mask = sdpa_mask(keep, causal=True, q_len=3)  # (B, 1, T, S)
    assert mask[0, 0].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    # the padded query row sees nothing real: it may see every key (finite, ignored)
    assert mask[1, 0].tolist() == [[1, 1, 1], [0, 1, 0], [0, 1, 1]]
    assert causal_self_mask(None, q_len=5, start=0) == (None, True)
    assert causal_self_mask(None, q_len=1, start=7) == (None, False)
    offset, causal = causal_self_mask(torch.ones(1, 6, dtype=torch.bool), q_len=2, start=4)
    assert not causal and offset[0, 0].tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    with pytest.raises(ValueError, match="padding mask"):
        causal_self_mask(None, q_len=2, start=4)


@pytest.mark.parametrize(
    ("positions", "message"),
    [
        (torch.tensor([[0, 1, 64]]), r"position_ids holds 64, outside the context \[0, 64\)"),
        (torch.tensor([[0, -1, 2]]), "position_ids holds -1"),
        (torch.tensor([[0.0, 1.0, 2.0]]), "position_ids must hold integers"),
        (torch.tensor([[0, 1]]), "one position per token"),
    ],
)
def test_bad_position_ids_are_value_errors(positions, message):
    """position_ids beyond the context raised an IndexError deep inside the embedding."""
    model = zoo.build("gpt2-124m", n_layers=1, d_model=32, n_heads=2, d_ff=64, context_length=64)
    with pytest.raises(ValueError, match=message):
        model(torch.tensor([[1, 2, 3]]), position_ids=positions)


# -- the oneDNN transform -----------------------------------------------------------------------
def _small_gpt2(**kwargs):
    torch.manual_seed(0)
    return zoo.build("gpt2-124m", n_layers=1, d_model=256, n_heads=4, d_ff=1024, **kwargs)


def test_build_applies_the_onednn_transform_on_cpu_and_onednn_false_keeps_pytorch():
    from zoo.kernels.onednn import available
    from zoo.nn.linear import OneDNNLinear

    fast, plain = _small_gpt2().eval(), _small_gpt2(onednn=False).eval()
    kinds = {type(m) for m in fast.modules() if isinstance(m, torch.nn.Linear)}
    assert kinds == ({OneDNNLinear} if available() else {Linear})
    assert {type(m) for m in plain.modules() if isinstance(m, torch.nn.Linear)} == {Linear}
    assert fast.state_dict().keys() == plain.state_dict().keys()
    ids = torch.randint(0, 50257, (2, 7))
    with torch.no_grad():
        assert torch.allclose(fast(ids), plain(ids), atol=1e-4, rtol=1e-4)


def test_without_the_private_ops_the_plain_path_is_taken(monkeypatch):
    """A torch without oneDNN's linear kernel: nothing is swapped, the model is PyTorch's."""
    import zoo.kernels.onednn as onednn
    from zoo.nn.linear import OneDNNLinear, use_onednn

    monkeypatch.setattr(onednn, "_kernel", lambda: None)
    model = _small_gpt2()
    assert {type(m) for m in model.modules() if isinstance(m, torch.nn.Linear)} == {Linear}
    assert use_onednn(model) == 0
    # and a layer swapped before still computes F.linear
    layer = Linear(512, 512)
    layer.__class__ = OneDNNLinear
    x = torch.randn(3, 512)
    with torch.no_grad():
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_a_loaded_cpu_model_runs_on_onednn(tmp_path):
    from zoo.kernels.onednn import available
    from zoo.nn.linear import OneDNNLinear

    zoo.save(_small_gpt2(onednn=False), tmp_path)
    kinds = {type(m) for m in zoo.load(tmp_path).modules() if isinstance(m, torch.nn.Linear)}
    assert kinds == ({OneDNNLinear} if available() else {Linear})
    plain = zoo.load(tmp_path, onednn=False)
    assert {type(m) for m in plain.modules() if isinstance(m, torch.nn.Linear)} == {Linear}


def test_a_compiled_onednn_linear_is_one_graph_with_no_break():
    """torch.compile traces cpu_linear without a graph break (it broke at every layer on
    oneDNN's availability check, and recompiled for each weight shape), and computes what the
    eager layer does."""
    from zoo.kernels import onednn

    layers = torch.nn.Sequential(Linear(512, 768), Linear(768, 512))
    if use_onednn(layers) == 0:  # a torch without oneDNN: F.linear, nothing to trace
        assert not onednn.available()
        return
    x = torch.randn(2, 3, 512)
    onednn.prepare_compile()  # as zoo's compiled decoding does
    with torch.no_grad():
        explained = torch._dynamo.explain(layers)(x)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        assert torch.allclose(torch.compile(layers)(x), layers(x), atol=1e-5)


def _rank_cases() -> list[tuple[str, tuple[int, ...], str]]:
    """(model kind, shape of the ids, what the hint says) for each wrong rank."""
    hints = {(): "torch.tensor([[id, ...]])", (5,): ".unsqueeze(0)"}
    shapes = [(), (5,), (2, 5, 3), (2, 2, 5, 3)]
    return [
        (kind, shape, hints.get(shape, "not embeddings or one-hot"))
        for kind in ("decoder", "encoder-decoder source", "encoder-decoder target", "classifier")
        for shape in shapes
    ]


@functools.cache
def _small_model(kind: str) -> torch.nn.Module:
    from zoo.testing import small_overrides
    from zoo.train import classifier

    name = "transformer-encdec-tiny" if kind.startswith("encoder-decoder") else "gpt2-124m"
    model = zoo.build(name, **small_overrides(name))
    return classifier(model, ["a", "b"]) if kind == "classifier" else model


@pytest.mark.parametrize(("kind", "shape", "hint"), _rank_cases())
def test_ids_of_the_wrong_rank_get_a_hint_that_fits_the_rank(kind, shape, hint):
    """(2, 2, 2) ids were once told to ``unsqueeze(0)``, which makes them 4-D."""
    ids = torch.zeros(shape, dtype=torch.long)
    good = torch.zeros(2, 5, dtype=torch.long)
    model = _small_model(kind)
    args, name = (ids,), "input_ids"
    if kind.startswith("encoder-decoder"):
        args = (ids, good) if kind.endswith("source") else (good, ids)
        name = "src_ids" if kind.endswith("source") else "tgt_ids"
    with pytest.raises(ValueError) as error:
        model(*args)
    message = str(error.value)
    assert message.startswith(f"{name} must have shape (batch, seq_len)"), message
    assert f"got a {len(shape)}-D tensor of shape {shape}" in message, message
    assert hint in message, message
    assert ("unsqueeze" in message) == (len(shape) == 1), message
