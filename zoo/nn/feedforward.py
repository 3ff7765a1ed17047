"""Position-wise feed-forward networks: the plain MLP and the gated ones (SwiGLU, GeGLU)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .linear import Linear

__all__ = ["ACTIVATION_NAMES", "FeedForward", "GatedFeedForward", "activation"]

_ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": lambda: nn.ReLU(),
    "silu": lambda: nn.SiLU(),
}

#: The activations a config's ``activation`` field names.
ACTIVATION_NAMES = tuple(_ACTIVATIONS)


def activation(name: str) -> nn.Module:
    """The activation module for a config's ``activation`` field."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]()


class FeedForward(nn.Module):
    """``proj(act(fc(x)))``.

    Args:
        d_model: input and output width.
        d_ff: hidden width.
        act: ``"gelu"`` (erf), ``"gelu_tanh"``, ``"relu"`` or ``"silu"``.
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


class GatedFeedForward(nn.Module):
    """``proj(act(gate(x)) * up(x))`` (Shazeer 2020), the gate and up projections fused into
    one ``fc`` of width ``2 * d_ff`` (gate first), so one matrix product computes both.

    Shape:
        ``(*, d_model) -> (*, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, act: str, *, bias: bool = True) -> None:
        super().__init__()
        self.fc = Linear(d_model, 2 * d_ff, bias=bias)
        self.act = activation(act)
        self.proj = Linear(d_ff, d_model, bias=bias)

    def lora_parts(self) -> dict[str, tuple[tuple[str, int], ...]]:
        """``fc``'s parts for LoRA (:mod:`zoo.adapters.lora`): the gate, then the up projection."""
        d_ff = self.proj.in_features
        return {"fc": (("gate", d_ff), ("up", d_ff))}

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.fc(x).chunk(2, dim=-1)  # 2 x (*, d_ff)
        return self.proj(self.act(gate) * up)


def _bias(config: Any) -> bool:
    """The feed-forward's biases: ``mlp_bias``, else ``bias``."""
    mlp_bias = getattr(config, "mlp_bias", None)
    return config.bias if mlp_bias is None else mlp_bias


def mlp(config: Any) -> FeedForward:
    """``ffn = "mlp"`` with the config's ``activation``; biases when ``mlp_bias`` (default
    ``bias``)."""
    return FeedForward(config.d_model, config.d_ff, config.activation, bias=_bias(config))


def swiglu(config: Any) -> GatedFeedForward:
    """``ffn = "swiglu"`` (Llama, Mistral): a SiLU gate."""
    return GatedFeedForward(config.d_model, config.d_ff, "silu", bias=_bias(config))


def geglu(config: Any) -> GatedFeedForward:
    """``ffn = "geglu"``: a GELU gate (the config's ``activation`` when it is a GELU)."""
    act = config.activation if config.activation in ("gelu", "gelu_tanh") else "gelu"
    return GatedFeedForward(config.d_model, config.d_ff, act, bias=_bias(config))
