"""The trainer's cross-entropy equals ``F.cross_entropy`` in value and gradient, whatever the
shape, the ignored positions and the input's dtype, and never changes a tensor it was given."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from zoo.train.loss import cross_entropy


@settings(deadline=None, max_examples=40)
@given(
    n=st.integers(1, 70),
    vocab=st.integers(2, 300),
    seed=st.integers(0, 2**31 - 1),
    ignored=st.floats(0.0, 0.9),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_value_and_gradient_equal_f_cross_entropy(n, vocab, seed, ignored, dtype):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, 8, generator=g, dtype=dtype, requires_grad=True)
    x = torch.randn(n, 8, generator=g, dtype=dtype)
    targets = torch.randint(0, vocab, (n,), generator=g)
    targets[torch.rand(n, generator=g) < ignored] = -100
    targets[0] = 0  # at least one counted position
    losses, grads = [], []
    for loss_fn in (F.cross_entropy, cross_entropy):
        weight.grad = None
        logits = (x @ weight.T).float()  # as the trainer computes them: (N, V)
        loss = loss_fn(logits, targets, ignore_index=-100)
        loss.backward()
        losses.append(loss.detach())
        grads.append(weight.grad.float())
    tol = 1e-5 if dtype is torch.float32 else 1e-2
    assert torch.allclose(losses[0], losses[1], atol=tol, rtol=tol)
    assert torch.allclose(grads[0], grads[1], atol=tol, rtol=tol)


def test_a_tensor_the_caller_owns_is_left_as_it_was():
    logits = torch.randn(4, 10, requires_grad=True)
    before = logits.detach().clone()
    cross_entropy(logits, torch.tensor([1, 2, 3, 4])).backward()
    assert torch.equal(logits.detach(), before)
    expected = torch.func.grad(lambda z: F.cross_entropy(z, torch.tensor([1, 2, 3, 4])))(before)
    assert torch.allclose(logits.grad, expected, atol=1e-6)


def test_logits_another_operation_saved_are_an_error_not_a_wrong_gradient():
    x = torch.randn(4, 10, requires_grad=True)
    logits = x.exp()  # exp saves its output for its own backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        cross_entropy(logits, torch.tensor([1, 2, 3, 4])).backward()


def test_shapes_are_checked():
    with pytest.raises(ValueError, match=r"logits \(N, V\) and targets \(N,\)"):
        cross_entropy(torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long))
