"""The model side of ``zoo serve`` for an encoder-decoder: a completion's prompt is the source
(as TGI serves T5), its reply the target.

:class:`EncoderDecoderRunner` stands where :class:`~zoo.serve.runner.Runner` stands for a
decoder, with the same calls, on a :class:`zoo.runtime.encdec_slots.EncoderDecoderSlots`. A
request that joins has its source encoded at once, alone, into its slot (:meth:`admit`: the
encoder runs once per request, its cross-attention keys and values kept in the slot); what
the scheduler then prefills of it is one token, the target's start token
(:meth:`prompt_length`), whose pass gives its first new token; from the next step on it
decodes with the others. Each request picks its tokens with its own settings
(:func:`zoo.generation.sampling.pick_each`) under the constraints its settings ask for
(:class:`zoo.generation.constraints.Constraints`: a checkpoint's ``bad_words_ids``,
``no_repeat_ngram_size``, forced ends...; read from ``generation_config.json`` by
:func:`source_settings`), exactly as :func:`zoo.generate` picks for one source.

No prefix cache (a source is encoded whole, and two requests rarely share one), no LoRA
adapters and no fixed-shape step: the engine refuses those for an encoder-decoder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..generation.checkpoint_defaults import checkpoint_defaults
from ..generation.constraints import Constraints
from ..generation.sampling import pick_each, seeded_generator
from ..runtime.encdec_slots import EncoderDecoderSlots

if TYPE_CHECKING:
    from ..generation import GenerationConfig
    from ..runtime.prefix_cache import PrefixCache
    from ..tokenizers import Tokenizer
    from .request import Request
    from .scheduler import Chunk

__all__ = ["SOURCE_SETTINGS", "EncoderDecoderRunner", "source_settings"]

#: The :class:`~zoo.generation.GenerationConfig` fields a served target takes from the
#: checkpoint's ``generation_config.json`` (beam search's are not served; the length is the
#: request's ``max_tokens``).
SOURCE_SETTINGS = (
    "start_id",
    "no_repeat_ngram_size",
    "min_new_tokens",
    "min_length",
    "bad_words_ids",
    "forced_bos_id",
    "forced_eos_id",
)


def source_settings(model: Any, tokenizer: Tokenizer) -> dict[str, Any]:
    """What every request's settings take from ``model``'s ``generation_config.json``
    (:data:`SOURCE_SETTINGS`) and, for the start token where the file names none, from the
    tokenizer's bos id, with the tokenizer's end ids, as :func:`zoo.generate` takes them.

    Raises:
        ValueError: neither names a start token (the decoder's first input).
    """
    found = checkpoint_defaults(model)
    settings = {name: found[name] for name in SOURCE_SETTINGS if name in found}
    settings.setdefault("start_id", tokenizer.bos_id)
    settings["stop_ids"] = tuple(tokenizer.end_ids)  # the ends the constraints know
    if settings["start_id"] is None:
        raise ValueError(
            f"an encoder-decoder's target starts with a start token, and neither the model's "
            f"generation_config.json (decoder_start_token_id) nor its tokenizer "
            f"({tokenizer.name}: no bos id) names one; load the model with its "
            "generation_config.json or serve it with a tokenizer that has a bos token"
        )
    return settings


class EncoderDecoderRunner:
    """The slots of the running requests of an encoder-decoder, and what runs on the model.

    Args:
        model: an encoder-decoder built like zoo's ``EncoderDecoder`` (in eval mode).
        max_rows: requests decoding at once (slots).
        max_len: target positions per slot (the start token plus the new tokens) and the most
            source tokens a request may have (default: the context length).
    """

    #: No prompt prefix is kept between requests.
    prefix_cache: PrefixCache | None = None

    def __init__(self, model: object, max_rows: int, max_len: int | None = None) -> None:
        self.batch: EncoderDecoderSlots[Request] = EncoderDecoderSlots(model, max_rows, max_len)
        self._ids: dict[Request, list[int]] = {}  # the start token and the tokens picked
        self._rules: dict[Request, Constraints | None] = {}

    @property
    def max_rows(self) -> int:
        """Requests decoding at once."""
        return self.batch.max_rows

    @property
    def max_len(self) -> int:
        """Target positions per request (its start token plus its new tokens), and the most
        tokens its source may have."""
        return self.batch.max_len

    def __len__(self) -> int:
        return len(self.batch)

    def prompt_length(self, request: Request) -> int:
        """What the scheduler prefills of ``request`` once it has joined: its start token
        (the source is encoded as it joins)."""
        return 1

    def admit(self, request: Request) -> int:
        """Encode ``request``'s source into a free slot; return the tokens of its prompt
        already in (none: its start token runs in the step the scheduler plans)."""
        config = request.config
        if config.start_id is None:
            raise ValueError("an encoder-decoder's request needs start_id in its settings")
        if config.max_new_tokens >= self.max_len:
            raise ValueError(
                f"max_new_tokens={config.max_new_tokens} plus the start token exceeds the "
                f"{self.max_len} target positions of a slot"
            )
        rules = Constraints.of(
            config, 1, config.max_new_tokens, self.batch.model.config.vocab_size, self.batch.device
        )
        request.generator = seeded_generator(config, self.batch.device)
        self.batch.open(request, request.prompt)
        self._ids[request] = [config.start_id]
        self._rules[request] = rules
        return 0

    def prefill(self, chunks: Sequence[Chunk[Request]]) -> list[int]:
        """Step the start token of each of ``chunks``' requests (each chunk is a request's
        whole one-token prompt); return each one's first token, in ``chunks`` order."""
        self._check(chunks)
        return self.step([c.request for c in chunks])

    def step_and_prefill(
        self, requests: Sequence[Request], chunks: Sequence[Chunk[Request]]
    ) -> tuple[list[int], list[int]]:
        """:meth:`step` for ``requests`` and :meth:`prefill` for ``chunks`` in one step of
        the batch (a prefill steps the start token): the tokens each picked, and each chunk's
        request's first token."""
        self._check(chunks)
        picked = self.step([*requests, *(c.request for c in chunks)])
        return picked[: len(requests)], picked[len(requests) :]

    def _check(self, chunks: Sequence[Chunk[Request]]) -> None:
        for c in chunks:
            if (c.start, c.length) != (0, 1) or self.batch.length(c.request) != 0:
                raise ValueError(
                    f"an encoder-decoder's request prefills its start token alone; got a chunk "
                    f"of {c.length} tokens from {c.start}: plan chunks with the scheduler"
                )

    def step(self, requests: Sequence[Request]) -> list[int]:
        """One token for every request in ``requests``: the token each picked."""
        tokens = torch.tensor([self._ids[r][-1] for r in requests])
        logits = self.batch.step(tokens, requests)  # (N, vocab)
        logits = self._constrained(requests, logits)
        picked = pick_each(logits, [r.config for r in requests], [r.generator for r in requests])
        for request, token in zip(requests, picked, strict=True):
            self._ids[request].append(token)
        return picked

    def _constrained(self, requests: Sequence[Request], logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``(N, vocab)`` with each request's constraints applied to its row (as
        :func:`zoo.generate` applies them before it picks)."""
        if all(self._rules[r] is None for r in requests):
            return logits
        rows = []
        for i, request in enumerate(requests):
            rules, row = self._rules[request], logits[i : i + 1]
            if rules is not None:
                ids = torch.tensor([self._ids[request]], device=logits.device)  # (1, 1 + new)
                row = rules(ids, row)
            rows.append(row)
        return torch.cat(rows)

    def remove(self, request: Request, keep: bool = True) -> None:
        """Free ``request``'s slot, if it has one (``keep`` is the decoder's runner's: no
        prefix cache here)."""
        if request not in self._ids:
            return
        del self._ids[request]
        del self._rules[request]
        self.batch.remove(request)

    def clear(self) -> None:
        """Free every slot."""
        self._ids.clear()
        self._rules.clear()
        self.batch.clear()


def with_source_settings(config: GenerationConfig, settings: dict[str, Any]) -> GenerationConfig:
    """A request's ``config`` with the model's :func:`source_settings`."""
    return dataclasses.replace(config, **settings)
