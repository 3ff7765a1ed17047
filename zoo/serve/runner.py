"""The model side of ``zoo serve``: the running requests' rows of one
:class:`zoo.runtime.slots.SlotBatch`, and the execution of each step the scheduler plans
(:class:`~zoo.serve.scheduler.StepPlan`): one decoding step for the requests past their
prompt, each picking its next token with its own settings
(:func:`zoo.generation.sampling.pick_each`, the picker :func:`zoo.generate` uses), and the
step's prompt chunks in one left-padded forward pass (:meth:`SlotBatch.extend`). What runs,
and how many prompt tokens, is the scheduler's decision, not the runner's.

A request that joins gets a slot at once; the leading blocks of its prompt that a
:class:`~zoo.runtime.prefix_cache.PrefixCache` holds are copied in (:meth:`Runner.admit`
says how many tokens), and the rest enters in the chunks the scheduler plans. Its last chunk
gives its first token; from the next step on it decodes with the others. Its computed blocks
are kept in the prefix cache once its prompt is in, and again when it leaves (the reply too,
which a chat's next turn starts with).

With LoRA adapters (:mod:`zoo.adapters.lora_bank`) each row applies its request's own, set before
every forward from the rows' requests, so a row's adapter follows its request whichever
slot it is in; the prefix cache keeps each adapter's keys apart (and each client's: see
:attr:`Request.cache_key <zoo.serve.request.Request.cache_key>`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..generation.sampling import pick_each, seeded_generator
from ..runtime.slot_step import slot_batch

if TYPE_CHECKING:
    from torch import Tensor

    from ..adapters.lora_bank import AdapterRows
    from ..nn.decoder import DecoderLM
    from ..runtime.prefix_cache import PrefixCache
    from .request import Request
    from .scheduler import Chunk

__all__ = ["Runner"]


class Runner:
    """The slot batch of the running requests, and what runs on the model.

    Args:
        model: the decoder (in eval mode).
        max_rows: requests decoding at once (slots).
        max_len: positions per slot, prompt plus new tokens (default: the context length).
        adapters: the model's per-row adapter index (:func:`zoo.adapters.lora_bank.attach_bank`),
            set from each request's :attr:`~zoo.serve.request.Request.adapter`.
        prefix_cache: where prompt prefixes' keys and values are kept between requests
            (``None``: nowhere).
        compile, cuda_graphs: run the decoding step in fixed shapes, compiled on CPU
            (``compile``) or replaying CUDA graphs on CUDA (``cuda_graphs``), as
            :func:`zoo.runtime.slot_step.slot_batch` decides (not with adapters).
    """

    def __init__(
        self,
        model: DecoderLM,
        max_rows: int,
        max_len: int | None = None,
        adapters: AdapterRows | None = None,
        *,
        prefix_cache: PrefixCache | None = None,
        compile: bool = False,
        cuda_graphs: bool = True,
    ) -> None:
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
        # prompt tokens in the slot of each request still prefilling (what remove keeps)
        self._prefilled: dict[Request, int] = {}
        self._fed: dict[Request, list[int]] = {}  # tokens decoded into each slot after the prompt

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

    def prompt_length(self, request: Request) -> int:
        """What the scheduler prefills of ``request`` once it has joined: its prompt."""
        return len(request.prompt)

    def admit(self, request: Request) -> int:
        """Give ``request`` a slot, with the leading blocks of its prompt that the prefix
        cache holds copied in; return how many prompt tokens that is (the rest is prefilled
        by :meth:`prefill`, in the chunks the scheduler plans)."""
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
        return cached

    def prefill(self, chunks: Sequence[Chunk[Request]]) -> list[int]:
        """Run ``chunks`` (a :class:`~zoo.serve.scheduler.StepPlan`'s) in one pass; return the
        first token of each request whose prompt they end, in ``chunks`` order.

        Raises:
            ValueError: a chunk does not continue its request's prompt where it stands.
        """
        self._check(chunks)
        return self._prefilled_tokens(chunks, self.batch.extend(self._pieces(chunks)))

    def step(self, requests: Sequence[Request]) -> list[int]:
        """One token for every request in ``requests`` (a plan's decodes, past their
        prompts): the token each picked."""
        tokens = [r.last for r in requests]
        logits = self.batch.step(torch.tensor(tokens), requests)  # (N, vocab)
        return self._stepped_tokens(requests, tokens, logits)

    def step_and_prefill(
        self, requests: Sequence[Request], chunks: Sequence[Chunk[Request]]
    ) -> tuple[list[int], list[int]] | None:
        """:meth:`step` for ``requests`` and :meth:`prefill` for ``chunks`` in one pass, where
        the slot batch's one-call step applies (:meth:`SlotBatch.step_and_extend
        <zoo.runtime.slots.SlotBatch.step_and_extend>`): the tokens each picked, and the
        first tokens of the prompts the chunks end; ``None`` (nothing run) elsewhere."""
        self._check(chunks)
        tokens = [r.last for r in requests]
        both = self.batch.step_and_extend(torch.tensor(tokens), requests, self._pieces(chunks))
        if both is None:
            return None
        stepped, prefilled = both
        return (
            self._stepped_tokens(requests, tokens, stepped),
            self._prefilled_tokens(chunks, prefilled),
        )

    def _check(self, chunks: Sequence[Chunk[Request]]) -> None:
        for c in chunks:
            if c.start != self._prefilled.get(c.request) or c.start + c.length > len(
                c.request.prompt
            ):
                raise ValueError(
                    f"a chunk of {c.length} tokens from {c.start} does not continue a prompt "
                    f"of {len(c.request.prompt)} tokens with "
                    f"{self._prefilled.get(c.request)} in: plan chunks with the scheduler"
                )

    @staticmethod
    def _pieces(chunks: Sequence[Chunk[Request]]) -> list[tuple[Request, list[int]]]:
        return [(c.request, c.request.prompt[c.start : c.start + c.length]) for c in chunks]

    def _prefilled_tokens(self, chunks: Sequence[Chunk[Request]], logits: Tensor) -> list[int]:
        """Count the chunks in (``logits`` ``(M, vocab)``, theirs) and pick the first token
        of each request whose prompt they end."""
        ended = [i for i, c in enumerate(chunks) if c.last]
        for c in chunks:
            self._prefilled[c.request] += c.length
        for i in ended:
            request = chunks[i].request
            del self._prefilled[request]
            self._keep(request, request.prompt)
        requests = [chunks[i].request for i in ended]
        return pick_each(
            logits[ended], [r.config for r in requests], [r.generator for r in requests]
        )  # the host waits for the device here: the caller's timing is the pass's

    def _stepped_tokens(
        self, requests: Sequence[Request], tokens: list[int | None], logits: Tensor
    ) -> list[int]:
        """Record the tokens fed to ``requests`` and pick each one's next from ``logits``
        ``(N, vocab)``."""
        for request, token in zip(requests, tokens, strict=True):
            self._fed[request].append(token)  # type: ignore[arg-type]
        configs = [r.config for r in requests]
        return pick_each(logits, configs, [r.generator for r in requests])

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
