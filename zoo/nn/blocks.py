"""Transformer blocks: the layers the shared decoder stacks, each a ``block`` component.

:class:`TransformerBlock` covers the decoder block of GPT-1 (post-LN) and GPT-2 (pre-LN), the
encoder layer, and the decoder layer with cross-attention of the encoder-decoder Transformer,
the way ``torch.nn.TransformerEncoderLayer`` covers both placements with ``norm_first``; with
``parallel_residual`` it is GPT-NeoX's block. Three more placements of the norms are built in,
each a small class: :class:`SandwichBlock` (a norm before and after each branch: Gemma 2/3;
after only: OLMo-2) and :class:`ParallelSharedBlock` (one norm feeding both branches: GPT-J,
Cohere). A config picks one by name (``block = "sandwich"``); a plugin adds its own as a
``zoo_components`` entry of kind ``block`` whose factory is called ``factory(config, parts,
layer)``.

Seams inside every block: each sub-module is a component (a new attention, norm or
feed-forward is a ``zoo_components`` entry and a config value, no subclass), query/key
normalisation inside attention (``qk_norm = True`` puts the ``norm`` component over one
head's features, or over all heads' with ``qk_norm_scope = "full"``, in
:class:`zoo.nn.MultiHeadAttention`'s ``q_norm`` and ``k_norm``), and a mixture of experts in
place of the feed-forward (``n_experts``, :class:`zoo.nn.moe.MixtureOfExperts` over ``ffn``
experts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import ClassVar

from torch import Tensor, nn

from ..config import TransformerConfig
from ..errors import ConfigError
from .cache_types import LayerCacheLike
from .moe import mixture
from .parts import Parts, builtin_factories, parts_for
from .positions import Rotation

__all__ = [
    "BUILTIN_BLOCKS",
    "ParallelSharedBlock",
    "SandwichBlock",
    "TransformerBlock",
    "attention_and_ffn",
    "parallel_shared",
    "post_branch",
    "sandwich",
    "transformer",
]


def attention_and_ffn(config: TransformerConfig, parts: Parts) -> tuple[nn.Module, nn.Module]:
    """The two branches of a block: the ``attention`` component (with q/k norms when
    ``qk_norm``) and the ``ffn`` component (a mixture of them with ``n_experts``)."""
    attn = parts.build("attention", config)
    if config.qk_norm:
        _norm_heads(attn, config, parts)
    if config.n_experts is None:
        return attn, parts.build("ffn", config)
    return attn, mixture(config, lambda: parts.build("ffn", config))


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

    #: A subclass that computes exactly what this class computes from the same modules (it
    #: changes how the block is built, initialised or named, never its forward) declares so
    #: with ``same_forward = True`` in its own class body: zoo's one-call CPU decoding step
    #: (:mod:`zoo.runtime.native_plan`) then takes it as it takes a TransformerBlock. Any
    #: other subclass turns that step off (it may compute otherwise).
    same_forward: ClassVar[bool] = False

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
        self.attn, ffn = attention_and_ffn(config, parts)
        self.attn_norm = parts.build("norm", config)
        self.cross_attn: nn.Module | None = None
        self.cross_norm: nn.Module | None = None
        if cross_attention:
            self.cross_attn = parts.build("cross_attention", config)
            self.cross_norm = parts.build("norm", config)
        self.ffn = ffn
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
        cache: LayerCacheLike | None = None,
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


class SandwichBlock(nn.Module):
    """Each branch between two norms, inside the residual: ``x + post(f(pre(x)))``, four
    norms per block (Gemma 2, Gemma 3); with ``pre=False`` only the one after the branch,
    ``x + post(f(x))`` (OLMo-2).

    Keys: ``attn_norm``/``ffn_norm`` before the branches (as in :class:`TransformerBlock`),
    ``attn_post_norm``/``ffn_post_norm`` after them.

    Shape:
        ``(B, T, d_model) -> (B, T, d_model)``; ``forward`` takes
        :class:`TransformerBlock`'s self-attention arguments.
    """

    def __init__(self, config: TransformerConfig, parts: Parts, *, pre: bool = True) -> None:
        super().__init__()
        self.attn, self.ffn = attention_and_ffn(config, parts)
        self.attn_norm = parts.build("norm", config) if pre else None
        self.attn_post_norm = parts.build("norm", config)
        self.ffn_norm = parts.build("norm", config) if pre else None
        self.ffn_post_norm = parts.build("norm", config)
        self.drop = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: LayerCacheLike | None = None,
        start: int = 0,
        rotation: Rotation | None = None,
    ) -> Tensor:
        h = x if self.attn_norm is None else self.attn_norm(x)
        h = self.attn(h, mask=mask, causal=causal, cache=cache, start=start, rotation=rotation)
        x = x + self.drop(self.attn_post_norm(h))
        h = self.ffn(x if self.ffn_norm is None else self.ffn_norm(x))
        return x + self.drop(self.ffn_post_norm(h))


class ParallelSharedBlock(nn.Module):
    """Attention and feed-forward side by side on one normed input, ``x + attn(norm(x)) +
    ffn(norm(x))`` (GPT-J, Cohere). Key: ``norm``.

    Shape:
        ``(B, T, d_model) -> (B, T, d_model)``; ``forward`` takes
        :class:`TransformerBlock`'s self-attention arguments.
    """

    def __init__(self, config: TransformerConfig, parts: Parts) -> None:
        super().__init__()
        self.attn, self.ffn = attention_and_ffn(config, parts)
        self.norm = parts.build("norm", config)
        self.drop = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: LayerCacheLike | None = None,
        start: int = 0,
        rotation: Rotation | None = None,
    ) -> Tensor:
        h = self.norm(x)
        a = self.attn(h, mask=mask, causal=causal, cache=cache, start=start, rotation=rotation)
        return x + self.drop(a) + self.drop(self.ffn(h))


# -- block factories: factory(config, parts, layer) -> block ---------------------------------
def transformer(config: TransformerConfig, parts: Parts, layer: int) -> TransformerBlock:
    """``block = "transformer"``: pre-LN, post-LN or parallel, as the config says."""
    return TransformerBlock(config, parts)


def sandwich(config: TransformerConfig, parts: Parts, layer: int) -> SandwichBlock:
    """``block = "sandwich"``: a norm before and after each branch (Gemma 2, Gemma 3)."""
    return SandwichBlock(config, parts)


def post_branch(config: TransformerConfig, parts: Parts, layer: int) -> SandwichBlock:
    """``block = "post_branch"``: a norm after each branch, inside the residual (OLMo-2)."""
    return SandwichBlock(config, parts, pre=False)


def parallel_shared(config: TransformerConfig, parts: Parts, layer: int) -> ParallelSharedBlock:
    """``block = "parallel_shared"``: one norm for parallel branches (GPT-J, Cohere)."""
    return ParallelSharedBlock(config, parts)


#: The blocks that come with ``zoo.nn``, by name (registered as plugin ``zoo``, kind ``block``).
BUILTIN_BLOCKS: Mapping[str, Callable[..., nn.Module]] = builtin_factories("block")


def _norm_heads(attn: nn.Module, config: TransformerConfig, parts: Parts) -> None:
    """``qk_norm``: the config's ``norm`` component, one for the queries and one for the
    keys, in the attention's ``q_norm``/``k_norm`` seams: over ``head_size`` features, or
    with ``qk_norm_scope = "full"`` over every head's (``n_heads * head_size`` for the
    queries, ``n_kv_heads * head_size`` for the keys)."""
    if not hasattr(attn, "q_norm") or not hasattr(attn, "k_norm"):
        raise ConfigError(
            f"qk_norm = True, but attention component {config.attention!r} builds a "
            f"{type(attn).__name__}, which has no q_norm/k_norm seams"
        )
    head = config.head_size
    if config.qk_norm_scope == "head":
        widths = (head, head)
    else:
        if not hasattr(attn, "norm_across_heads"):
            raise ConfigError(
                f"qk_norm_scope = 'full', but attention component {config.attention!r} builds "
                f"a {type(attn).__name__}, which cannot norm across heads"
            )
        setattr(attn, "norm_across_heads", True)  # noqa: B010 (a plain flag, not a module)
        widths = (config.n_heads * head, (config.n_kv_heads or config.n_heads) * head)
    # the norm component over `width` features: the config seen as that wide
    q_cfg, k_cfg = (dataclasses.replace(config, d_model=w, head_dim=head) for w in widths)
    attn.q_norm = parts.build("norm", q_cfg)
    attn.k_norm = parts.build("norm", k_cfg)
