"""Training data for decoder LMs: text files tokenized once into a memory-mapped token file,
and random windows of ``context + 1`` tokens drawn from it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import ZooError

__all__ = ["DataError", "TokenData", "text_files"]


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


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError(
            f"{path}, line {line}: not UTF-8 (byte {data[exc.start]:#04x} at offset "
            f"{exc.start}); convert the file to UTF-8"
        ) from None
    if not text.strip():
        raise DataError(f"{path} is empty; training needs text")
    return text


@dataclasses.dataclass(frozen=True)
class TokenData:
    """A token file made from text files with one tokenizer, split into train and val.

    Attributes:
        path: the ``.bin`` token file (``uint16`` or ``uint32``), memory-mapped.
        tokens: the whole token array.
        split: index of the first held-out token.
    """

    path: Path
    tokens: np.ndarray
    split: int

    @classmethod
    def build(
        cls, sources: list[Path], tokenizer: Any, cache: Path, val_fraction: float
    ) -> TokenData:
        """Tokenize ``sources`` with ``tokenizer`` into ``cache`` (reused while the sources'
        bytes and the tokenizer are the same: the name is a hash of both)."""
        digest = hashlib.sha256()
        digest.update(json.dumps([tokenizer.name, tokenizer.vocab_size]).encode())
        for source in sources:
            digest.update(source.read_bytes())
        dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
        path = cache / f"tokens-{digest.hexdigest()[:16]}.bin"
        if not path.exists():
            ids: list[int] = []
            for source in sources:
                ids.extend(tokenizer.encode(_read_text(source)))
            cache.mkdir(parents=True, exist_ok=True)
            staging = path.with_suffix(f".{os.getpid()}.tmp")
            np.asarray(ids, dtype=dtype).tofile(staging)
            os.replace(staging, path)  # never a half-written token file under the real name
        tokens = np.memmap(path, dtype=dtype, mode="r")
        split = int(len(tokens) * (1 - val_fraction))
        return cls(path, tokens, split)

    def check_window(self, context: int, where: str) -> None:
        for name, size in (("training", self.split), ("held-out", len(self.tokens) - self.split)):
            if size < context + 1:
                raise DataError(
                    f"{where}: the {name} part has {size} tokens, fewer than one window of "
                    f"{context + 1} (context + 1); give more text or a smaller context_length"
                )

    def batch(
        self, part: str, batch_size: int, context: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """``batch_size`` random windows: inputs and next-token targets, ``(B, context)``."""
        low, high = (0, self.split) if part == "train" else (self.split, len(self.tokens))
        starts = torch.randint(low, high - context, (batch_size,), generator=generator)
        rows = np.stack([self.tokens[s : s + context + 1] for s in starts.tolist()])
        window = torch.from_numpy(rows.astype(np.int64))  # (B, context + 1)
        return window[:, :-1], window[:, 1:]
