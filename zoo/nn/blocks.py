"""Transformer blocks: pre-norm / post-norm, with or without cross-attention.

One class covers the decoder block of GPT-1 (post-LN) and GPT-2 (pre-LN), the encoder layer,
and the decoder layer with cross-attention of the encoder-decoder Transformer, the way
``torch.nn.TransformerEncoderLayer`` covers both placements with ``norm_first``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ..config import TransformerConfig
from .attention import MultiHeadAttention
from .cache import LayerCache
from .components import build_component
from .feedforward import FeedForward
from .positions import Rotation

__all__ = ["TransformerBlock"]


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention, feed-forward; each a residual branch.

    Pre-norm (``norm_first=True``): ``x = x + f(norm(x))``. Post-norm: ``x = norm(x + f(x))``.
    :meth:`from_config` (what :meth:`stack` uses) builds the self-attention, norms and
    feed-forward a config names as components (``attention``, ``norm``, ``ffn``: see
    :data:`zoo.specs.COMPONENT_KINDS`); built directly, the block has LayerNorms, an MLP and
    :class:`MultiHeadAttention` unless ``make_*`` factories say otherwise.

    Args:
        d_model: model width.
        n_heads: attention heads.
        d_ff: feed-forward hidden width.
        activation: feed-forward activation name.
        norm_first: pre-norm when true, post-norm when false.
        cross_attention: add a cross-attention branch over ``memory`` (decoder layer).
        dropout: dropout on attention weights and on each branch output (training only).
        layer_norm_eps: LayerNorm epsilon.
        n_kv_heads: key/value heads of the cross-attention (default ``n_heads``).
        make_attention, make_norm, make_ffn: factories of the self-attention, of each norm
            and of the feed-forward, called without arguments.

    Shape:
        - x: ``(B, T, d_model)``; memory: ``(B, S, d_model)``.
        - mask: self-attention mask for ``(B, 1 | H, T, T)`` or ``None`` with ``causal``.
        - memory_mask: cross-attention mask for ``(B, 1, T, S)`` or ``None``.
        - output: ``(B, T, d_model)``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        activation: str = "gelu",
        norm_first: bool = True,
        cross_attention: bool = False,
        dropout: float = 0.0,
        layer_norm_eps: float = 1e-5,
        n_kv_heads: int | None = None,
        make_attention: Callable[[], nn.Module] | None = None,
        make_norm: Callable[[], nn.Module] | None = None,
        make_ffn: Callable[[], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        norm = make_norm or (lambda: nn.LayerNorm(d_model, eps=layer_norm_eps))
        self.norm_first = norm_first
        self.attn = (
            make_attention()
            if make_attention is not None
            else MultiHeadAttention(d_model, n_heads, dropout=dropout)
        )
        self.attn_norm = norm()
        self.cross_attn: MultiHeadAttention | None = None
        self.cross_norm: nn.Module | None = None
        if cross_attention:
            self.cross_attn = MultiHeadAttention(
                d_model, n_heads, n_kv_heads=n_kv_heads, dropout=dropout, cross=True
            )
            self.cross_norm = norm()
        self.ffn = make_ffn() if make_ffn is not None else FeedForward(d_model, d_ff, activation)
        self.ffn_norm = norm()
        self.drop = nn.Dropout(dropout)

    @classmethod
    def from_config(
        cls, config: TransformerConfig, *, cross_attention: bool = False
    ) -> TransformerBlock:
        """A block made of the components ``config`` names."""
        c = config
        return cls(
            c.d_model,
            c.n_heads,
            c.d_ff,
            norm_first=c.norm_first,
            cross_attention=cross_attention,
            dropout=c.dropout,
            n_kv_heads=c.n_kv_heads,
            make_attention=lambda: build_component("attention", c),
            make_norm=lambda: build_component("norm", c),
            make_ffn=lambda: build_component("ffn", c),
        )

    @classmethod
    def stack(
        cls, config: TransformerConfig, n_layers: int, *, cross_attention: bool = False
    ) -> nn.ModuleList:
        """``n_layers`` blocks made of the components ``config`` names."""
        blocks = (cls.from_config(config, cross_attention=cross_attention) for _ in range(n_layers))
        return nn.ModuleList(blocks)

    def _residual(self, x: Tensor, norm: nn.Module, branch: Callable[[Tensor], Tensor]) -> Tensor:
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
        rotation: Rotation | None = None,
    ) -> Tensor:
        """See the class docstring; ``cache``/``start`` and ``memory_kv`` are passed to the
        attention branches for incremental decoding, ``rotation`` (rotary positions) to the
        self-attention."""

        def attend(h: Tensor) -> Tensor:
            return self.attn(
                h, mask=mask, causal=causal, cache=cache, start=start, rotation=rotation
            )

        x = self._residual(x, self.attn_norm, attend)
        if self.cross_attn is not None and self.cross_norm is not None:
            cross_attn = self.cross_attn

            def cross(h: Tensor) -> Tensor:
                return cross_attn(h, memory, mask=memory_mask, memory_kv=memory_kv)

            x = self._residual(x, self.cross_norm, cross)
        return self._residual(x, self.ffn_norm, self.ffn)
