"""The model side of ``zoo serve``: the running requests' rows of one
:class:`zoo.nn.slots.SlotBatch`, their prompts prefilled a budget of tokens per step, and one
decoding step for those past their prompt, each picking its next token with its own settings
(:func:`zoo.generation.sampling.pick_each`, the picker :func:`zoo.generate` uses).

A request that joins gets a slot at once; the leading blocks of its prompt that a
:class:`~zoo.nn.prefix_cache.PrefixCache` holds are copied in, and the rest enters in chunks:
each step prefills a budget of prompt tokens (:class:`~zoo.serve.budget.PrefillBudget`: at
most ``prefill_chunk``, and while streams decode, what takes about ``max_stall`` decoding
steps), the chunks of the prompts waiting together in one left-padded forward pass
(:meth:`SlotBatch.extend`), so a long prompt never holds the running streams for longer than
one chunk. Its last chunk gives its first token;
from the next step on it decodes with the others. Its computed blocks are kept in the prefix
cache once its prompt is in, and again when it leaves (the reply too, which a chat's next turn
starts with).

With LoRA adapters (:mod:`zoo.nn.lora_bank`) each row applies its request's own, set before
every forward from the rows' requests, so a row's adapter follows its request whichever
slot it is in; the prefix cache keeps each adapter's keys apart (and each client's: see
:attr:`Request.cache_key <zoo.serve.request.Request.cache_key>`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ..generation.sampling import pick_each, seeded_generator
from ..nn.slot_step import slot_batch
from .budget import DEFAULT_MAX_STALL, DEFAULT_PREFILL_CHUNK, PrefillBudget

if TYPE_CHECKING:
    from ..nn.decoder import DecoderLM
    from ..nn.lora_bank import AdapterRows
    from ..nn.prefix_cache import PrefixCache
    from .request import Request

__all__ = ["DEFAULT_MAX_STALL", "DEFAULT_PREFILL_CHUNK", "Chunk", "Runner", "plan_chunks"]


@dataclasses.dataclass(frozen=True)
class Chunk:
    """The next ``size`` prompt tokens of ``request``, from position ``start``."""

    request: Request
    start: int
    size: int

    @property
    def last(self) -> bool:
        """Whether the chunk ends the prompt (it gives the first token)."""
        return self.start + self.size == len(self.request.prompt)


def plan_chunks(left: list[int], budget: int | None) -> list[int]:
    """How many tokens each of the first prompts waiting (``left``: the tokens each has left,
    in arrival order) prefills in the next pass, left-padded together: at most ``budget``
    tokens counting the padding (``None``: no bound). Takes the number of prompts that
    prefills the most real tokens (the fewest padded ones on a tie)."""
    if budget is None:
        return list(left)
    best: tuple[int, int] = (0, 0)  # (real tokens, -padded tokens)
    sizes: list[int] = []
    for m in range(1, min(len(left), budget) + 1):
        width = min(budget // m, max(left[:m]))
        chunk = [min(n, width) for n in left[:m]]
        score = (sum(chunk), sum(chunk) - m * width)
        if score > best:
            best, sizes = score, chunk
    return sizes


class Runner:
    """The slot batch of the running requests, and what runs on the model.

    Args:
        model: the decoder (in eval mode).
        max_rows: requests decoding at once (slots).
        max_len: positions per slot, prompt plus new tokens (default: the context length).
        adapters: the model's per-row adapter index (:func:`zoo.nn.lora_bank.attach_bank`),
            set from each request's :attr:`~zoo.serve.request.Request.adapter`.
        prefill_chunk: prompt tokens prefilled per step at most, padding included (``None``:
            whole prompts).
        max_stall: while streams decode, a step's prompt chunk is sized to take at most about
            this many decoding steps, as timed while it runs (``None``: only
            ``prefill_chunk`` bounds it).
        prefix_cache: where prompt prefixes' keys and values are kept between requests
            (``None``: nowhere).
        clock: seconds, for the timings (a test passes its own).
        compile, cuda_graphs: run the decoding step in fixed shapes, compiled on CPU
            (``compile``) or replaying CUDA graphs on CUDA (``cuda_graphs``), as
            :func:`zoo.nn.slot_step.slot_batch` decides (not with adapters).
    """

    def __init__(
        self,
        model: DecoderLM,
        max_rows: int,
        max_len: int | None = None,
        adapters: AdapterRows | None = None,
        *,
        prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
        max_stall: float | None = DEFAULT_MAX_STALL,
        prefix_cache: PrefixCache | None = None,
        clock: Callable[[], float] = time.perf_counter,
        compile: bool = False,
        cuda_graphs: bool = True,
    ) -> None:
        self.budget = PrefillBudget(prefill_chunk, max_stall)
        self.batch = slot_batch(
            model,
            max_rows,
            max_len,
            before_forward=self._select if adapters is not None else None,
            compile=compile,
            cuda_graphs=cuda_graphs,
        )
        self.adapters = adapters
        self.prefix_cache = prefix_cache
        # prompt tokens in the slot of each request still prefilling, in arrival order
        self._prefilled: dict[Request, int] = {}
        self._fed: dict[Request, list[int]] = {}  # tokens decoded into each slot after the prompt
        self._clock = clock

    def _select(self, requests: list[Request]) -> None:
        """Each row's adapter for the next forward: its request's."""
        if self.adapters is not None:
            self.adapters.set([r.adapter for r in requests])

    @property
    def max_rows(self) -> int:
        """Requests decoding at once."""
        return self.batch.max_rows

    @property
    def max_len(self) -> int:
        """Positions per request: its prompt plus its new tokens must fit."""
        return self.batch.max_len

    def __len__(self) -> int:
        return len(self.batch)

    def admit(self, request: Request) -> None:
        """Give ``request`` a slot, with the leading blocks of its prompt that the prefix
        cache holds copied in; the rest is prefilled by :meth:`prefill`."""
        if len(request.prompt) >= self.max_len:  # the slot batch says the same, later
            raise ValueError(
                f"the prompt has {len(request.prompt)} tokens, and a slot holds "
                f"{self.max_len} positions: no room for a new token"
            )
        request.generator = seeded_generator(request.config, self.batch.device)
        self.batch.open(request)
        cached = 0
        if self.prefix_cache is not None:
            match = self.prefix_cache.match(request.prompt, request.cache_key)
            self.prefix_cache.load(match, *self.batch.row_cache(request))
            cached = min(match.length, len(request.prompt) - 1)  # the last one gives logits
            self.batch.fill(request, cached)
        self._prefilled[request] = cached
        self._fed[request] = []

    @property
    def prefilling(self) -> list[Request]:
        """Requests whose prompts are not all in yet, in arrival order."""
        return list(self._prefilled)

    @property
    def decoding(self) -> list[Request]:
        """Requests past their prompts, in the batch's order."""
        return [r for r in self.batch.keys if r not in self._prefilled]

    def plan(self) -> list[Chunk]:
        """The prompt chunks the next :meth:`prefill` runs (see :func:`plan_chunks`)."""
        waiting = list(self._prefilled.items())
        budget = self.budget.tokens(decoding=len(self._prefilled) < len(self.batch))
        sizes = plan_chunks([len(r.prompt) - n for r, n in waiting], budget)
        return [Chunk(r, n, size) for (r, n), size in zip(waiting, sizes, strict=False)]

    def prefill(self, chunks: list[Chunk]) -> list[int]:
        """Run ``chunks`` (from :meth:`plan`) in one pass; return the first token of each
        request whose prompt they end, in ``chunks`` order."""
        start = self._clock()
        logits = self.batch.extend(
            [(c.request, c.request.prompt[c.start : c.start + c.size]) for c in chunks]
        )  # (M, vocab)
        ended = [i for i, c in enumerate(chunks) if c.last]
        for c in chunks:
            self._prefilled[c.request] += c.size
        for i in ended:
            request = chunks[i].request
            del self._prefilled[request]
            self._keep(request, request.prompt)
        requests = [chunks[i].request for i in ended]
        tokens = pick_each(
            logits[ended], [r.config for r in requests], [r.generator for r in requests]
        )  # the host waits for the device here: the timing is the pass's
        self.budget.prefilled(len(chunks) * max(c.size for c in chunks), self._clock() - start)
        return tokens

    def step(self, requests: list[Request]) -> list[int]:
        """One token for every request in ``requests`` (:attr:`decoding`): the token each
        picked."""
        start = self._clock()
        tokens = [r.last for r in requests]
        logits = self.batch.step(torch.tensor(tokens), requests)  # (N, vocab)
        for request, token in zip(requests, tokens, strict=True):
            self._fed[request].append(token)  # type: ignore[arg-type]
        configs = [r.config for r in requests]
        picked = pick_each(logits, configs, [r.generator for r in requests])
        self.budget.decoded(self._clock() - start)
        return picked

    def _keep(self, request: Request, tokens: list[int]) -> None:
        """Keep the blocks of ``tokens`` (in ``request``'s slot from position 0) in the
        prefix cache."""
        if self.prefix_cache is not None:
            self.prefix_cache.store(tokens, *self.batch.row_cache(request), request.cache_key)

    def remove(self, request: Request, keep: bool = True) -> None:
        """Free ``request``'s slot, if it has one, keeping what it computed in the prefix
        cache unless ``keep`` is false (it failed)."""
        if request not in self.batch.keys:
            return
        if keep:
            prefilled = self._prefilled.get(request)
            if prefilled is None:
                self._keep(request, request.prompt + self._fed[request])
            else:
                self._keep(request, request.prompt[:prefilled])
        self._prefilled.pop(request, None)
        self._fed.pop(request, None)
        self.batch.remove(request)

    def clear(self) -> None:
        """Free every slot."""
        self._prefilled.clear()
        self._fed.clear()
        self.batch.clear()
