"""Exceptions raised by zoo. Every one says what was wrong and how to fix it."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

__all__ = [
    "CheckpointError",
    "ChecksumMismatchError",
    "CompileUnavailableError",
    "ConfigError",
    "CorruptCheckpointError",
    "HubAuthError",
    "HubError",
    "HubNotFoundError",
    "HubOfflineError",
    "HubUnavailableError",
    "InsufficientMemoryError",
    "PluginContractError",
    "PluginError",
    "RegistryConflictError",
    "StateDictMismatchError",
    "UnknownArchitectureError",
    "UnknownModelError",
    "UnsafeCheckpointError",
    "ZooError",
]


_Error = TypeVar("_Error", bound="CheckpointError")


class ZooError(Exception):
    """Base class of every error zoo raises on purpose."""


class CompileUnavailableError(ZooError, RuntimeError):
    """``torch.compile`` cannot build CPU kernels here (no C++ compiler)."""


class ConfigError(ZooError, ValueError):
    """A config field is unknown, missing, of the wrong type or out of range."""


class UnknownModelError(ZooError, KeyError):
    """No named model (or alias) with that name is registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownArchitectureError(ZooError, KeyError):
    """No installed plugin supplies that architecture."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InsufficientMemoryError(ZooError):
    """A build or a training run would need more memory than the device has; the message gives
    both figures and what would fit (``ZOO_ALLOW_LARGE=1`` skips the check)."""


class RegistryConflictError(ZooError):
    """Two sources claim the same architecture or model name."""


class PluginError(ZooError):
    """A plugin failed to load or its hook raised (raised in strict mode only)."""


class PluginContractError(PluginError, TypeError):
    """A plugin's architecture does not provide what zoo needs (e.g. its model class does not
    derive from ``zoo.nn.ZooModel``); raised when the architecture is first used."""


class CheckpointError(ZooError):
    """A checkpoint cannot be read or written: a file is missing, ``config.json`` is invalid,
    or the checkpoint is in a format zoo does not load.

    Attributes:
        path: the file at fault, when the error is about one (``None`` otherwise).
        expected: what that file should hold (a sha256, ...), when the error says.
        actual: what it holds instead, when the error says.

    Callers read these rather than parse the message, whose wording may change.
    """

    def __init__(
        self,
        message: str = "",
        *,
        path: str | os.PathLike[str] | None = None,
        expected: str | None = None,
        actual: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.expected = expected
        self.actual = actual

    def reworded(self: _Error, message: str) -> _Error:
        """This error with another ``message`` and the same fields (a caller that knows more
        says it, e.g. where the file came from)."""
        error = copy.copy(self)
        error.args = (message,)
        return error


class CorruptCheckpointError(CheckpointError):
    """A weights file is damaged: truncated, or its safetensors header is not valid
    (``path`` names it)."""


class ChecksumMismatchError(CorruptCheckpointError):
    """The sha256 of a file is not the one recorded in ``config.json``, pinned for the named
    model or given by the Hub.

    Attributes:
        mismatches: every file whose sha256 is wrong -> (expected, actual); for one file, its
            ``path``, ``expected`` and ``actual`` are set too. Empty when the error is that
            the expected hashes disagree among themselves (nothing was hashed).
    """

    def __init__(
        self,
        message: str = "",
        *,
        path: str | os.PathLike[str] | None = None,
        expected: str | None = None,
        actual: str | None = None,
        mismatches: Mapping[Path, tuple[str, str]] | None = None,
    ) -> None:
        if mismatches is not None and len(mismatches) == 1 and path is None:
            ((path, (expected, actual)),) = mismatches.items()
        super().__init__(message, path=path, expected=expected, actual=actual)
        if mismatches is None and self.path is not None and expected and actual:
            mismatches = {self.path: (expected, actual)}
        self.mismatches: dict[Path, tuple[str, str]] = dict(mismatches or {})

    @classmethod
    def of_file(
        cls, path: str | os.PathLike[str], *, actual: str, expected: str, says: str, advice: str
    ) -> ChecksumMismatchError:
        """The error for one file: ``"{path} has sha256 {actual}, but {says} says
        {expected}: {advice}"``."""
        return cls(
            f"{path} has sha256 {actual}, but {says} says {expected}: {advice}",
            path=path,
            expected=expected,
            actual=actual,
        )


class UnsafeCheckpointError(CheckpointError):
    """A pickle-based weights file (``.bin``, ``.pt``, ``.pth``, ``.ckpt``) was given; zoo
    never unpickles files implicitly."""


class StateDictMismatchError(CheckpointError):
    """The tensors of a checkpoint do not fit the model: missing, unexpected or mis-shaped
    keys. ``report`` holds the full :class:`zoo.checkpoint.LoadReport`."""

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report


class HubError(ZooError):
    """A Hugging Face Hub operation (push, pull, ``zoo.load("hf:...")``) failed."""


class HubAuthError(HubError):
    """The Hub refused the token (invalid, missing, or without access to the repo)."""


class HubNotFoundError(HubError):
    """The repo, revision or file does not exist on the Hub (or is private and the token
    does not grant access to it)."""


class HubUnavailableError(HubError):
    """The Hub could not be reached, answered with a server error, or a download was cut,
    and the files are not in the local cache."""


class HubOfflineError(HubUnavailableError):
    """``HF_HUB_OFFLINE`` is set and the files are not in the local Hugging Face cache."""
