"""The decoder-only language model shared by gpt1, gpt2, wiki-gpt-wordpiece, llama and any
plugin's decoder.

Everything that differs between them is a :class:`~zoo.config.DecoderConfig` field: the
components (position scheme, norm, feed-forward, attention) and their options, norm
placement, final norm, head tying and biases.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor, nn

from ..config import DecoderConfig
from ..errors import CompileUnavailableError
from .base import (
    ZooModel,
    activation_dtype,
    check_padding_mask,
    check_position_ids,
    check_token_ids,
    embed_tokens,
    init_weights,
    random_ids,
    right_padding,
)
from .blocks import TransformerBlock
from .cache import KVCache, StaticKVCache
from .linear import Linear
from .masks import self_attention_mask
from .parts import Parts, make_positions, parts_for

__all__ = [
    "DecoderLM",
    "DecoderSession",
    "StaticDecoderSession",
    "check_compilable",
    "check_cpp_compiler",
    "positions_from_mask",
]


class DecoderLM(ZooModel):
    """Token embedding [+ positions] -> ``n_layers`` causal blocks -> [norm] -> LM head.

    Args:
        config: a :class:`~zoo.config.DecoderConfig` (or subclass).
        parts: what the config's component names stand for (``zoo.build`` passes the ones
            the registry resolved; default: the built-in ones, :meth:`zoo.nn.Parts.builtin`).

    Shape:
        - input_ids: ``(B, T)`` integer ids in ``[0, vocab_size)``, ``T <= context_length``.
        - attention_mask: ``(B, T)``, 1 for tokens and 0 for padding (left or right).
        - output: logits ``(B, T, vocab_size)``.
    """

    config: DecoderConfig

    def __init__(self, config: DecoderConfig, parts: Parts | None = None) -> None:
        super().__init__(config)
        c = config
        parts = parts_for(c, parts)
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = make_positions(c, parts)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = TransformerBlock.stack(c, c.n_layers, parts)
        self.final_norm = parts.build("norm", c) if c.final_norm else None
        self.head = Linear(c.d_model, c.vocab_size, bias=c.head_bias)
        self.reset_parameters()
        if c.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layers)."""
        self.apply(init_weights)
        for block in cast("list[TransformerBlock]", self.blocks):
            for owner in (block.attn, block.ffn):  # components name their output projection proj
                proj = cast("nn.Linear", owner.proj)
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * self.config.n_layers))

    def example_inputs(
        self, batch_size: int = 2, seq_len: int = 8, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        device = activation_dtype(self)[1]
        seq_len = min(seq_len, self.config.context_length)
        return {
            "input_ids": random_ids(
                (batch_size, seq_len), self.config.vocab_size, device, generator
            ),
            "attention_mask": right_padding(batch_size, seq_len, device),
        }

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        """Token plus position vectors, ``(B, T) -> (B, T, d_model)``."""
        return embed_tokens(
            self.tok_emb,
            self.pos_emb,
            self.drop,
            input_ids,
            position_ids,
            scale_by_width=self.config.scale_embeddings,
        )

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """Logits for every position. With padding, positions count real tokens only, so a
        left-padded row gives the same logits as the same row unpadded."""
        c = self.config
        ids = check_token_ids(input_ids, vocab_size=c.vocab_size, context_length=c.context_length)
        keep = check_padding_mask(attention_mask, ids.shape)
        if position_ids is None:
            position_ids = positions_from_mask(ids, keep)
        else:
            position_ids = check_position_ids(position_ids, ids.shape, c.context_length)
        return self.logits(ids, keep, position_ids)

    def logits(
        self,
        ids: Tensor,
        keep: Tensor | None,
        position_ids: Tensor,
        *,
        cache: KVCache | None = None,
        last_only: bool = False,
        mask: Tensor | None = None,
    ) -> Tensor:
        """The forward pass on validated inputs.

        Args:
            ids: ``(B, T)`` new token ids.
            keep: ``(B, S)`` padding mask of every key (``S = cache.length + T``), or ``None``.
            position_ids: ``(B, T)`` positions of the new tokens.
            cache: keys/values of earlier positions; the new ones are appended to it.
            last_only: compute logits for the last position only, ``(B, 1, vocab)``.
            mask: a ready boolean self-attention mask ``(B, 1, T, S)`` over every key the
                cache returns, used instead of one built from ``keep`` (for a cache read
                whole, :meth:`KVCache.read_whole`; the position scheme must add no score bias).
        """
        x = self.states(ids, keep, position_ids, cache=cache, last_only=last_only, mask=mask)
        return self.head(x)

    def hidden(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """The final hidden states ``(B, T, d_model)`` (what the LM head reads), for heads of
        other tasks (sequence classification)."""
        c = self.config
        ids = check_token_ids(input_ids, vocab_size=c.vocab_size, context_length=c.context_length)
        keep = check_padding_mask(attention_mask, ids.shape)
        return self.states(ids, keep, positions_from_mask(ids, keep))

    def states(
        self,
        ids: Tensor,
        keep: Tensor | None,
        position_ids: Tensor,
        *,
        cache: KVCache | None = None,
        last_only: bool = False,
        mask: Tensor | None = None,
    ) -> Tensor:
        """:meth:`logits` without the head: final hidden states ``(B, T, d_model)``."""
        start = cache.length if cache is not None else 0
        t = ids.shape[1]
        x = self.embed(ids, position_ids)  # (B, T, d_model)
        rotation = self.pos_emb.rotation(position_ids)  # once for every layer
        causal = False
        if mask is None:
            bias = self.pos_emb.score_bias(t, start + t, ids.device)  # (H, T, S) or None
            mask, causal = self_attention_mask(
                keep,
                q_len=t,
                start=start,
                window=self.config.sliding_window,
                bias=bias,
                device=ids.device,
                dtype=x.dtype,
            )
        for i, block in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            x = block(
                x, mask=mask, causal=causal, cache=layer_cache, start=start, rotation=rotation
            )
        if cache is not None:
            cache.advance(t)
        if last_only:
            x = x[:, -1:]  # (B, 1, d_model)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x  # (B, T, d_model)

    def start_decoding(
        self,
        input_ids: Tensor,
        keep: Tensor | None,
        max_new_tokens: int,
        *,
        start_id: int | None = None,
        compile: bool = False,
    ) -> DecoderSession:
        """A decoding session over validated prompt ids ``(B, T)`` with padding mask ``keep``
        (``start_id`` is for encoder-decoders and ignored here). On CUDA it replays a recorded
        graph per token (:class:`StaticDecoderSession`) unless ``ZOO_CUDA_GRAPHS=0`` or the
        position scheme adds score biases. ``compile=True`` (CPU) runs each step through
        ``torch.compile`` instead: see :class:`StaticDecoderSession`."""
        max_len = input_ids.shape[1] + max_new_tokens
        if compile:
            check_compilable(self, input_ids.device)
            # one compiled step per cache size: round it up to a power of two (>= 64)
            bucket = min(self.config.context_length, max(64, 1 << (max_len - 1).bit_length()))
            return StaticDecoderSession(self, input_ids, keep, max(max_len, bucket), compile=True)
        if StaticDecoderSession.records(self, input_ids.device):
            return StaticDecoderSession(self, input_ids, keep, max_len)
        return DecoderSession(self, input_ids, keep, max_len)


class DecoderSession:
    """Incremental decoding of a :class:`DecoderLM` with a preallocated KV cache."""

    def __init__(self, model: DecoderLM, ids: Tensor, keep: Tensor | None, max_len: int) -> None:
        c = model.config
        if max_len > c.context_length:
            raise ValueError(
                f"the prompt ({ids.shape[1]} tokens) plus max_new_tokens "
                f"({max_len - ids.shape[1]}) exceeds the context length {c.context_length}; "
                "shorten the prompt or lower max_new_tokens (zoo does not slide the window)"
            )
        dtype, device = activation_dtype(model)
        self.model = model
        self.cache = KVCache(
            c.n_layers,
            ids.shape[0],
            c.n_kv_heads or c.n_heads,
            max_len,
            c.d_model // c.n_heads,
            dtype=dtype,
            device=device,
        )
        self.keep: Tensor | None = None
        if keep is not None:  # (B, max_len): the prompt's padding, then real tokens
            self.keep = torch.ones(ids.shape[0], max_len, dtype=torch.bool, device=ids.device)
            self.keep[:, : ids.shape[1]] = keep
        self.next_position = positions_from_mask(ids, keep)[:, -1:] + 1  # (B, 1)
        #: What generated ids are appended to: the prompt.
        self.prefix = ids

    def _keep(self, length: int) -> Tensor | None:
        return self.keep[:, :length] if self.keep is not None else None

    def prefill(self) -> Tensor:
        """Run the prompt; return the logits of its last position, ``(B, vocab)``."""
        ids, t = self.prefix, self.prefix.shape[1]
        positions = positions_from_mask(ids, self._keep(t))
        logits = self.model.logits(ids, self._keep(t), positions, cache=self.cache, last_only=True)
        return logits[:, -1]

    def step(self, tokens: Tensor) -> Tensor:
        """Append ``tokens`` ``(B,)``; return the next logits ``(B, vocab)``."""
        length = self.cache.length + 1
        logits = self.model.logits(
            tokens[:, None],
            self._keep(length),
            self.next_position,
            cache=self.cache,
            last_only=True,
        )
        self.next_position = self.next_position + 1
        return logits[:, -1]


class StaticDecoderSession(DecoderSession):
    """A :class:`DecoderSession` whose steps are one fixed sequence of kernels on fixed
    buffers, recorded once as a CUDA graph and replayed for every later token: one launch per
    token instead of a few hundred, which is what limits a small model's decoding on a GPU.

    The new tokens, their positions and their cache index live in device tensors that the step
    reads and advances; attention reads the whole preallocated cache
    (:meth:`KVCache.read_whole`) under a mask that admits one more position per step. The
    prompt is prefilled as usual; the first step runs eagerly (it warms up the kernels), the
    second records the graph. Off CUDA (or with ``record=False``) every step runs eagerly,
    which is how the CPU tests check the static step against :class:`DecoderSession`.
    Position schemes with score biases (ALiBi) are not supported: their bias depends on the
    position in a way a recorded step would freeze.

    With ``compile=True`` (CPU) the step's forward pass goes through ``torch.compile`` instead
    of being recorded: the same fixed shapes make it one compiled graph per model, batch size
    and ``max_len`` (compiled at the first step, then reused by later sessions: the Python
    and dispatch of a few hundred small ops per token become a few fused kernels). Past
    torch's recompile limit (``torch._dynamo.config.recompile_limit`` shapes) torch warns and
    runs the step eagerly.
    """

    def __init__(
        self,
        model: DecoderLM,
        ids: Tensor,
        keep: Tensor | None,
        max_len: int,
        *,
        record: bool = True,
        compile: bool = False,
    ) -> None:
        super().__init__(model, ids, keep, max_len)
        device = ids.device
        b, p = ids.shape
        if _adds_score_bias(model):
            raise ValueError(
                f"{type(model.pos_emb).__name__} adds attention score biases, which a recorded "
                "decoding step cannot follow; use DecoderSession"
            )
        self._length = p  # positions filled once the prompt is in (host copy)
        self._index = torch.tensor([p], device=device)  # (1,) cache position of the new token
        self._tokens = torch.zeros(b, 1, dtype=torch.long, device=device)  # (B, 1)
        self._positions = self.next_position.clone()  # (B, 1)
        self._keys = torch.arange(max_len, device=device)  # (S,)
        allowed = (self._keys < p).expand(b, max_len)  # (B, S)
        if self.keep is not None:
            allowed = allowed & self.keep
        self._allowed = allowed[:, None, None, :].clone()  # (B, 1, 1, S)
        self._window = model.config.sliding_window
        self._record = record and device.type == "cuda" and not compile
        self._logits: Callable[..., Tensor] = model.logits
        if compile:  # the code around the kernels in C++ too; dynamo's guards check shapes
            self._logits = torch.compile(
                self._logits, dynamic=False, options={"cpp_wrapper": True, "size_asserts": False}
            )
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: Tensor | None = None
        self._static: StaticKVCache | None = None

    @staticmethod
    def records(model: DecoderLM, device: torch.device) -> bool:
        """Whether decoding ``model`` on ``device`` records CUDA graphs: on CUDA, unless the
        environment sets ``ZOO_CUDA_GRAPHS=0`` or the position scheme adds score biases."""
        return (
            device.type == "cuda"
            and os.environ.get("ZOO_CUDA_GRAPHS", "1") != "0"
            and not _adds_score_bias(model)
        )

    def _step(self) -> Tensor:
        """The recorded step: attend, advance the position and the index; logits ``(B, V)``."""
        if self._static is None:
            self._static = self.cache.read_whole(self._index)
        self._allowed.index_fill_(-1, self._index, True)  # the new token sees itself
        mask = self._allowed
        if self._window is not None:  # each query sees its `window` most recent keys
            mask = mask & (self._keys > self._index - self._window)
        logits = self._logits(
            self._tokens, None, self._positions, cache=self._static, last_only=True, mask=mask
        )
        self._positions += 1
        self._index += 1
        return logits[:, -1]

    def step(self, tokens: Tensor) -> Tensor:
        """Append ``tokens`` ``(B,)``; return the next logits ``(B, vocab)``."""
        if self._length >= self.cache.max_len:
            raise ValueError(
                f"the cache holds {self.cache.max_len} positions; another token overflows it"
            )
        self._length += 1
        self._tokens.copy_(tokens[:, None])
        if self._graph is None and self._record and self._static is not None:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    self._out = self._step()
            except RuntimeError as exc:
                raise RuntimeError(
                    "recording the decoding step as a CUDA graph failed (does a component wait "
                    "for the host, e.g. with .item() or .tolist()?); set ZOO_CUDA_GRAPHS=0 to "
                    f"decode eagerly: {exc}"
                ) from exc
            self._graph = graph
        if self._graph is not None and self._out is not None:
            self._graph.replay()
            return self._out.clone()
        return self._step()


def check_compilable(model: DecoderLM, device: torch.device) -> None:
    """Raise a clear error where ``compile=True`` decoding cannot work: off CPU (CUDA replays
    a recorded graph already), with score-bias positions, or without a C++ compiler for
    ``torch.compile``'s CPU kernels."""
    if device.type != "cpu":
        raise ValueError(
            f"compile=True compiles the CPU decoding step; on {device.type} decode without it "
            "(on CUDA every step already replays a recorded CUDA graph)"
        )
    if _adds_score_bias(model):
        raise ValueError(
            f"{type(model.pos_emb).__name__} adds attention score biases, which a compiled "
            "decoding step cannot follow; decode without compile=True"
        )
    check_cpp_compiler()


def check_cpp_compiler() -> None:
    """Raise :class:`~zoo.errors.CompileUnavailableError` where ``torch.compile`` finds no C++
    compiler to build its CPU kernels with."""
    from torch._inductor import cpp_builder  # the compiler lookup torch.compile makes

    try:
        cpp_builder.get_cpp_compiler()
    except RuntimeError as exc:
        raise CompileUnavailableError(
            "compile=True builds the decoding step with torch.compile, which needs a C++ "
            "compiler on CPU and found none: install one (e.g. `apt install g++`, or set CXX "
            f"to its path) or decode without compile=True ({exc})"
        ) from exc


def _adds_score_bias(model: DecoderLM) -> bool:
    """Whether the model's position scheme adds attention score biases (asked on ``meta``)."""
    return model.pos_emb.score_bias(1, 1, torch.device("meta")) is not None


def positions_from_mask(ids: Tensor, keep: Tensor | None) -> Tensor:
    """Position ids ``(B, T)``: 0..T-1, or counting real tokens only when there is padding."""
    if keep is None:
        return torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    return (keep.long().cumsum(dim=1) - 1).clamp(min=0)
