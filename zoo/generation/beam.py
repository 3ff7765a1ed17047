"""Beam search: transformers' ``generate(num_beams=N, do_sample=False)``, step for step and
token for token, on any model's decoding session.

Each prompt becomes ``num_beams`` rows of one session (``B * num_beams``: the KV cache, an
encoder-decoder's source too). Every step adds each row's log-softmax to its running score,
applies the constraints (:mod:`zoo.generation.constraints`), and keeps, per prompt, the
``max(2, 1 + end ids) * num_beams`` best continuations over all its beams. Those that end
(an end id, or the last allowed token) become finished hypotheses scored by their summed
log-probabilities divided by ``new tokens ** length_penalty`` (only the best ``num_beams``
of the step may), the best ``num_beams`` that do not end run on, and the session's rows are
reordered to follow them (:func:`zoo.runtime.reorder_rows`). The search ends as transformers'
does: ``early_stopping=True`` once ``num_beams`` hypotheses have finished, ``False`` once no
running beam can beat the worst finished one at its present length, ``"never"`` once none
could at any length (with ``length_penalty > 0``: at the longest), or at ``max_new_tokens``.

The result holds each prompt's ``num_return_sequences`` best hypotheses, best first: its
prefix (a decoder's prompt as given, padding included; an encoder-decoder's start token) and
its new tokens, shorter ones filled after their end id with the first end id, all cut to the
longest returned. Scores are computed in float32 with transformers' operations in its order,
so equal logits give equal tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..runtime.reorder import check_reorderable, reorder_rows
from .constraints import Constraints
from .opening import checked_inputs, open_session, thread_policy
from .sampling import limit_vocab

if TYPE_CHECKING:
    from ..nn.base import ZooModel
    from .config import GenerationConfig

__all__ = ["beam_search"]

#: The score of what may not be chosen (transformers' ``-1e9``).
_NEVER = -1.0e9


def _gather(tensor: Tensor, index: Tensor) -> Tensor:
    """Rows ``index`` ``(B, K)`` of each prompt's beams in ``tensor`` ``(B, N, ...)``."""
    while index.ndim < tensor.ndim:
        index = index.unsqueeze(-1)
    return torch.take_along_dim(tensor, index, dim=1)


class _Beams:
    """The state of one beam search over ``batch`` prompts of ``num_beams`` rows each: the
    running beams (ids, scores, which row each token came from) and the finished hypotheses.

    Args:
        config: the settings.
        prefix: ``(batch * num_beams, P)`` the session's prefix, each prompt's rows together.
        vocab_size: the model's vocabulary.
    """

    def __init__(self, config: GenerationConfig, prefix: Tensor, vocab_size: int) -> None:
        device = prefix.device
        beams, self.prompt = config.num_beams, prefix.shape[1]
        batch = prefix.shape[0] // beams
        self.config, self.batch, self.beams, self.length = config, batch, beams, self.prompt
        self.max_length = self.prompt + config.max_new_tokens
        ends = config.end_ids
        self.ends = torch.tensor(ends, device=device) if ends else None
        self.keep = max(2, 1 + len(ends)) * beams  # continuations kept per prompt and step
        self.top = torch.arange(self.keep, device=device) < beams  # (K,): the first beams
        self.rules = Constraints.of(config, self.prompt, config.max_new_tokens, vocab_size, device)
        shape = (batch, beams, self.max_length)
        self.running = torch.full(shape, ends[0] if ends else 0, dtype=torch.long, device=device)
        self.running[:, :, : self.prompt] = prefix.view(batch, beams, self.prompt)
        self.sequences = self.running.clone()
        self.running_scores = torch.zeros((batch, beams), dtype=torch.float, device=device)
        self.running_scores[:, 1:] = _NEVER  # only the first beam's tokens at the first step
        self.scores = torch.full((batch, beams), _NEVER, dtype=torch.float, device=device)
        self.finished = torch.zeros((batch, beams), dtype=torch.bool, device=device)
        self.improvable = torch.ones((batch, 1), dtype=torch.bool, device=device)
        self.hits = torch.zeros((batch, beams), dtype=torch.bool, device=device)
        origins = (batch, beams, config.max_new_tokens)
        self.running_origins = torch.full(origins, -1, dtype=torch.int32, device=device)
        self.origins = self.running_origins.clone()
        # each step's log-probabilities, written into one tensor: a new (B * beams, vocab)
        # tensor every step costs the memory's page faults again
        self._log_probs_buffer: Tensor | None = None

    def _flat(self, tensor: Tensor) -> Tensor:
        """``(B, N, ...) -> (B * N, ...)``."""
        return tensor.reshape(self.batch * tensor.shape[1], *tensor.shape[2:])

    def _log_probs(self, logits: Tensor) -> Tensor:
        """Each prompt's continuations over all its beams, scored: ``(B, beams * vocab)``."""
        logits = logits.to(torch.float32)
        if self._log_probs_buffer is None or self._log_probs_buffer.shape != logits.shape:
            self._log_probs_buffer = torch.empty_like(logits)  # (B * beams, vocab), every step
        log_probs = torch.log_softmax(logits, dim=-1, out=self._log_probs_buffer)
        if self.rules is not None:
            ids = self._flat(self.running[:, :, : self.length])
            log_probs = self.rules(ids, log_probs, own=True)
        log_probs = limit_vocab(log_probs, self.config.vocab_limit)  # a tensor of its own
        log_probs = log_probs.view(self.batch, self.beams, -1)
        log_probs.add_(self.running_scores[:, :, None])  # in place: the same sums
        return log_probs.view(self.batch, -1)

    def _continuations(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The ``keep`` best continuations of each prompt: their scores ``(B, K)``, ids
        ``(B, K, max_length)``, origins ``(B, K, max_new_tokens)`` and which of them end."""
        log_probs = self._log_probs(logits)
        vocab_size = log_probs.shape[-1] // self.beams
        top_scores, top_index = torch.topk(log_probs, k=self.keep)
        beam = top_index // vocab_size
        origins = _gather(self.running_origins, beam)
        ids = _gather(self.running, beam)
        tokens = top_index % vocab_size
        ids[:, :, self.length] = tokens
        offset = torch.arange(self.batch, device=beam.device).view(-1, 1) * self.beams
        origins[:, :, self.length - self.prompt] = beam + offset
        ends = torch.full_like(tokens, self.length + 1 >= self.max_length, dtype=torch.bool)
        if self.ends is not None:
            ends = ends | torch.isin(tokens, self.ends)
        return top_scores, ids, origins, ends

    def _run_on(self, scores: Tensor, ids: Tensor, origins: Tensor, ends: Tensor) -> None:
        """The best ``num_beams`` continuations that do not end become the running beams."""
        running_scores = scores + ends.to(torch.float32) * _NEVER
        best = torch.topk(running_scores, k=self.beams)[1]
        self.running = _gather(ids, best)
        self.running_scores = _gather(running_scores, best)
        self.running_origins = _gather(origins, best)

    def _finish(self, scores: Tensor, ids: Tensor, origins: Tensor, ends: Tensor) -> None:
        """Continuations that end among the step's best ``num_beams`` join the finished
        hypotheses where they beat them (and the search has not closed for their prompt)."""
        config = self.config
        just_ended = ends & self.top[None, :]
        scores = scores / ((self.length + 1 - self.prompt) ** config.length_penalty)
        full = torch.all(self.finished, dim=-1, keepdim=True) & (config.early_stopping is True)
        scores += full.to(torch.float32) * _NEVER
        scores += (~self.improvable).to(torch.float32) * _NEVER
        scores += (~just_ended) * _NEVER
        merged_scores = torch.cat((self.scores, scores), dim=1)
        best = torch.topk(merged_scores, k=self.beams)[1]
        self.sequences = _gather(torch.cat((self.sequences, ids), dim=1), best)
        self.scores = _gather(merged_scores, best)
        self.origins = _gather(torch.cat((self.origins, origins), dim=1), best)
        self.finished = _gather(torch.cat((self.finished, just_ended), dim=1), best)

    def _close(self) -> None:
        """Close the prompts whose running beams can no longer beat their worst finished
        hypothesis (transformers' heuristic, by ``early_stopping`` and ``length_penalty``)."""
        penalty = self.config.length_penalty
        if self.config.early_stopping == "never" and penalty > 0.0:
            best_length = self.max_length - self.prompt
        else:
            best_length = self.length - self.prompt
        best_running = self.running_scores[:, :1] / (best_length**penalty)
        worst = torch.min(self.scores, dim=1, keepdim=True)[0]
        worst_finished = torch.where(self.finished, worst, _NEVER)
        self.improvable = self.improvable & torch.any(
            best_running > worst_finished, dim=-1, keepdim=True
        )

    def advance(self, logits: Tensor) -> bool:
        """One step from the next-token logits of every row ``(B * beams, vocab)``; whether
        the search goes on (then :meth:`origin` and :meth:`tokens` say how)."""
        scores, ids, origins, ends = self._continuations(logits)
        self._run_on(scores, ids, origins, ends)
        self._finish(scores, ids, origins, ends)
        self.hits = ends
        self.length += 1
        self._close()
        all_full = bool(self.finished.all()) and self.config.early_stopping is True
        return bool(self.improvable.any()) and not all_full and not bool(ends.all())

    def origin(self) -> Tensor:
        """``(B * beams,)``: the row each running beam continues (for the session's reorder)."""
        column = self.running_origins[:, :, self.length - 1 - self.prompt]
        return self._flat(column).long()

    def tokens(self) -> Tensor:
        """``(B * beams,)``: each running beam's last token, the session's next input."""
        return self._flat(self.running[:, :, self.length - 1])

    def result(self) -> Tensor:
        """Each prompt's ``num_return_sequences`` best hypotheses, best first:
        ``(B * num_return_sequences, P + N)``, cut to the longest of them."""
        count = self.config.num_return_sequences
        sequences = self._flat(self.sequences[:, :count])
        generated = int(((self._flat(self.origins[:, :count]) + 1).bool()).sum(dim=1).max())
        return sequences[:, : self.prompt + generated]


def beam_search(
    model: ZooModel,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    config: GenerationConfig,
) -> Tensor:
    """Beam search from a batch of prompt ids: what :func:`zoo.generation.generate_ids` runs
    when ``config.num_beams > 1``, and transformers' ``generate(num_beams=...)`` gives.

    Args:
        model: a zoo model (decoder-only or encoder-decoder: then ``config.start_id`` is
            needed); its decoding session must be able to reorder its rows
            (:func:`zoo.runtime.reorder_rows`).
        input_ids: ``(B, T)`` integer prompt ids, left-padded when rows differ in length.
        attention_mask: ``(B, T)`` padding mask (1/``True`` for tokens), or ``None``.
        config: the settings: ``num_beams`` (> 1), ``num_return_sequences``,
            ``length_penalty``, ``early_stopping``, ``max_new_tokens``, the end ids and the
            constraints.

    Returns:
        ``(B * num_return_sequences, P + N)`` ids on ``input_ids``' device: each prompt's
        best hypotheses in turn, best first, each its prefix followed by its new tokens
        (filled after its end id with the first end id), ``N <= max_new_tokens``.
    """
    if config.num_beams < 2:
        raise ValueError(
            "beam_search needs num_beams >= 2; with one beam, generate_ids picks each token "
            "greedily or by sampling (as transformers does)"
        )
    if model.is_encoder_decoder and config.start_id is None:
        raise ValueError("an encoder-decoder needs start_id (or a tokenizer with a bos id)")
    ids, keep = checked_inputs(model, input_ids, attention_mask)
    ids = ids.repeat_interleave(config.num_beams, dim=0)  # (B * beams, T)
    keep = None if keep is None else keep.repeat_interleave(config.num_beams, dim=0)
    threads = thread_policy(ids.device, config)
    session, logits = open_session(model, ids, keep, config, threads)
    check_reorderable(session)
    beams = _Beams(config, session.prefix, logits.shape[-1])
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            while beams.advance(logits):
                reorder_rows(session, beams.origin())
                with threads.step():
                    logits = session.step(beams.tokens())
    finally:
        model.train(was_training)
    return beams.result().to(input_ids.device)
