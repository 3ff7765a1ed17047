"""Conformance kit: the checks every zoo model must pass, for built-in and third-party plugins.

Run them from the shell::

    zoo check my-model            # every check, on CPU (and CUDA when available)

or from pytest, in the plugin's own test suite::

    import pytest
    from zoo.testing import conformance_cases, run_check

    @pytest.mark.parametrize(("model", "check", "device"), conformance_cases(["my-model"]))
    def test_zoo_conformance(model, check, device):
        run_check(model, check, device=device)

Each check builds the model small (the shared size fields shrunk, see :func:`small_overrides`)
except ``meta``, which runs the full-size model on the ``meta`` device. A model must derive
from :class:`zoo.nn.ZooModel` and implement ``example_inputs()``.

A check passes, fails (``AssertionError`` saying what is wrong) or is skipped
(:class:`CheckSkipped`, saying why it cannot run: never reported as passed). ``reference``
(:mod:`zoo.testing.reference`) compares the model with the implementation it reproduces.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

import torch

from ..plugin.current import get_registry
from .checks import CHECKS, DEVICE_FREE, assert_logits_close
from .reference import CheckSkipped
from .small import small_overrides

__all__ = [
    "CHECKS",
    "CheckResult",
    "CheckSkipped",
    "assert_logits_close",
    "available_devices",
    "conformance_cases",
    "run_check",
    "run_conformance",
    "small_overrides",
]


def available_devices() -> list[str]:
    """``["cpu"]``, plus ``"cuda"`` when a CUDA device is present."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def run_check(name: str, check: str, *, device: str = "cpu") -> str | None:
    """Run one check; returns a note (what it left out, what it found shared) or ``None``.

    Raises:
        AssertionError: the check failed; the message says what is wrong.
        CheckSkipped: the check cannot run on this model; the message says why. It is a
            :class:`unittest.SkipTest`, so inside a pytest test the test is skipped with
            that reason.
    """
    if check not in CHECKS:
        raise KeyError(f"unknown check {check!r}; choose one of {', '.join(CHECKS)}")
    return CHECKS[check](name, device)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: ``status`` is ``"ok"``, ``"failed"`` (``error`` says what is
    wrong) or ``"skipped"`` (``reason`` says why it could not run); an ``"ok"`` check may
    carry a ``reason`` too, naming what it left out."""

    model: str
    check: str
    device: str
    status: str
    seconds: float
    error: str | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        """The check ran and passed (a skipped check is not ok, nor failed)."""
        return self.status == "ok"

    @property
    def failed(self) -> bool:
        """The check ran and found something wrong."""
        return self.status == "failed"

    @property
    def skipped(self) -> bool:
        """The check could not run (``reason`` says why)."""
        return self.status == "skipped"


def conformance_cases(
    models: Iterable[str] | None = None, devices: Iterable[str] | None = None
) -> list[tuple[str, str, str]]:
    """``(model, check, device)`` triples for ``pytest.mark.parametrize``; by default every
    registered model on every available device."""
    names = list(models) if models is not None else get_registry().models()
    devs = list(devices) if devices is not None else available_devices()
    return [
        (name, check, device)
        for name in names
        for check in CHECKS
        for device in (["cpu"] if check in DEVICE_FREE else devs)
    ]


def run_conformance(
    name: str, *, devices: Iterable[str] | None = None, checks: Iterable[str] | None = None
) -> list[CheckResult]:
    """Run the checks on ``name`` and return one result per check and device."""
    wanted = set(checks) if checks is not None else set(CHECKS)
    results = []
    for model, check, device in conformance_cases([name], devices):
        if check not in wanted:
            continue
        start = time.perf_counter()
        status, error, reason = "ok", None, None
        try:
            reason = run_check(model, check, device=device)
        except CheckSkipped as exc:
            status, reason = "skipped", str(exc)
        except Exception as exc:
            status, error = "failed", f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - start
        results.append(CheckResult(model, check, device, status, seconds, error, reason))
    return results
