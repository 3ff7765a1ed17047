"""Decoding sessions of :class:`zoo.nn.DecoderLM`: the prompt is run once (prefill), then
one token per step over a preallocated KV cache.

- :class:`DecoderSession`: dynamic shapes, the cache read up to its current length.
- :class:`StaticDecoderSession`: one fixed-shape step, recorded as a CUDA graph on CUDA or
  compiled with ``torch.compile`` on CPU.

:func:`start_session` picks one; callers pass their settings (``compile``,
``cuda_graphs``) in, nothing here reads the environment.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..errors import CompileUnavailableError
from ..kernels.pages import make_resident
from ..nn.base import activation_dtype
from ..nn.decoder import DecoderLM
from ..nn.masks import positions_from_mask
from .cache import KVCache, StaticKVCache
from .native_block import one_call
from .session import DecodingSession, RecomputeSession, context_overflow

__all__ = [
    "DecoderSession",
    "StaticDecoderSession",
    "check_compilable",
    "check_cpp_compiler",
    "start_decoding",
    "start_session",
]


def start_decoding(
    model: Any,
    input_ids: Tensor,
    keep: Tensor | None,
    max_new_tokens: int,
    *,
    start_id: int | None = None,
    compile: bool = False,
    cuda_graphs: bool = True,
) -> DecodingSession:
    """A decoding session of ``model`` over validated, left-padded prompt ids ``(B, T)`` with
    padding mask ``keep`` (``True`` = token): what :func:`zoo.generate`, ``zoo serve`` and the
    conformance kit decode through.

    A model that brings its own session (a method ``start_decoding(input_ids, keep,
    max_new_tokens, *, start_id)``, which an encoder-decoder must have: ``start_id`` is its
    first target token) gets it called, with ``compile`` and ``cuda_graphs`` where the method
    takes them; a :class:`~zoo.nn.DecoderLM` decodes over a KV cache (:func:`start_session`);
    any other decoder by recomputation (:class:`~zoo.runtime.session.RecomputeSession`).
    ``compile=True`` is refused (a ``ValueError``) for a session that cannot compile its step.
    CPU weights (memory-mapped from their file, or on the heap) move into one arena on huge
    pages first (:func:`zoo.kernels.pages.make_resident`: decoding streams them every step).
    """
    make_resident(model)
    own = getattr(model, "start_decoding", None)
    if callable(own):
        takes = inspect.signature(own).parameters
        options: dict[str, Any] = {"start_id": start_id}
        if "cuda_graphs" in takes:
            options["cuda_graphs"] = cuda_graphs
        if compile:
            if "compile" not in takes:
                _refuse_compile(model)
            options["compile"] = True
        session: DecodingSession = own(input_ids, keep, max_new_tokens, **options)
        return session
    if getattr(model, "is_encoder_decoder", False):
        raise NotImplementedError(
            f"{type(model).__name__} is an encoder-decoder: it must implement "
            "start_decoding() to generate (docs/plugins.md, 'What a model must provide')"
        )
    if isinstance(model, DecoderLM):
        return start_session(
            model, input_ids, keep, max_new_tokens, compile=compile, cuda_graphs=cuda_graphs
        )
    if compile:
        _refuse_compile(model)
    return RecomputeSession(model, input_ids, keep, max_new_tokens)


def _refuse_compile(model: Any) -> None:
    raise ValueError(
        f"{type(model).__name__} cannot compile its decoding step (its start_decoding "
        "takes no `compile`; zoo's DecoderLM can); generate without compile=True"
    )


def start_session(
    model: DecoderLM,
    input_ids: Tensor,
    keep: Tensor | None,
    max_new_tokens: int,
    *,
    compile: bool = False,
    cuda_graphs: bool = True,
) -> DecoderSession:
    """A decoding session over validated prompt ids ``(B, T)`` with padding mask ``keep``.

    On CUDA it replays a recorded graph per token (:class:`StaticDecoderSession`) unless
    ``cuda_graphs=False`` or the position scheme adds score biases. ``compile=True`` (CPU)
    runs each step through ``torch.compile`` instead, with the cache rounded up to a power of
    two (>= 64) so that other lengths reuse the compiled step.
    """
    max_len = input_ids.shape[1] + max_new_tokens
    if compile:
        check_compilable(model, input_ids.device)
        bucket = min(model.config.context_length, max(64, 1 << (max_len - 1).bit_length()))
        return StaticDecoderSession(model, input_ids, keep, max(max_len, bucket), compile=True)
    if cuda_graphs and StaticDecoderSession.records(model, input_ids.device):
        return StaticDecoderSession(model, input_ids, keep, max_len)
    return DecoderSession(model, input_ids, keep, max_len)


class DecoderSession:
    """Incremental decoding of a :class:`DecoderLM` with a preallocated KV cache."""

    def __init__(self, model: DecoderLM, ids: Tensor, keep: Tensor | None, max_len: int) -> None:
        c = model.config
        if max_len > c.context_length:
            raise context_overflow(ids.shape[1], max_len - ids.shape[1], c.context_length)
        dtype, device = activation_dtype(model)
        self.model = model
        self.cache = KVCache(
            c.n_layers,
            ids.shape[0],
            c.n_kv_heads or c.n_heads,
            max_len,
            c.head_size,
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

    def _cached_logits(self, ids: Tensor, keep: Tensor | None, positions: Tensor) -> Tensor:
        """The last position's logits of the new ``ids`` ``(B, T)``, their keys and values
        cached: in one call to zoo's CPU kernels where a step of one token of one sequence
        allows it (:func:`zoo.runtime.native_block.one_call`), else the model's forward pass;
        ``(B, 1, vocab)``."""
        fused = one_call(self.model, ids, keep, positions, self.cache)
        if fused is not None:
            return fused
        return self.model.logits(ids, keep, positions, cache=self.cache, last_only=True)

    def prefill(self) -> Tensor:
        """Run the prompt; return the logits of its last position, ``(B, vocab)``."""
        ids, t = self.prefix, self.prefix.shape[1]
        keep = self._keep(t)
        return self._cached_logits(ids, keep, positions_from_mask(ids, keep))[:, -1]

    def step(self, tokens: Tensor) -> Tensor:
        """Append ``tokens`` ``(B,)``; return the next logits ``(B, vocab)``."""
        length = self.cache.length + 1
        logits = self._cached_logits(tokens[:, None], self._keep(length), self.next_position)
        self.next_position = self.next_position + 1
        return logits[:, -1]

    def reorder(self, index: Tensor) -> None:
        """Make row ``i`` what row ``index[i]`` was (``(B,)`` row indices on the model's
        device): beam search's reordering of its hypotheses. The cache's filled positions
        move in place; the padding mask, the next positions and the prefix move with them."""
        self.cache.reorder(index)
        self._reorder_rows(index)

    def _reorder_rows(self, index: Tensor) -> None:
        if self.keep is not None:
            self.keep = self.keep.index_select(0, index)
        self.next_position = self.next_position.index_select(0, index)
        self.prefix = self.prefix.index_select(0, index)


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
        if model.pos_emb.adds_score_bias:
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
        self._record = record and device.type == "cuda" and not compile
        self._logits: Callable[..., Tensor] = model.logits
        if compile:  # the code around the kernels in C++ too; dynamo's guards check shapes
            from ..kernels.onednn import prepare_compile

            prepare_compile()
            self._logits = torch.compile(
                self._logits, dynamic=False, options={"cpp_wrapper": True, "size_asserts": False}
            )
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: Tensor | None = None
        self._static: StaticKVCache | None = None

    def reorder(self, index: Tensor) -> None:
        """:meth:`DecoderSession.reorder`, in place on the step's fixed buffers (a recorded
        graph reads them): the cache up to the positions written so far, each row's next
        position and which cache positions it attends to."""
        self.cache.reorder(index, self._length)
        self._reorder_rows(index)
        self._positions.copy_(self._positions.index_select(0, index))
        self._allowed.copy_(self._allowed.index_select(0, index))

    @staticmethod
    def records(model: DecoderLM, device: torch.device) -> bool:
        """Whether decoding ``model`` on ``device`` can record CUDA graphs: on CUDA, unless
        the position scheme adds score biases."""
        return device.type == "cuda" and not model.pos_emb.adds_score_bias

    def _step(self) -> Tensor:
        """The recorded step: attend, advance the position and the index; logits ``(B, V)``."""
        if self._static is None:
            self._static = self.cache.read_whole(self._index)
        self._allowed.index_fill_(-1, self._index, True)  # the new token sees itself
        masks = self.model.window_masks(self._allowed, self._index, self._keys)
        logits = self._logits(
            self._tokens, None, self._positions, cache=self._static, last_only=True, mask=masks
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
    if model.pos_emb.adds_score_bias:
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
