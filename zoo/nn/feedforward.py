"""Position-wise feed-forward network."""

from __future__ import annotations

from torch import Tensor, nn

from .linear import Linear

__all__ = ["FeedForward", "activation"]


def activation(name: str) -> nn.Module:
    """The activation module for a config's ``activation`` field."""
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "relu":
        return nn.ReLU()
    raise ValueError(f"unknown activation {name!r}; choose 'gelu', 'gelu_tanh' or 'relu'")


class FeedForward(nn.Module):
    """``proj(act(fc(x)))``.

    Args:
        d_model: input and output width.
        d_ff: hidden width.
        act: ``"gelu"`` (erf), ``"gelu_tanh"`` or ``"relu"``.
        bias: linear layers have biases.

    Shape:
        ``(*, d_model) -> (*, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, act: str, *, bias: bool = True) -> None:
        super().__init__()
        self.fc = Linear(d_model, d_ff, bias=bias)
        self.act = activation(act)
        self.proj = Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))
