"""Multi-head attention on PyTorch's ``scaled_dot_product_attention``: multi-head,
grouped-query and multi-query (``n_kv_heads``), with or without biases."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..kernels import native
from .cache_types import LayerCacheLike
from .linear import Linear
from .positions import Rotation

__all__ = ["MultiHeadAttention", "cross_mha", "mha"]


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention.

    Self-attention uses one fused ``qkv`` projection (queries, then keys, then values);
    cross-attention (``cross=True``) projects queries from ``x`` with ``q`` and keys/values from
    ``memory`` with ``kv``, so the query and key lengths are free to differ.

    Args:
        d_model: model width (of the input and of the output).
        n_heads: number of query heads.
        head_dim: features per head (default ``d_model / n_heads``); queries, keys and
            values are ``head_dim`` wide per head, and the output projection maps the
            ``n_heads * head_dim`` features back to ``d_model``.
        n_kv_heads: key/value heads (default ``n_heads``); fewer is grouped-query attention
            (each shared by ``n_heads / n_kv_heads`` query heads), one is multi-query.
        dropout: dropout on the attention weights (training only).
        cross: build the cross-attention variant.
        bias: the query/key/value projections have biases.
        out_bias: the output projection has a bias (default: ``bias``).
        scale: the factor on the scores (default ``head_dim ** -0.5``).
        softcap: scores become ``softcap * tanh(score / softcap)`` before the mask and the
            softmax (Gemma 2), computed outside the fused kernel.

    ``q_norm`` and ``k_norm`` (``None`` unless set) are the seams for a normalisation of
    each head's queries and keys before rotary positions (e.g. ``RMSNorm(head_dim)``); with
    ``norm_across_heads = True`` they normalise all heads' queries (keys) together instead,
    ``(B, T, n_heads * head_dim)`` (OLMo-2).

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
        head_dim: int | None = None,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        cross: bool = False,
        bias: bool = True,
        out_bias: bool | None = None,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_kv_heads or n_heads
        if head_dim is None and d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be divisible by n_kv_heads={n_kv_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim if head_dim is not None else d_model // n_heads
        self.q_width = n_heads * self.head_dim
        self.kv_width = n_kv_heads * self.head_dim
        self.dropout = dropout
        self.cross = cross
        self.scale = scale
        self.softcap = softcap
        if cross:
            self.q = Linear(d_model, self.q_width, bias=bias)
            self.kv = Linear(d_model, 2 * self.kv_width, bias=bias)
        else:
            self.qkv = Linear(d_model, self.q_width + 2 * self.kv_width, bias=bias)
        self.proj = Linear(self.q_width, d_model, bias=bias if out_bias is None else out_bias)
        # Seams: modules applied to each head's queries and keys, (B, H, T, hd) ->
        # (B, H, T, hd), before rotary positions turn them (q/k normalisation, as Qwen3,
        # OLMo-2 and Gemma 3 have it); a plugin's attention factory sets them.
        self.q_norm: nn.Module | None
        self.k_norm: nn.Module | None
        self.register_module("q_norm", None)
        self.register_module("k_norm", None)
        self.norm_across_heads = False

    def lora_parts(self) -> dict[str, tuple[tuple[str, int], ...]]:
        """The fused projections' parts for LoRA (:mod:`zoo.adapters.lora`): queries, keys and
        values of ``qkv`` (keys and values of cross-attention's ``kv``)."""
        if self.cross:
            return {"kv": (("k", self.kv_width), ("v", self.kv_width))}
        return {"qkv": (("q", self.q_width), ("k", self.kv_width), ("v", self.kv_width))}

    def _heads(self, x: Tensor) -> Tensor:
        b, t, width = x.shape
        return x.view(b, t, width // self.head_dim, self.head_dim).transpose(1, 2)  # (B, h, T, hd)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of the encoder output, ``(B, H_kv, S, hd)`` each;
        computed once per generation and passed back as ``memory_kv``."""
        k, v = self.kv(memory).split(self.kv_width, dim=-1)
        return self._heads(k), self._heads(v)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: LayerCacheLike | None = None,
        start: int = 0,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        rotation: Rotation | None = None,
    ) -> Tensor:
        """Attend from ``x`` to itself (or to ``memory``).

        ``mask`` is boolean (``True`` where attention is allowed) or float (added to the
        scores). ``causal`` applies when ``mask`` is ``None`` (a given mask already holds the
        causal pattern). ``rotation`` (rotary positions) turns the new queries and keys before
        the keys are cached. With a ``cache``, the new keys and values are stored at position
        ``start`` and the queries attend to every cached position. Cross-attention takes
        either ``memory`` or its precomputed ``memory_kv``.
        """
        b, t, _ = x.shape
        q, k, v = self._project(x, memory, memory_kv)  # (B, H | H_kv, T | S, hd) each
        if rotation is not None:
            q, k = rotation(q), rotation(k)
        if cache is not None:
            y = self._native_step(q, k, v, cache, start, mask, causal)
            if y is not None:  # one decoding step of each sequence, on zoo's kernel
                return self.proj(y)
            k, v = cache.write(start, k, v)  # (B, H_kv, start + T, hd)
        elif self.cross and t == 1:
            y = self._native_memory(q, k, v, mask)
            if y is not None:  # one decoding step's cross-attention, on zoo's kernel
                return self.proj(y)
        if self.softcap is None:
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=self.dropout if self.training else 0.0,
                is_causal=causal and mask is None,
                scale=self.scale,
                enable_gqa=self.n_kv_heads != self.n_heads,
            )  # (B, H, T, hd)
        else:
            y = self._capped(q, k, v, mask, causal and mask is None)
        y = y.transpose(1, 2).reshape(b, t, self.q_width)  # (B, T, H * hd)
        return self.proj(y)

    def _native_step(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cache: LayerCacheLike,
        start: int,
        mask: Tensor | None,
        causal: bool,
    ) -> Tensor | None:
        """The attention of one new token of each sequence in one kernel that also writes the
        cache (the cache's :meth:`~zoo.nn.cache_types.LayerCacheLike.attend_one`: zoo's CPU
        kernel for a plain :class:`zoo.runtime.cache.LayerCache`), ``(B, 1, H * hd)``; ``None``
        where it does not apply (a mask, soft-capped scores, gradients, dropout, a cache
        without such a kernel)."""
        if mask is not None or (causal and start > 0) or not self._plain_softmax(q):
            return None
        return cache.attend_one(q, k, v, start, self._scale())

    def _plain_softmax(self, q: Tensor) -> bool:
        """Whether this call's attention is what zoo's kernels compute: no soft cap, no
        dropout, no gradient to record."""
        return (
            self.softcap is None
            and not (self.training and self.dropout > 0)
            and not (torch.is_grad_enabled() and q.requires_grad)
        )

    def _scale(self) -> float:
        return self.scale if self.scale is not None else self.head_dim**-0.5

    def _native_memory(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor | None:
        """One query per sequence attending to the encoder's keys and values in one kernel
        (:func:`zoo.kernels.native.attend_memory`), ``(B, 1, H * hd)``; ``None`` where it
        does not apply (a mask other than a key padding mask, soft-capped scores, gradients,
        dropout, no kernel)."""
        b, s = k.shape[0], k.shape[2]
        padding = mask is None or (mask.dtype is torch.bool and mask.shape == (b, 1, 1, s))
        if not padding or not self._plain_softmax(q):
            return None
        keep = None if mask is None else mask.reshape(b, s)  # (B, S): a key padding mask
        return native.attend_memory(q, k, v, keep, self._scale())

    def _project(
        self, x: Tensor, memory: Tensor | None, memory_kv: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values, normed by ``q_norm``/``k_norm``, before positions:
        ``(B, H, T, hd)`` and ``(B, H_kv, T, hd)`` (cross-attention: ``(B, H_kv, S, hd)``)."""
        b, t, _ = x.shape
        if self.cross:
            q = self._heads(self.q(x))  # (B, H, T, hd)
            if memory_kv is None:
                if memory is None:
                    raise ValueError("cross-attention needs the encoder output as `memory`")
                memory_kv = self.memory_kv(memory)
            k, v = memory_kv  # (B, H, S, hd)
        elif self.norm_across_heads:  # q/k norms over every head's features at once
            q, k, v = self.qkv(x).split((self.q_width, self.kv_width, self.kv_width), dim=-1)
            q = q if self.q_norm is None else self.q_norm(q)  # (B, T, H * hd)
            k = k if self.k_norm is None else self.k_norm(k)  # (B, T, H_kv * hd)
            return self._heads(q), self._heads(k), self._heads(v)  # (B, H | H_kv, T, hd)
        elif self.n_kv_heads == self.n_heads:
            qkv = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, hd)
        else:
            q, k, v = self.qkv(x).split((self.q_width, self.kv_width, self.kv_width), dim=-1)
            q, k, v = self._heads(q), self._heads(k), self._heads(v)  # (B, H | H_kv, T, hd)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None and not self.cross:
            k = self.k_norm(k)
        return q, k, v

    def _capped(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """Attention with soft-capped scores, as transformers' Gemma 2 computes it: scores
        in the activations' dtype, capped, masked, softmax in float32. ``(B, H, T, hd)``."""
        assert self.softcap is not None
        if self.n_kv_heads != self.n_heads:  # (B, H_kv, S, hd) -> (B, H, S, hd)
            groups = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scale = self.scale if self.scale is not None else self.head_dim**-0.5
        scores = q @ k.transpose(-1, -2) * scale  # (B, H, T, S)
        scores = torch.tanh(scores / self.softcap) * self.softcap
        if causal:
            t, s = scores.shape[-2:]
            mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
        if mask is not None:
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            else:
                scores = scores + mask
        weights = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
        if self.training and self.dropout:
            weights = F.dropout(weights, self.dropout)
        return weights @ v  # (B, H, T, hd)


def mha(config: Any) -> MultiHeadAttention:
    """``attention = "mha"``: self-attention with ``n_kv_heads`` key/value heads of
    ``head_size`` features, biases on the query/key/value projections when ``qkv_bias``
    (default ``bias``) and on the output projection when ``attn_out_bias`` (default
    ``bias``); scores scaled by ``attn_scale`` and capped by ``attn_softcap``."""
    qkv_bias = config.bias if config.qkv_bias is None else config.qkv_bias
    out_bias = getattr(config, "attn_out_bias", None)
    return MultiHeadAttention(
        config.d_model,
        config.n_heads,
        head_dim=config.head_size,
        n_kv_heads=config.n_kv_heads,
        dropout=config.dropout,
        bias=qkv_bias,
        out_bias=config.bias if out_bias is None else out_bias,
        scale=getattr(config, "attn_scale", None),
        softcap=getattr(config, "attn_softcap", None),
    )


def cross_mha(config: Any) -> MultiHeadAttention:
    """``cross_attention = "mha"``: cross-attention over the encoder's output with
    ``n_kv_heads`` key/value heads of ``head_size`` features, biases as :func:`mha` has them
    (``qkv_bias``, ``attn_out_bias``, default ``bias``: all of them by default, as
    ``torch.nn.Transformer``'s) and scores scaled by ``attn_scale`` (T5: 1)."""
    qkv_bias = config.bias if config.qkv_bias is None else config.qkv_bias
    out_bias = getattr(config, "attn_out_bias", None)
    return MultiHeadAttention(
        config.d_model,
        config.n_heads,
        head_dim=config.head_size,
        n_kv_heads=config.n_kv_heads,
        dropout=config.dropout,
        cross=True,
        bias=qkv_bias,
        out_bias=config.bias if out_bias is None else out_bias,
        scale=getattr(config, "attn_scale", None),
    )
