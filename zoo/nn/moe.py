"""A sparse mixture of experts (Shazeer et al. 2017; Mixtral, Jiang et al. 2024): a router
scores every expert per token, each token goes to its ``top_k`` best, and their outputs are
summed weighted by the router's softmax renormalised over those ``top_k``.

The experts are ordinary feed-forward components (a config's ``ffn``), so a mixture of
SwiGLU experts is Mixtral's and any ``ffn`` a plugin adds can be an expert; quantization
reaches their linear layers as it reaches any other.

Compute: in eager mode each expert runs once on the tokens routed to it (gathered, then
scattered back with ``index_add_``), so a forward pass costs ``top_k / n_experts`` of running
every expert on every token. Those gathers have data-dependent shapes, which neither a CUDA
graph nor a compiled step can hold: while compiling or capturing, every expert runs on every
token and the routing weights (zero for the experts a token does not use) pick the result
(on the meta device too).
That dense form costs ``n_experts / top_k`` times the arithmetic (4x for Mixtral's 2 of 8),
which a decoding step of a few tokens, bound by reading the weights, barely notices; on a GPU
with large prefills the gathered form (or a grouped GEMM kernel) is the one that scales.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .linear import Linear

__all__ = ["MixtureOfExperts"]


def _fixed_shapes(h: Tensor) -> bool:
    """Whether this forward pass must keep its shapes independent of the data: compiled,
    recorded as a CUDA graph, or on the meta device (no values to route by)."""
    if h.is_meta or torch.compiler.is_compiling():
        return True
    return h.is_cuda and torch.cuda.is_current_stream_capturing()


class MixtureOfExperts(nn.Module):
    """``sum_k w_k * expert_k(x)`` over the ``top_k`` experts the router picks per token.

    Args:
        d_model: input and output width.
        experts: the experts, each ``(*, d_model) -> (*, d_model)``.
        top_k: experts per token.

    The router is ``Linear(d_model, n_experts, bias=False)``; its softmax is taken in
    float32 over all experts, then the ``top_k`` weights are renormalised to sum to one
    and cast to the activations' dtype (Mixtral's routing).

    Shape:
        ``(*, d_model) -> (*, d_model)``.
    """

    def __init__(self, d_model: int, experts: list[nn.Module], top_k: int) -> None:
        super().__init__()
        if not 0 < top_k <= len(experts):
            raise ValueError(f"top_k={top_k} must be in [1, {len(experts)}]")
        self.top_k = top_k
        self.router = Linear(d_model, len(experts), bias=False)
        self.experts = nn.ModuleList(experts)

    def routing(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """The ``top_k`` experts of each of ``N`` tokens ``(N, d_model)`` and their weights,
        ``(N, top_k)`` indices and ``(N, top_k)`` weights in ``h``'s dtype."""
        probs = F.softmax(self.router(h), dim=-1, dtype=torch.float32)  # (N, E)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # 2 x (N, k)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return chosen, weights.to(h.dtype)

    def forward(self, x: Tensor) -> Tensor:
        h = x.reshape(-1, x.shape[-1])  # (N, d_model)
        chosen, weights = self.routing(h)  # 2 x (N, k)
        run = self._dense if _fixed_shapes(h) else self._gathered
        return run(h, chosen, weights).view(x.shape)

    def _gathered(self, h: Tensor, chosen: Tensor, weights: Tensor) -> Tensor:
        out = torch.zeros_like(h)  # (N, d_model)
        hit = torch.bincount(chosen.flatten(), minlength=len(self.experts)).tolist()
        for e, expert in enumerate(self.experts):
            if not hit[e]:
                continue
            token, slot = torch.where(chosen == e)  # 2 x (n_e,)
            y = expert(h[token]) * weights[token, slot, None]  # (n_e, d_model)
            out.index_add_(0, token, y.to(h.dtype))
        return out

    def _dense(self, h: Tensor, chosen: Tensor, weights: Tensor) -> Tensor:
        # (N, E): the weight of every expert for every token, zero where it is not chosen
        dense = torch.zeros(h.shape[0], len(self.experts), dtype=h.dtype, device=h.device)
        dense.scatter_(1, chosen, weights)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            out = out + expert(h) * dense[:, e, None]
        return out


def mixture(config: Any, expert: Callable[[], nn.Module]) -> MixtureOfExperts:
    """A mixture of ``config.n_experts`` experts, each ``expert()``, routing every token to
    ``config.experts_per_token`` of them."""
    return MixtureOfExperts(
        config.d_model,
        [expert() for _ in range(config.n_experts)],
        config.experts_per_token,
    )
