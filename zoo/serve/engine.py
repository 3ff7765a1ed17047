"""The engine of ``zoo serve``: one loop that decodes every request's sequences together.

Requests hand :class:`Sequence` s to :meth:`Engine.submit`; the engine's thread admits them
into free slots of a :class:`zoo.nn.slots.SlotBatch` between two decoding steps (each prompt
prefilled on its own), then runs one step for every sequence in the batch, picks each one's
next token with its own settings, and hands the text on through the sequence's ``emit``
callback. A sequence leaves the batch when it ends (an end-of-text id, a stop string,
``max_new_tokens``) or is cancelled (its client went away), and its slot takes the next
waiting sequence at once: continuous batching. Sequences beyond the free slots wait in a
bounded queue; :meth:`Engine.submit` refuses what does not fit (:class:`QueueFull`).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..generation.sampling import limit_vocab, next_tokens
from ..nn.slots import SlotBatch
from .text import TextStream

if TYPE_CHECKING:
    from ..generation import GenerationConfig
    from ..nn.decoder import DecoderLM
    from ..tokenizers import Tokenizer

__all__ = ["Engine", "EngineStopped", "Finish", "QueueFull", "Sequence"]


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full: try again later (HTTP 429)."""


class EngineStopped(Exception):
    """The engine is shutting down and takes no more work (HTTP 503)."""


@dataclasses.dataclass(frozen=True)
class Finish:
    """The last event of a sequence.

    Attributes:
        reason: ``"stop"`` (an end-of-text id or a stop string), ``"length"``
            (``max_new_tokens`` reached), ``"cancelled"`` or ``"error"``.
        prompt_tokens: the prompt's length.
        completion_tokens: tokens generated (an end-of-text id included).
        error: what went wrong, for ``"error"``.
    """

    reason: str
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None


#: What a sequence emits: a piece of its text, then one :class:`Finish`.
Event = str | Finish


class Sequence:
    """One prompt to continue, and where its text goes.

    Args:
        prompt: the prompt's ids.
        config: the settings (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``,
            ``seed``, ``stop``, ``vocab_limit``).
        tokenizer: decodes the new tokens.
        emit: called from the engine's thread with each :data:`Event`; must not block.
        end_ids: ids that end the sequence (not part of its text).
        flush: called from the engine's thread after a burst of events (a step's, an
            admission's), once per burst however many sequences share it: lets ``emit``
            only queue its events and ``flush`` hand a whole step's on at once.
    """

    def __init__(
        self,
        prompt: Seq[int],
        config: GenerationConfig,
        tokenizer: Tokenizer,
        emit: Callable[[Event], None],
        end_ids: Seq[int] = (),
        flush: Callable[[], None] | None = None,
    ) -> None:
        self.prompt = list(prompt)
        self.config = config
        self.emit = emit
        self.flush = flush
        self.end_ids = frozenset(end_ids)
        self.text = TextStream(tokenizer, self.prompt, config.stop)
        self.generator: torch.Generator | None = None
        self.generated = 0
        self.last: int | None = None
        self.finished = False
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Ask the engine to drop this sequence (from any thread); it finishes with
        ``"cancelled"`` before the next step, freeing its slot."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def take(self, token: int) -> bool:
        """Record a picked token and emit its text; return whether the sequence ended."""
        self.generated += 1
        if token in self.end_ids:
            self.end("stop")
            return True
        self.last = token
        piece = self.text.push(token)
        if piece:
            self.emit(piece)
        if self.text.stopped:
            self.end("stop")
            return True
        if self.generated >= self.config.max_new_tokens:
            self.end("length")
            return True
        return False

    def end(self, reason: str, error: str | None = None) -> None:
        """Emit the rest of the text (unless cancelled or failed) and the :class:`Finish`."""
        if self.finished:
            return
        self.finished = True
        if reason in ("stop", "length"):
            rest = self.text.finish()
            if rest:
                self.emit(rest)
        self.emit(Finish(reason, len(self.prompt), self.generated, error))


class Engine:
    """Decodes submitted sequences in one continuously refilled batch: in the thread that
    calls :meth:`run`, or on a thread of its own after :meth:`start`.

    ``zoo serve`` runs it on the process's main thread (the HTTP server has a thread of its
    own): the main thread owns the OpenMP worker pool that PyTorch's CPU kernels use. Started
    from any other thread once the main one has used it, each parallel kernel wakes a second
    pool on a machine already full of threads, and a decoding step of 8 rows takes about 1.8x
    as long (shakespeare-byte on 2 cores: 4.8 against 2.7 ms).

    Args:
        model: the decoder to serve (in eval mode from here on).
        max_batch: sequences decoding at once (slots).
        max_queue: sequences that may wait for a slot; more are refused.
        max_len: positions per slot, prompt plus new tokens (default: the context length).
    """

    def __init__(
        self,
        model: DecoderLM,
        *,
        max_batch: int = 8,
        max_queue: int = 64,
        max_len: int | None = None,
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        model.eval()
        self.model = model
        self.batch: SlotBatch[Sequence] = SlotBatch(model, max_batch, max_len)
        self.max_queue = max_queue
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self.run, name="zoo-serve-engine", daemon=True)

    @property
    def max_len(self) -> int:
        """Positions per sequence: its prompt plus its new tokens must fit."""
        return self.batch.max_len

    @property
    def running(self) -> int:
        """Sequences decoding now."""
        return len(self.batch)

    @property
    def waiting(self) -> int:
        """Sequences waiting for a slot."""
        return len(self._waiting)

    def start(self) -> None:
        """Run the engine on a thread of its own (see :meth:`run`)."""
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Take no more work, end what is left with an error, and wait for the engine's own
        thread if :meth:`start` started one (:meth:`run` returns soon after)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, sequences: Seq[Sequence]) -> None:
        """Queue ``sequences`` for decoding (all or none).

        Raises:
            QueueFull: they do not fit in the free slots plus the waiting queue.
            EngineStopped: the engine is shutting down.
        """
        with self._cond:
            if self._stopping:
                raise EngineStopped("the server is shutting down")
            room = self.batch.max_rows + self.max_queue - len(self.batch) - len(self._waiting)
            if len(sequences) > room:
                raise QueueFull(
                    f"the server is busy: {len(self.batch)} sequences decoding and "
                    f"{len(self._waiting)} waiting (at most {self.batch.max_rows} and "
                    f"{self.max_queue}); retry later"
                )
            self._waiting.extend(sequences)
            self._cond.notify_all()

    def run(self) -> None:
        """Decode in the calling thread until :meth:`stop`: admit waiting sequences into
        free slots, run a step, repeat; idle while there is nothing to do."""
        try:
            with torch.inference_mode():
                while True:
                    with self._cond:
                        while not self._waiting and not len(self.batch) and not self._stopping:
                            self._cond.wait()
                        if self._stopping:
                            break
                        admitted = [
                            self._waiting.popleft()
                            for _ in range(min(self.batch.free, len(self._waiting)))
                        ]
                    for sequence in admitted:
                        self._admit(sequence)
                    cancelled = [s for s in self.batch.keys if s.cancelled]
                    for sequence in cancelled:
                        self.batch.remove(sequence)
                        sequence.end("cancelled")
                    _flush([*admitted, *cancelled])
                    if len(self.batch):
                        _flush(self._step())
        finally:  # stopped, or a bug: every request still open gets its answer
            self._fail_all("the server is shutting down")

    def _admit(self, sequence: Sequence) -> None:
        if sequence.cancelled:
            sequence.end("cancelled")
            return
        config = sequence.config
        if config.seed is not None and config.temperature > 0:
            device = self.batch.device
            sequence.generator = torch.Generator(device=device).manual_seed(config.seed)
        try:
            logits = self.batch.add(sequence, sequence.prompt)
            self._advance([sequence], logits[None])
        except Exception as exc:  # this prompt only: the others go on
            self._fail([sequence], exc)

    def _step(self) -> list[Sequence]:
        """One token for every sequence in the batch; returns them."""
        sequences = list(self.batch.keys)
        tokens = torch.tensor([s.last for s in sequences])
        try:
            self._advance(sequences, self.batch.step(tokens))
        except Exception as exc:  # e.g. out of memory: these requests fail, the server stays
            self._fail(sequences, exc)
        return sequences

    def _advance(self, sequences: list[Sequence], logits: Tensor) -> None:
        """Pick each sequence's next token from its logits row ``(N, vocab)``; those that end
        leave the batch."""
        for sequence, token in zip(sequences, _pick(sequences, logits), strict=True):
            try:
                ended = sequence.take(token)
            except Exception as exc:  # e.g. its tokenizer cannot decode the id: it alone fails
                sequence.end("error", f"{type(exc).__name__}: {exc}")
                ended = True
            if ended and sequence in self.batch.keys:
                self.batch.remove(sequence)

    def _fail(self, sequences: list[Sequence], exc: Exception) -> None:
        """End ``sequences`` with ``exc`` and free their slots."""
        for sequence in sequences:
            if sequence in self.batch.keys:
                self.batch.remove(sequence)
            sequence.end("error", f"{type(exc).__name__}: {exc}")

    def _fail_all(self, message: str) -> None:
        with self._cond:
            self._stopping = True  # submit refuses from here on
            left = [*self.batch.keys, *self._waiting]
            self.batch.clear()
            self._waiting.clear()
        for sequence in left:
            sequence.end("error", message)
        _flush(left)


def _flush(sequences: list[Sequence]) -> None:
    """Call the ``flush`` of ``sequences`` that have one, each distinct one once."""
    for flush in {s.flush for s in sequences if s.flush is not None}:
        flush()


def _pick(sequences: list[Sequence], logits: Tensor) -> list[int]:
    """Each sequence's next token from its row of ``logits`` ``(N, vocab)``: the argmax for
    greedy ones, a sample with its own generator for the others (as :func:`zoo.generate`
    picks, with its masking and sampler; never an id at or above its ``vocab_limit``)."""
    logits = limit_vocab(logits, [s.config.vocab_limit for s in sequences])
    picked = logits.argmax(dim=-1).tolist()
    for i, sequence in enumerate(sequences):
        config = sequence.config
        if config.temperature > 0:
            picked[i] = int(
                next_tokens(
                    logits[i : i + 1],
                    temperature=config.temperature,
                    top_k=config.top_k,
                    top_p=config.top_p,
                    generator=sequence.generator,
                )[0]
            )
    return picked
