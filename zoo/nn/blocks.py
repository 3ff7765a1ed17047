"""Transformer blocks: pre-LN / post-LN, with or without cross-attention.

One class covers the decoder block of GPT-1 (post-LN) and GPT-2 (pre-LN), the encoder layer,
and the decoder layer with cross-attention of the encoder-decoder Transformer, the way
``torch.nn.TransformerEncoderLayer`` covers both placements with ``norm_first``.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..config import TransformerConfig
from .attention import MultiHeadAttention
from .cache import LayerCache
from .feedforward import FeedForward

__all__ = ["TransformerBlock"]


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention, feed-forward; each a residual branch.

    Pre-LN (``norm_first=True``): ``x = x + f(norm(x))``. Post-LN: ``x = norm(x + f(x))``.

    Args:
        d_model: model width.
        n_heads: attention heads.
        d_ff: feed-forward hidden width.
        activation: feed-forward activation name.
        norm_first: pre-LN when true, post-LN when false.
        cross_attention: add a cross-attention branch over ``memory`` (decoder layer).
        dropout: dropout on attention weights and on each branch output (training only).
        layer_norm_eps: LayerNorm epsilon.

    Shape:
        - x: ``(B, T, d_model)``; memory: ``(B, S, d_model)``.
        - mask: self-attention mask for ``(B, 1, T, T)`` or ``None`` with ``causal``.
        - memory_mask: cross-attention mask for ``(B, 1, T, S)`` or ``None``.
        - output: ``(B, T, d_model)``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        activation: str,
        norm_first: bool,
        cross_attention: bool = False,
        dropout: float = 0.0,
        layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.attn_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.cross_attn: MultiHeadAttention | None = None
        self.cross_norm: nn.LayerNorm | None = None
        if cross_attention:
            self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, cross=True)
            self.cross_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.ffn_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.drop = nn.Dropout(dropout)

    @classmethod
    def stack(
        cls, config: TransformerConfig, n_layers: int, *, cross_attention: bool = False
    ) -> nn.ModuleList:
        """``n_layers`` blocks shaped by the shared fields of a Transformer config."""
        c = config
        return nn.ModuleList(
            cls(
                c.d_model,
                c.n_heads,
                c.d_ff,
                activation=c.activation,
                norm_first=c.norm_first,
                cross_attention=cross_attention,
                dropout=c.dropout,
                layer_norm_eps=c.layer_norm_eps,
            )
            for _ in range(n_layers)
        )

    def _residual(self, x: Tensor, norm: nn.Module, branch) -> Tensor:
        if self.norm_first:
            h = branch(norm(x))
            return x + (self.drop(h) if self.training else h)
        h = branch(x)
        return norm(x + (self.drop(h) if self.training else h))

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        start: int = 0,
        memory_kv: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """See the class docstring; ``cache``/``start`` and ``memory_kv`` are passed to the
        attention branches for incremental decoding."""

        def attend(h: Tensor) -> Tensor:
            return self.attn(h, mask=mask, causal=causal, cache=cache, start=start)

        x = self._residual(x, self.attn_norm, attend)
        if self.cross_attn is not None and self.cross_norm is not None:
            cross_attn = self.cross_attn

            def cross(h: Tensor) -> Tensor:
                return cross_attn(h, memory, mask=memory_mask, memory_kv=memory_kv)

            x = self._residual(x, self.cross_norm, cross)
        return self._residual(x, self.ffn_norm, self.ffn)
