"""The engine of ``zoo serve``: one loop that decodes every request together.

Split as vLLM splits it: the :class:`~zoo.serve.scheduler.Scheduler` (plain Python, no
torch) decides each step: which requests join and leave the batch, and, under its token
budget, which decode and which prompt chunks of what length are prefilled (a
:class:`~zoo.serve.scheduler.StepPlan`); the :class:`~zoo.serve.runner.Runner` holds their
rows of a :class:`zoo.runtime.slots.SlotBatch` and executes the plan on the model;
:meth:`Engine.step` schedules, runs and updates, once. Requests hand
:class:`~zoo.serve.request.Request` s to :meth:`Engine.submit`; between two steps waiting
ones are admitted into free slots (with the prompt prefix a
:class:`~zoo.runtime.prefix_cache.PrefixCache` holds copied in), then one step picks every
decoding request's next token with its own settings and hands the text on through its
``emit`` callback, and prefills the plan's chunks of the prompts still coming in (at most
``prefill_chunk`` tokens, padding included, sized while streams decode to take about
``max_stall`` decoding steps; several prompts in one pass), so a long prompt delays the
running streams by one chunk per step, not by its whole prefill. A request leaves the batch
when it ends (an end-of-text id, a stop string, ``max_new_tokens``) or is cancelled (its
client went away), and its slot takes the next waiting request at once: continuous
batching.

An encoder-decoder (zoo's ``EncoderDecoder``: transformer-encdec, Marian, BART, T5) is served
the same way by an :class:`~zoo.serve.encdec_runner.EncoderDecoderRunner`: a request's prompt
is its source, encoded once as it joins, and what it prefills is its target's start token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

import torch

from ..adapters.lora_bank import attach_bank
from ..kernels.threads import DecodeThreads
from ..runtime.prefix_cache import PrefixCacheStats, prefix_cache_for
from .encdec_runner import EncoderDecoderRunner
from .prefill_budget import DEFAULT_MAX_STALL, DEFAULT_PREFILL_CHUNK
from .request import Event, Finish, Request
from .runner import Runner
from .scheduler import EngineStopped, QueueFull, Scheduler, StepPlan

if TYPE_CHECKING:
    from ..adapters.lora_bank import LoRAWeights
    from ..nn.base import ZooModel
    from ..nn.decoder import DecoderLM

__all__ = ["Engine", "EngineStopped", "Event", "Finish", "QueueFull", "Request"]

#: The prefix cache's memory unless told otherwise.
DEFAULT_PREFIX_CACHE_BYTES = 512 * 2**20


class Engine:
    """Decodes submitted requests in one continuously refilled batch: in the thread that
    calls :meth:`run`, or on a thread of its own after :meth:`start`.

    ``zoo serve`` runs it on the process's main thread (the HTTP server has a thread of its
    own): the main thread owns the OpenMP worker pool that PyTorch's CPU kernels use. Started
    from any other thread once the main one has used it, each parallel kernel wakes a second
    pool on a machine already full of threads, and a decoding step takes markedly longer
    (docs/benchmarks.md, "Figures behind design choices", has the figures).

    Args:
        model: the decoder to serve (in eval mode from here on), or an encoder-decoder
            (:class:`~zoo.serve.encdec_runner.EncoderDecoderRunner`; without adapters,
            prefix cache or compiled step).
        max_batch: requests decoding at once (slots).
        max_queue: requests that may wait for a slot; more are refused.
        max_len: positions per slot, prompt plus new tokens (default: the context length);
            for an encoder-decoder, the target's (start token plus new tokens) and the most
            source tokens a request may have.
        adapters: LoRA adapters by name (``zoo.adapters.Adapter`` s, checked against the
            base by the caller), attached to ``model`` as one bank (:mod:`zoo.adapters.lora_bank`):
            a request picks one by :attr:`adapter_ids` (0: the base), and requests of
            different adapters share each step.
        prefill_chunk: prompt tokens a step prefills at most, padding included (``None``:
            whole prompts, each in the step after it joins).
        max_stall: while streams decode, a step's prompt chunk is sized to take at most about
            this many decoding steps (times the prompts waiting per stream where more wait
            than decode), as timed while the engine runs (``None``: only
            ``prefill_chunk`` bounds it).
        prefix_cache_bytes: memory for the keys and values of prompt prefixes kept between
            requests (0: none kept; ``None``: one whole context's).
        decode_threads: the CPU threads of each step (:class:`zoo.kernels.threads.DecodeThreads`:
            ``None`` the cores other processes leave free, ``0`` torch's count, ``N`` that
            many; ``Settings.decode_threads``, ``ZOO_DECODE_THREADS``).
        compile: compile the decoding step with ``torch.compile`` (CPU; a few fixed shapes,
            each compiled at its first step: :mod:`zoo.runtime.slot_step`).
        cuda_graphs: on CUDA, replay the decoding step as recorded CUDA graphs.
        clock: seconds, to time the steps for the prefill budget (a test passes its own).
    """

    def __init__(
        self,
        model: DecoderLM | ZooModel,
        *,
        max_batch: int = 8,
        max_queue: int = 64,
        max_len: int | None = None,
        adapters: Mapping[str, LoRAWeights] | None = None,
        prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
        max_stall: float | None = DEFAULT_MAX_STALL,
        prefix_cache_bytes: int | None = DEFAULT_PREFIX_CACHE_BYTES,
        decode_threads: int | None = None,
        compile: bool = False,
        cuda_graphs: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.scheduler: Scheduler[Request] = Scheduler(
            max_batch, max_queue, prefill_chunk=prefill_chunk, max_stall=max_stall
        )
        self._clock = clock
        model.eval()
        self.model = model
        #: Each adapter's index, the :attr:`Request.adapter <zoo.serve.request.Request.adapter>`
        #: that applies it.
        self.adapter_ids: dict[str, int] = {name: i for i, name in enumerate(adapters or {}, 1)}
        self.runner: Runner | EncoderDecoderRunner
        if self.encoder_decoder:
            _check_encoder_decoder(adapters, compile)
            self.runner = EncoderDecoderRunner(model, max_batch, max_len)
        else:
            decoder = cast("DecoderLM", model)  # SlotBatch checks it
            rows = attach_bank(decoder, adapters) if adapters else None
            self.runner = Runner(
                decoder,
                max_batch,
                max_len,
                rows,
                compile=compile,
                cuda_graphs=cuda_graphs,
                prefix_cache=prefix_cache_for(decoder, prefix_cache_bytes),
            )
        self._threads = DecodeThreads.for_device(self.runner.batch.device, decode_threads)
        self._thread = threading.Thread(target=self.run, name="zoo-serve-engine", daemon=True)

    @property
    def encoder_decoder(self) -> bool:
        """Whether the model is an encoder-decoder: a request's prompt is its source."""
        return bool(getattr(self.model, "is_encoder_decoder", False))

    @property
    def max_len(self) -> int:
        """Positions per request: its prompt plus its new tokens must fit."""
        return self.runner.max_len

    @property
    def max_batch(self) -> int:
        """Requests decoding at once."""
        return self.scheduler.max_running

    @property
    def max_queue(self) -> int:
        """Requests that may wait for a slot."""
        return self.scheduler.max_queue

    @property
    def capacity(self) -> int:
        """Requests the engine holds at most (decoding plus waiting): what one HTTP request
        may ask for at most."""
        return self.scheduler.capacity

    @property
    def running(self) -> int:
        """Requests decoding now."""
        return self.scheduler.running

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot."""
        return self.scheduler.waiting

    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """What the prefix cache holds and has done (``None``: none is kept)."""
        cache = self.runner.prefix_cache
        return cache.stats() if cache is not None else None

    def start(self) -> None:
        """Run the engine on a thread of its own (see :meth:`run`)."""
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Take no more work, end what is left with an error, and wait for the engine's own
        thread if :meth:`start` started one (:meth:`run` returns soon after)."""
        self.scheduler.stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, requests: Sequence[Request]) -> None:
        """Queue ``requests`` for decoding (all or none).

        Raises:
            QueueFull: they do not fit in the free slots plus the waiting queue.
            EngineStopped: the engine is shutting down.
        """
        self.scheduler.submit(requests)

    def run(self) -> None:
        """Decode in the calling thread until :meth:`stop`: :meth:`step` while there is
        work, idle while there is none."""
        try:
            with torch.inference_mode():
                while self.scheduler.wait():
                    self.step()
        finally:  # stopped, or a bug: every request still open gets its answer
            self._fail_all("the server is shutting down")

    def step(self) -> None:
        """Schedule (admit waiting requests, drop cancelled ones), have the scheduler plan
        the step (:meth:`Scheduler.plan <zoo.serve.scheduler.Scheduler.plan>`), run its
        decoding step for the requests past their prompts and then its prompt chunks, and
        update each request with its token (its text, its end)."""
        schedule = self.scheduler.schedule()
        for request in schedule.cancelled:
            self.runner.remove(request)
            request.end("cancelled")
        failed = [r for r in schedule.admitted if not self._admit(r)]
        _flush([*failed, *schedule.cancelled])
        plan = self.scheduler.plan()
        if plan.decodes and plan.chunks:
            with self._threads.step():
                both = self._step_and_prefill(plan)
            if both is not None:
                _flush(both)
                return
        if plan.decodes:
            with self._threads.step():
                decoded = self._decode(list(plan.decodes))
            _flush(decoded)
        if plan.chunks:
            with self._threads.step():
                prefilled = self._prefill(plan)
            _flush(prefilled)

    def _admit(self, request: Request) -> bool:
        """Give ``request`` a slot, and tell the scheduler what of its prompt is left;
        ``False`` if that failed (it has ended)."""
        try:
            cached = self.runner.admit(request)
        except Exception as exc:  # this prompt only: the others go on
            self._fail([request], exc)
            return False
        self.scheduler.joined(request, self.runner.prompt_length(request), cached)
        return True

    def _prefill(self, plan: StepPlan[Request]) -> list[Request]:
        """Run the plan's prompt chunks; those that end a prompt give its first token.
        Returns the chunks' requests."""
        requests = [c.request for c in plan.chunks]
        start = self._clock()
        try:
            tokens = self.runner.prefill(plan.chunks)
        except Exception as exc:  # these prompts only: the others go on
            self._fail(requests, exc)
            return requests
        self.scheduler.budget.prefilled(plan.padded, self._clock() - start, len(plan.decodes))
        self._update([c.request for c in plan.chunks if c.last], tokens)
        return requests

    def _step_and_prefill(self, plan: StepPlan[Request]) -> list[Request] | None:
        """The plan's decoding step and its prompt chunks in one pass where the runner can
        (``None``: nothing run, and they run in turn); returns their requests."""
        requests = list(plan.decodes)
        prefilling = [c.request for c in plan.chunks]
        start = self._clock()
        try:
            both = self.runner.step_and_prefill(requests, plan.chunks)
        except Exception as exc:  # e.g. out of memory: these requests fail, the server stays
            self._fail(requests + prefilling, exc)
            return requests + prefilling
        if both is None:
            return None
        self.scheduler.budget.mixed(plan.padded, self._clock() - start, len(requests))
        self._update(requests, both[0])
        self._update([c.request for c in plan.chunks if c.last], both[1])
        return requests + prefilling

    def _decode(self, requests: list[Request]) -> list[Request]:
        """One token for each of ``requests`` (past their prompts); returns them."""
        start = self._clock()
        try:
            tokens = self.runner.step(requests)
        except Exception as exc:  # e.g. out of memory: these requests fail, the server stays
            self._fail(requests, exc)
            return requests
        self.scheduler.budget.decoded(self._clock() - start, len(requests))
        self._update(requests, tokens)
        return requests

    def _update(self, requests: list[Request], tokens: list[int]) -> None:
        """Hand each request its token; those that end leave the batch."""
        for request, token in zip(requests, tokens, strict=True):
            try:
                ended = request.take(token)
            except Exception as exc:  # e.g. its tokenizer cannot decode the id: it alone fails
                request.end("error", f"{type(exc).__name__}: {exc}")
                ended = True
            if ended:
                self._retire(request)

    def _retire(self, request: Request, keep: bool = True) -> None:
        self.runner.remove(request, keep)
        self.scheduler.finish(request)

    def _fail(self, requests: list[Request], exc: Exception) -> None:
        """End ``requests`` with ``exc`` and free their slots (nothing they computed is
        kept)."""
        for request in requests:
            self._retire(request, keep=False)
            request.end("error", f"{type(exc).__name__}: {exc}")

    def _fail_all(self, message: str) -> None:
        left = self.scheduler.drain()  # submit refuses from here on
        self.runner.clear()
        for request in left:
            request.end("error", message)
        _flush(left)


def _check_encoder_decoder(adapters: Mapping[str, LoRAWeights] | None, compile: bool) -> None:
    """Refuse what an encoder-decoder is not served with."""
    if adapters:
        raise ValueError(
            "zoo serve applies LoRA adapters per row to decoder-only models; for an "
            "encoder-decoder merge the adapter into the model (zoo merge) and serve that"
        )
    if compile:
        raise ValueError(
            "compile=True compiles the decoder-only serving step; an encoder-decoder is "
            "served eagerly: leave it out (zoo serve: drop --compile)"
        )


def _flush(requests: list[Request]) -> None:
    """Call the ``flush`` of ``requests`` that have one, each distinct one once."""
    for flush in {r.flush for r in requests if r.flush is not None}:
        flush()
