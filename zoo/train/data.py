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

__all__ = [
    "Batch",
    "DataError",
    "LabelData",
    "PairData",
    "TokenData",
    "labels_in",
    "text_files",
    "train_tokenizer",
]

#: A batch: keyword inputs for the model's ``forward`` and the targets, ``(B, T)``; target
#: positions to ignore (padding) hold ``IGNORE``.
Batch = tuple[dict[str, Tensor], Tensor]
IGNORE = -100


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


def train_tokenizer(path: str | os.PathLike[str], vocab_size: int) -> Any:
    """A byte-level BPE (:class:`zoo.tokenizers.SubwordBPE`) of at most ``vocab_size`` ids
    learnt from training data: the text files, each tab-separated column apart (so the
    source and target of pairs share it). For a model whose tokenizer has no fixed
    vocabulary, such as ``transformer-encdec``."""
    from ..tokenizers.subword import SubwordBPE

    texts = []
    for file in text_files(path):
        for line in _read_text(file).splitlines():
            texts.extend(line.split("\t"))  # a pair's (or a label file's) columns apart
    return SubwordBPE.train(texts, vocab_size)


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
    context: int = 0

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

    def windows(self, context: int, where: str) -> TokenData:
        """This data drawn in windows of ``context + 1`` tokens (checked to fit)."""
        for name, size in (("training", self.split), ("held-out", len(self.tokens) - self.split)):
            if size < context + 1:
                raise DataError(
                    f"{where}: the {name} part has {size} tokens, fewer than one window of "
                    f"{context + 1} (context + 1); give more text or a smaller context_length"
                )
        return dataclasses.replace(self, context=context)

    def batch(self, part: str, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` random windows: input ids and next-token targets, ``(B, context)``."""
        context = self.context
        low, high = (0, self.split) if part == "train" else (self.split, len(self.tokens))
        starts = torch.randint(low, high - context, (batch_size,), generator=generator)
        rows = np.stack([self.tokens[s : s + context + 1] for s in starts.tolist()])
        window = torch.from_numpy(rows.astype(np.int64))  # (B, context + 1)
        return {"input_ids": window[:, :-1]}, window[:, 1:]


@dataclasses.dataclass(frozen=True)
class PairData:
    """Source/target pairs from a tab-separated file (``source<TAB>target`` per line), for
    encoder-decoders trained with teacher forcing.

    Attributes:
        pairs: token ids of each source and target (the target without start/end tokens).
        split: index of the first held-out pair.
        bos, eos, pad: the tokenizer's start, end and padding ids.
    """

    pairs: list[tuple[list[int], list[int]]]
    split: int
    bos: int
    eos: int
    pad: int

    @classmethod
    def read(cls, path: Path, tokenizer: Any, context: int, val_fraction: float) -> PairData:
        if path.is_dir():
            raise DataError(f"{path} is a folder; an encoder-decoder trains on one .tsv file")
        ids = (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id)
        if None in ids:
            raise DataError(f"tokenizer {tokenizer.name!r} needs bos, eos and pad ids here")
        text = _read_text(path)
        pairs = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            source, tab, target = line.partition("\t")
            if not tab:
                raise DataError(f"{path}, line {number}: no tab; each line is source<TAB>target")
            pair = (tokenizer.encode(source), tokenizer.encode(target))
            if len(pair[0]) > context or len(pair[1]) + 1 > context:
                raise DataError(
                    f"{path}, line {number}: longer than the context ({context} tokens)"
                )
            pairs.append(pair)
        split = int(len(pairs) * (1 - val_fraction))
        if split < 1 or split == len(pairs):
            raise DataError(f"{path}: {len(pairs)} pairs are too few to hold some out")
        return cls(pairs, split, *ids)

    def batch(self, part: str, batch_size: int, generator: torch.Generator) -> Batch:
        """Random pairs, right-padded: the source, the target shifted right behind ``bos``
        (teacher forcing), their padding masks, and the target followed by ``eos``."""
        low, high = (0, self.split) if part == "train" else (self.split, len(self.pairs))
        chosen = [
            self.pairs[i] for i in torch.randint(low, high, (batch_size,), generator=generator)
        ]
        sources = [s for s, _ in chosen]
        inputs = [[self.bos, *t] for _, t in chosen]
        targets = [[*t, self.eos] for _, t in chosen]
        src, src_mask = _pad(sources, self.pad)
        tgt, tgt_mask = _pad(inputs, self.pad)
        out, _ = _pad(targets, IGNORE)
        return {"src_ids": src, "tgt_ids": tgt, "src_mask": src_mask, "tgt_mask": tgt_mask}, out


def _lines(path: Path) -> list[tuple[int, str, str]]:
    """``(line number, text, label)`` of each non-empty ``text<TAB>label`` line."""
    if path.is_dir():
        raise DataError(f"{path} is a folder; give one text<TAB>label file")
    rows = []
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        text, tab, label = line.rpartition("\t")
        if not tab:
            raise DataError(f"{path}, line {number}: no tab; each line is text<TAB>label")
        rows.append((number, text, label.strip()))
    return rows


def labels_in(path: str | os.PathLike[str]) -> list[str]:
    """The label names of a ``text<TAB>label`` file, sorted."""
    return sorted({label for _, _, label in _lines(Path(path))})


@dataclasses.dataclass(frozen=True)
class LabelData:
    """Labelled texts from a ``text<TAB>label`` file, for sequence classification.

    Attributes:
        examples: token ids of each text (cut to the context) and its label's index.
        split: index of the first held-out example.
        pad: the id padding shorter texts (masked out).
    """

    examples: list[tuple[list[int], int]]
    split: int
    pad: int

    @classmethod
    def read(
        cls, path: Path, tokenizer: Any, context: int, val_fraction: float, labels: list[str]
    ) -> LabelData:
        index = {label: i for i, label in enumerate(labels)}
        examples = []
        for number, text, label in _lines(path):
            if label not in index:
                raise DataError(
                    f"{path}, line {number}: label {label!r} is not one of the model's "
                    f"labels ({', '.join(labels)})"
                )
            ids = tokenizer.encode(text)[:context]
            if not ids:
                raise DataError(f"{path}, line {number}: the text is empty")
            examples.append((ids, index[label]))
        split = int(len(examples) * (1 - val_fraction))
        if split < 1 or split == len(examples):
            raise DataError(f"{path}: {len(examples)} examples are too few to hold some out")
        pad = next((i for i in (tokenizer.pad_id, tokenizer.eos_id) if i is not None), 0)
        return cls(examples, split, pad)

    def batch(self, part: str, batch_size: int, generator: torch.Generator) -> Batch:
        """Random examples, right-padded with their mask, and their label indices ``(B,)``."""
        low, high = (0, self.split) if part == "train" else (self.split, len(self.examples))
        picks = torch.randint(low, high, (batch_size,), generator=generator).tolist()
        ids, keep = _pad([self.examples[i][0] for i in picks], self.pad)
        labels = torch.tensor([self.examples[i][1] for i in picks])
        return {"input_ids": ids, "attention_mask": keep}, labels


def _pad(rows: list[list[int]], value: int) -> tuple[Tensor, Tensor]:
    """Right-pad rows to one length: ids ``(B, L)`` and the mask of real tokens."""
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), value, dtype=torch.long)
    keep = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        keep[i, : len(row)] = 1
    return ids, keep
