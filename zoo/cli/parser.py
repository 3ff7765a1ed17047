"""The parts every ``zoo`` command is made of: :class:`Command` (what runs, its arguments, its
early checks), the parser that suggests spellings, and the argument types and checks that
several commands share."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "Command",
    "Parser",
    "check_utf8",
    "non_negative",
    "positive",
    "seconds",
]


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """A command that takes no arguments."""


@dataclasses.dataclass(frozen=True)
class Command:
    """One ``zoo`` command.

    Args:
        run: runs it and returns the exit code; its docstring is the command's help.
        arguments: adds its arguments to its parser.
        check: the checks of its arguments that need no torch (names known, files present,
            numbers in range), made before ``run``: a typo is reported in a fraction of a
            second, not after torch has loaded. They call what the command relies on later,
            so the messages are the same.
    """

    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    check: Callable[[argparse.Namespace], None] | None = None


def _did_you_mean(given: str, known: Sequence[str]) -> str:
    """`` (did you mean X?)`` for the closest of ``known`` to ``given``, or ``""``."""
    import difflib

    close = difflib.get_close_matches(given, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class Parser(argparse.ArgumentParser):
    """An argument parser that suggests the closest valid spelling: of a command or a choice
    (``zoo generat``, ``--quantize int9``) and of an option the command does not have
    (``zoo generate ... --max-tokens 10``), which it reports with that command's usage, not
    the top level's. (Python 3.14's ``suggest_on_error`` covers choices only.)"""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is not None and isinstance(value, str) and value not in choices:
            names = [str(c) for c in choices]
            hint = _did_you_mean(value, names)
            if hint:
                raise argparse.ArgumentError(
                    action,
                    f"invalid choice: {value!r}{hint}; choose from {', '.join(names)}",
                )
        super()._check_value(action, value)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._command_parser(getattr(parsed, "command", None)) or self
            options = [o for a in parser._actions for o in a.option_strings]
            hints = "".join(
                _did_you_mean(x.partition("=")[0], options) for x in extras if x.startswith("-")
            )
            parser.error(f"unrecognized arguments: {' '.join(extras)}{hints}")
        return parsed

    def _command_parser(self, command: str | None) -> argparse.ArgumentParser | None:
        """The subcommand's own parser (its usage is the one to show)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                return action.choices[command]
        return None


def positive(text: str) -> int:
    """An argument that is a positive integer."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative(text: str) -> int:
    """An argument that is an integer, 0 or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """An argument that is a finite number, 0 or more."""
    value = float(text)
    if not 0 <= value < float("inf"):  # not NaN either
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, got {text}")
    return value


def seconds(text: str) -> float:
    """An argument that is a positive, finite number of seconds."""
    value = float(text)
    if not 0 < value < float("inf"):  # not NaN either
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def check_utf8(text: str, what: str) -> None:
    """Python hands over argument bytes that are not UTF-8 as lone surrogates U+DC80..U+DCFF
    (``surrogateescape``); say which byte, before anything is loaded."""
    for i, char in enumerate(text):
        if 0xDC80 <= ord(char) <= 0xDCFF:
            raise ValueError(
                f"{what} is not valid UTF-8: byte 0x{ord(char) - 0xDC00:02x} at character {i}; "
                "pass UTF-8 text (check the terminal's encoding, e.g. LANG=C.UTF-8)"
            )
