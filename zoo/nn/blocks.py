"""Transformer blocks: pre-norm / post-norm, with or without cross-attention.

One class covers the decoder block of GPT-1 (post-LN) and GPT-2 (pre-LN), the encoder layer,
and the decoder layer with cross-attention of the encoder-decoder Transformer, the way
``torch.nn.TransformerEncoderLayer`` covers both placements with ``norm_first``.

Seams for plugins: every sub-module is a component (a new attention, norm or feed-forward is
a ``zoo_components`` entry and a config value, no subclass); a block of another shape is a
subclass overriding :meth:`TransformerBlock.forward`, stacked with
:meth:`TransformerBlock.stack` on the subclass. Three seams are built in: the parallel
residual (``parallel_residual = True`` in the config), per-head query/key normalisation
inside attention (``qk_norm = True`` puts the ``norm`` component over one head's features in
:class:`zoo.nn.MultiHeadAttention`'s ``q_norm`` and ``k_norm``), and a mixture of experts in
place of the feed-forward (``n_experts``, :class:`zoo.nn.moe.MixtureOfExperts` over ``ffn``
experts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torch import Tensor, nn

from ..config import TransformerConfig
from ..errors import ConfigError
from .cache import LayerCache
from .moe import mixture
from .parts import Parts, parts_for
from .positions import Rotation

__all__ = ["TransformerBlock"]


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention, feed-forward; each a residual branch.

    Pre-norm (``norm_first=True``): ``x = x + f(norm(x))``. Post-norm: ``x = norm(x + f(x))``.
    Parallel (``parallel_residual=True``): ``x = x + attn(norm1(x)) + ffn(norm2(x))``.
    Every sub-module is the component ``config`` names (``attention``, ``norm``, ``ffn``,
    and ``cross_attention`` for a decoder layer over an encoder), built from ``parts``.

    Args:
        config: a :class:`~zoo.config.TransformerConfig` (or subclass).
        parts: what the config's component names stand for (default: the built-in ones,
            :meth:`zoo.nn.Parts.builtin`).
        cross_attention: add a cross-attention branch over ``memory`` (decoder layer).

    Shape:
        - x: ``(B, T, d_model)``; memory: ``(B, S, d_model)``.
        - mask: self-attention mask for ``(B, 1 | H, T, T)`` or ``None`` with ``causal``.
        - memory_mask: cross-attention mask for ``(B, 1, T, S)`` or ``None``.
        - output: ``(B, T, d_model)``.
    """

    def __init__(
        self,
        config: TransformerConfig,
        parts: Parts | None = None,
        *,
        cross_attention: bool = False,
    ) -> None:
        super().__init__()
        parts = parts_for(config, parts)
        self.norm_first = config.norm_first
        self.parallel = config.parallel_residual
        if self.parallel and cross_attention:
            raise ValueError("a parallel residual block has no cross-attention branch")
        self.attn = parts.build("attention", config)
        if config.qk_norm:
            _norm_heads(self.attn, config, parts)
        self.attn_norm = parts.build("norm", config)
        self.cross_attn: nn.Module | None = None
        self.cross_norm: nn.Module | None = None
        if cross_attention:
            self.cross_attn = parts.build("cross_attention", config)
            self.cross_norm = parts.build("norm", config)
        if config.n_experts is None:
            self.ffn = parts.build("ffn", config)
        else:
            self.ffn = mixture(config, lambda: parts.build("ffn", config))
        self.ffn_norm = parts.build("norm", config)
        self.drop = nn.Dropout(config.dropout)

    @classmethod
    def stack(
        cls,
        config: TransformerConfig,
        n_layers: int,
        parts: Parts | None = None,
        *,
        cross_attention: bool = False,
    ) -> nn.ModuleList:
        """``n_layers`` blocks made of the components ``config`` names."""
        parts = parts_for(config, parts)
        return nn.ModuleList(
            cls(config, parts, cross_attention=cross_attention) for _ in range(n_layers)
        )

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

        if self.parallel:  # x + attn(norm1(x)) + ffn(norm2(x)): both read the same x
            a, f = attend(self.attn_norm(x)), self.ffn(self.ffn_norm(x))
            return x + (self.drop(a) + self.drop(f) if self.training else a + f)
        x = self._residual(x, self.attn_norm, attend)
        if self.cross_attn is not None and self.cross_norm is not None:
            cross_attn = self.cross_attn

            def cross(h: Tensor) -> Tensor:
                return cross_attn(h, memory, mask=memory_mask, memory_kv=memory_kv)

            x = self._residual(x, self.cross_norm, cross)
        return self._residual(x, self.ffn_norm, self.ffn)


def _norm_heads(attn: nn.Module, config: TransformerConfig, parts: Parts) -> None:
    """``qk_norm``: the config's ``norm`` component over ``head_size`` features, one for the
    queries and one for the keys, in the attention's ``q_norm``/``k_norm`` seams."""
    if not hasattr(attn, "q_norm") or not hasattr(attn, "k_norm"):
        raise ConfigError(
            f"qk_norm = True, but attention component {config.attention!r} builds a "
            f"{type(attn).__name__}, which has no q_norm/k_norm seams"
        )
    width = config.head_size
    heads = dataclasses.replace(config, d_model=width, head_dim=width)  # norms over one head
    attn.q_norm = parts.build("norm", heads)
    attn.k_norm = parts.build("norm", heads)
