"""The ``zoo`` command line.

Every command answers ``--help``; an error is one line on stderr and a non-zero exit code.
Listing commands never import torch: each command module imports what its command runs on
inside the command.

One module per group of commands, each a ``COMMANDS`` table of :class:`~zoo.cli.parser.Command`
(what runs, its arguments, its checks made before torch loads):

- :mod:`zoo.cli.models`: ``list``, ``info``, ``plugins``, ``tour``, ``check``;
- :mod:`zoo.cli.generate`: ``generate``, ``classify``; :mod:`zoo.cli.chat`: ``chat``;
- :mod:`zoo.cli.train`: ``train`` (its flags made from ``TrainConfig``, :mod:`zoo.cli.flags`);
- :mod:`zoo.cli.serve`: ``serve``;
- :mod:`zoo.cli.weights`: ``convert``, ``merge``, ``push``, ``pull``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import ZooError
from . import chat, generate, models, serve, train, weights
from .parser import Command, Parser

__all__ = ["build_parser", "main"]

#: The commands, in the order ``zoo --help`` lists them.
_ORDER = (
    "list", "info", "plugins", "tour", "generate", "chat", "classify", "train", "serve",
    "convert", "merge", "check", "push", "pull",
)  # fmt: skip
_GROUPS = (models, generate, chat, train, serve, weights)
_BY_NAME = {name: command for group in _GROUPS for name, command in group.COMMANDS.items()}
#: Every command, in that order.
COMMANDS: dict[str, Command] = {name: _BY_NAME[name] for name in _ORDER}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``zoo`` command."""
    parser = Parser(prog="zoo", description="A plugin-based model zoo for PyTorch.")
    parser.add_argument("--version", action="version", version=f"zoo {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        doc = (command.run.__doc__ or "").strip()
        p = sub.add_parser(name, help=doc, description=doc)
        p.set_defaults(func=command.run)
        command.arguments(p)
    return parser


def _version() -> str:
    from .. import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``zoo`` console script."""
    args = build_parser().parse_args(argv)
    try:
        check = COMMANDS[args.command].check
        if check is not None:
            check(args)
        return args.func(args)
    except (ZooError, KeyError, ValueError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"zoo: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zoo: interrupted", file=sys.stderr)
        return 130
