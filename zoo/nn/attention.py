"""Multi-head attention on PyTorch's ``scaled_dot_product_attention``."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .cache import LayerCache
from .linear import Linear

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention.

    Self-attention uses one fused ``qkv`` projection; cross-attention (``cross=True``) projects
    queries from ``x`` with ``q`` and keys/values from ``memory`` with ``kv``, so the query and
    key lengths are free to differ.

    Args:
        d_model: model width; split evenly over ``n_heads``.
        n_heads: number of heads.
        dropout: dropout on the attention weights (training only).
        cross: build the cross-attention variant.
        bias: projections have biases.

    Shape:
        - x: ``(B, T, d_model)``; memory: ``(B, S, d_model)`` (cross-attention only).
        - mask: boolean, broadcastable to ``(B, 1, T, S)``, ``True`` where attention is allowed.
        - output: ``(B, T, d_model)``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        dropout: float = 0.0,
        cross: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.cross = cross
        if cross:
            self.q = Linear(d_model, d_model, bias=bias)
            self.kv = Linear(d_model, 2 * d_model, bias=bias)
        else:
            self.qkv = Linear(d_model, 3 * d_model, bias=bias)
        self.proj = Linear(d_model, d_model, bias=bias)

    def _heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of the encoder output, ``(B, H, S, hd)`` each;
        computed once per generation and passed back as ``memory_kv``."""
        k, v = self.kv(memory).split(self.d_model, dim=-1)
        return self._heads(k), self._heads(v)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: LayerCache | None = None,
        start: int = 0,
        memory_kv: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """Attend from ``x`` to itself (or to ``memory``).

        ``causal`` applies when ``mask`` is ``None`` (a given mask already holds the causal
        pattern). With a ``cache``, the new keys and values are stored at position ``start``
        and the queries attend to every cached position. Cross-attention takes either
        ``memory`` or its precomputed ``memory_kv``.
        """
        b, t, _ = x.shape
        if self.cross:
            q = self._heads(self.q(x))  # (B, H, T, hd)
            if memory_kv is None:
                if memory is None:
                    raise ValueError("cross-attention needs the encoder output as `memory`")
                memory_kv = self.memory_kv(memory)
            k, v = memory_kv  # (B, H, S, hd)
        else:
            qkv = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, hd)
            if cache is not None:
                k, v = cache.write(start, k, v)  # (B, H, start + T, hd)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=causal and mask is None,
        )  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(b, t, self.d_model)  # (B, T, d_model)
        return self.proj(y)
