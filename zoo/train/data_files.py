"""The training data's files, found without reading them (and without torch): what
``zoo train --data`` checks before anything heavy is imported."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ZooError

__all__ = ["DataError", "text_files"]


class DataError(ZooError, ValueError):
    """Training data that cannot be used: missing, empty, not UTF-8, shorter than a window."""


def text_files(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` itself, or the ``*.txt`` files under a folder (sorted)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise DataError(f"{path} holds no .txt file; give a text file or a folder of them")
        return files
    if not path.is_file():
        raise DataError(f"{path} does not exist; give a text file or a folder of .txt files")
    return [path]
