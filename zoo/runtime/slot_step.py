"""A fast decoding step for continuous batching: :class:`StaticSlotBatch` runs
:meth:`SlotBatch.step <zoo.runtime.slots.SlotBatch.step>` in a few fixed shapes, recorded as CUDA
graphs on CUDA or compiled with ``torch.compile`` on CPU, as :class:`~zoo.runtime.decoding.
StaticDecoderSession` does for one stream.

A step's pass runs on the rows ``[0, used)`` and reads the first ``max length + 1``
positions; both change at nearly every step. The static step pads them to buckets instead:
the rows to a power of two (at most ``max_rows``) and the positions read to a power of two of
at least 64 (at most ``max_len``), so a handful of shapes serve every step (see
:meth:`StaticSlotBatch.shapes`). A padded row, like a row not stepped, writes only where its
own next token goes (a free slot: its position 0; a full slot: its last position, which it
never reads again), and its logits are dropped. The tokens and lengths live in persistent
device tensors that the pass reads; the masks and the cache index are computed from them
inside the pass, so it waits for nothing on the host.

On CUDA each shape's first step runs eagerly (it warms the kernels up), its second is recorded
as a CUDA graph and every later one replays it. With ``compile=True`` (CPU) the pass goes
through ``torch.compile(dynamic=False)``, one compiled graph per shape, compiled at its first
step. :func:`slot_batch` picks the plain or the static batch, as
:func:`~zoo.runtime.decoding.start_session` picks a session.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

import torch
from torch import Tensor

from ..nn.base import activation_dtype, chosen_on_host
from ..nn.decoder import DecoderLM
from .decoding import check_compilable
from .slots import SlotBatch

__all__ = ["MIN_SPAN", "StaticSlotBatch", "row_bucket", "slot_batch", "span_bucket"]

K = TypeVar("K", bound=Hashable)

#: The fewest positions a static step reads (shorter spans are padded to it).
MIN_SPAN = 64


def row_bucket(used: int, max_rows: int) -> int:
    """The rows a static step runs for ``used`` rows: the next power of two, at most
    ``max_rows``."""
    return min(max_rows, 1 << (used - 1).bit_length())


def span_bucket(need: int, max_len: int) -> int:
    """The positions a static step reads when ``need`` are needed: the next power of two, at
    least :data:`MIN_SPAN`, at most ``max_len``."""
    return min(max_len, max(MIN_SPAN, 1 << (need - 1).bit_length()))


def _buckets(top: int, least: int) -> list[int]:
    """Every bucket up to ``top``: powers of two from ``least``, then ``top``."""
    sizes = []
    size = least
    while size < top:
        sizes.append(size)
        size *= 2
    return [*sizes, top]


def slot_batch(
    model: DecoderLM,
    max_rows: int,
    max_len: int | None = None,
    *,
    before_forward: Callable[[list[K]], None] | None = None,
    compile: bool = False,
    cuda_graphs: bool = True,
) -> SlotBatch[K]:
    """A :class:`SlotBatch`, static where that pays: with ``compile=True`` (CPU) a
    :class:`StaticSlotBatch` whose step is compiled; on CUDA one whose step replays CUDA
    graphs, unless ``cuda_graphs=False`` or the rows apply LoRA adapters (``before_forward``
    or a :mod:`~zoo.adapters.lora_bank` on the model: which adapter a row applies is decided on the
    host, which a recorded step would freeze). Otherwise the plain, eager batch."""
    if compile:
        if before_forward is not None:
            raise ValueError(
                "compile=True compiles a step without per-row LoRA adapters; serve the "
                "adapters without compile=True"
            )
        return StaticSlotBatch(model, max_rows, max_len, compile=True)
    if (
        cuda_graphs
        and StaticSlotBatch.records(model)
        and before_forward is None
        and not chosen_on_host(model)
    ):
        return StaticSlotBatch(model, max_rows, max_len)
    return SlotBatch(model, max_rows, max_len, before_forward=before_forward)


def _allow_recompiles(shapes: int) -> None:
    """Let torch compile the step in ``shapes`` shapes (and a few more for other batches)
    before it gives up and runs eagerly: its default limit is 8 per function."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 2 * shapes)


class StaticSlotBatch(SlotBatch[K]):
    """A :class:`SlotBatch` whose :meth:`step` runs in fixed shapes: replayed as a CUDA graph
    per shape on CUDA, compiled per shape with ``compile=True`` (CPU), and eagerly otherwise
    (``record=False``, or on CPU without ``compile``: how the tests check it against the
    plain step). Everything else (:meth:`open`, :meth:`extend`, :meth:`fill`,
    :meth:`remove`) is the plain batch's.

    Args:
        model, max_rows, max_len: as for :class:`SlotBatch` (no ``before_forward``: see
            :func:`slot_batch`).
        record: on CUDA, record each shape's step as a CUDA graph (its second use).
        compile: compile each shape's step with ``torch.compile`` (CPU only).
    """

    def __init__(
        self,
        model: DecoderLM,
        max_rows: int,
        max_len: int | None = None,
        *,
        record: bool = True,
        compile: bool = False,
    ) -> None:
        super().__init__(model, max_rows, max_len)
        if chosen_on_host(model):
            raise ValueError(
                "a static slot batch cannot follow per-row LoRA adapters (each row's adapter "
                "is picked on the host); use SlotBatch"
            )
        self._tokens = torch.zeros(self.max_rows, dtype=torch.long, device=self.device)  # (R,)
        self._lengths_in = torch.zeros(self.max_rows, dtype=torch.long, device=self.device)
        self._record = record and self.device.type == "cuda" and not compile
        self._run: Callable[[Tensor, Tensor, int], Tensor] = self._forward_rows
        if compile:
            check_compilable(model, self.device)
            from ..kernels.onednn import prepare_compile

            prepare_compile()
            _allow_recompiles(len(self.shapes()))
            self._run = torch.compile(
                self._forward_rows,
                dynamic=False,
                options={"cpp_wrapper": True, "size_asserts": False},
            )
        self._warm: set[tuple[int, int]] = set()  # shapes run once (CUDA: eager warm-up)
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}

    @staticmethod
    def records(model: DecoderLM) -> bool:
        """Whether stepping ``model`` replays CUDA graphs: on CUDA (a slot batch's model adds
        no score biases)."""
        return activation_dtype(model)[1].type == "cuda"

    def shapes(self) -> list[tuple[int, int]]:
        """Every ``(rows, positions read)`` shape a step may run in: at most this many CUDA
        graphs are recorded, or compiled graphs built."""
        rows = _buckets(self.max_rows, 1)
        spans = _buckets(self.max_len, min(MIN_SPAN, self.max_len))
        return [(r, s) for r in rows for s in spans]

    @property
    def shapes_run(self) -> list[tuple[int, int]]:
        """The shapes stepped so far (each compiled, or recorded at its second step)."""
        return sorted(self._warm)

    def _step_logits(self, rows: list[int], tokens: Tensor) -> Tensor:
        """The step's pass in its bucket's shape: the logits ``(N, vocab)`` of ``rows``."""
        n_rows = row_bucket(max(rows) + 1, self.max_rows)
        span = span_bucket(max(self._lengths[r] for r in rows) + 1, self.max_len)
        last = self.max_len - 1  # a full row (never stepped again) writes at its last position
        lengths = [min(n, last) for n in self._lengths[:n_rows]]
        lengths += [0] * (n_rows - len(lengths))  # free slots write at their position 0
        self._lengths_in[:n_rows].copy_(torch.tensor(lengths))  # (R_b,)
        index = torch.tensor(rows, device=self.device)  # (N,)
        self._tokens.zero_()
        self._tokens.index_copy_(0, index, tokens.to(self.device))
        logits = self._pass(n_rows, span)  # (R_b, vocab)
        if not self._record and rows == list(range(n_rows)):
            return logits  # a fresh tensor (a CUDA graph's output is overwritten by its replay)
        return logits.index_select(0, index)  # (N, vocab), a copy

    def _pass(self, n_rows: int, span: int) -> Tensor:
        """The forward pass over rows ``[0, n_rows)`` reading ``span`` positions: eager or
        compiled, or the replay of its CUDA graph (recorded at the shape's second use)."""
        tokens, lengths = self._tokens[:n_rows], self._lengths_in[:n_rows]
        shape = (n_rows, span)
        if not self._record or shape not in self._warm:
            self._warm.add(shape)
            return self._run(tokens, lengths, span)
        if shape not in self._graphs:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    out = self._run(tokens, lengths, span)
            except RuntimeError as exc:
                raise RuntimeError(
                    "recording the slot batch's step as a CUDA graph failed (does a component "
                    "wait for the host, e.g. with .item()?); set ZOO_CUDA_GRAPHS=0 to step "
                    f"eagerly: {exc}"
                ) from exc
            self._graphs[shape] = (graph, out)
        graph, out = self._graphs[shape]
        graph.replay()
        return out
