"""The model side of ``zoo serve``: the running requests' rows of one
:class:`zoo.nn.slots.SlotBatch`, a prompt's prefill when it joins, and one decoding step for
all of them, each picking its next token with its own settings
(:func:`zoo.generation.sampling.pick_each`, the picker :func:`zoo.generate` uses). With
LoRA adapters (:mod:`zoo.nn.lora_bank`) each row applies its request's own, set before
every forward from the rows' requests, so a row's adapter follows its request whichever
slot it is in."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..generation.sampling import pick_each, seeded_generator
from ..nn.slots import SlotBatch

if TYPE_CHECKING:
    from ..nn.decoder import DecoderLM
    from ..nn.lora_bank import AdapterRows
    from .request import Request

__all__ = ["Runner"]


class Runner:
    """The slot batch of the running requests, and what runs on the model.

    Args:
        model: the decoder (in eval mode).
        max_rows: requests decoding at once (slots).
        max_len: positions per slot, prompt plus new tokens (default: the context length).
        adapters: the model's per-row adapter index (:func:`zoo.nn.lora_bank.attach_bank`),
            set from each request's :attr:`~zoo.serve.request.Request.adapter`.
    """

    def __init__(
        self,
        model: DecoderLM,
        max_rows: int,
        max_len: int | None = None,
        adapters: AdapterRows | None = None,
    ) -> None:
        self.batch: SlotBatch[Request] = SlotBatch(model, max_rows, max_len)
        self.adapters = adapters

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

    def prefill(self, request: Request) -> int:
        """Give ``request`` a slot, run its prompt and pick its first token."""
        request.generator = seeded_generator(request.config, self.batch.device)
        self._select([request])
        logits = self.batch.add(request, request.prompt)  # (vocab,)
        return pick_each(logits[None], [request.config], [request.generator])[0]

    @property
    def requests(self) -> list[Request]:
        """The running requests, in the batch's order."""
        return list(self.batch.keys)

    def step(self, requests: list[Request]) -> list[int]:
        """One token for every running request (``requests``: :attr:`requests`): the token
        each picked."""
        self._select(requests)
        logits = self.batch.step(torch.tensor([r.last for r in requests]))  # (N, vocab)
        configs = [r.config for r in requests]
        return pick_each(logits, configs, [r.generator for r in requests])

    def remove(self, request: Request) -> None:
        """Free ``request``'s slot, if it has one."""
        if request in self.batch.keys:
            self.batch.remove(request)

    def clear(self) -> None:
        """Free every slot."""
        self.batch.clear()
