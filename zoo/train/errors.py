"""Errors of a training run (besides :class:`zoo.train.DataError`, which names bad data)."""

from __future__ import annotations

from ..errors import CheckpointError, ZooError

__all__ = ["DivergedError", "ResumeError", "RunLockedError"]


class DivergedError(ZooError, ArithmeticError):
    """The training loss (or the weights) became NaN or infinite. Nothing non-finite was
    saved: ``<out>/checkpoint/`` still holds the last good step. Lower the learning rate,
    lengthen the warm-up, or keep gradient clipping on."""


class ResumeError(CheckpointError):
    """``<out>/checkpoint/`` cannot be resumed by this run: a file is damaged or tampered
    with (wrong tensor shape, dtype, a NaN, a step out of range, malformed JSON), or it was
    written by a run with another model or other settings."""


class RunLockedError(ZooError):
    """Another ``zoo train`` (or :func:`zoo.train.train`) is writing to the same ``out``
    folder; two runs on one folder would overwrite each other's checkpoints."""
