"""Training data for decoder LMs: text files tokenized once into a memory-mapped token file,
and random windows of ``context + 1`` tokens drawn from it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import socket
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import jsonfile
from ..options import MAX_DISTINCT_BYTES
from .data_files import DataError, text_files

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


def train_tokenizer(
    path: str | os.PathLike[str], vocab_size: int, max_distinct_bytes: int = MAX_DISTINCT_BYTES
) -> Any:
    """A byte-level BPE (:class:`zoo.tokenizers.SubwordBPE`) of at most ``vocab_size`` ids
    learnt from training data: the text files, each tab-separated column apart (so the
    source and target of pairs share it). For a model whose tokenizer has no fixed
    vocabulary, such as ``transformer-encdec``. Files are read one at a time, and the
    trainer's memory and time stay bounded whatever their size and shape
    (:meth:`~zoo.tokenizers.SubwordBPE.train`, with its ``max_distinct_bytes`` budget)."""
    from ..tokenizers.subword import SubwordBPE

    texts = (_read_text(file) for file in text_files(path))
    # split_lines: a pair's (or a label file's) columns apart, each line apart
    return SubwordBPE.train(
        texts, vocab_size, split_lines=True, max_distinct_bytes=max_distinct_bytes
    )


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
    if not text or text.isspace():  # (strip() would copy the whole text)
        raise DataError(f"{path} is empty; training needs text")
    return text


#: Bytes read at a time when hashing or checking files.
_BLOCK = 1 << 20
#: Temporary token files: ``tokens-<key>.<host>.<pid>.tmp`` in the cache folder.
_TEMPORARY = re.compile(r"^tokens-[0-9a-f]+(-meta)?\.(?P<host>[^.]+)\.(?P<pid>\d+)\.tmp$")


def _cache_key(sources: list[Path], tokenizer: Any) -> str:
    """sha256 (hex) of the tokenizer's content and each source's name, length and sha256, in
    order (so text moved from one file to the next changes it)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(["zoo-tokens-v2", tokenizer.fingerprint()]).encode())
    for source in sources:
        content = hashlib.sha256()
        with open(source, "rb") as file:
            while block := file.read(_BLOCK):
                content.update(block)
        entry = [source.name, source.stat().st_size, content.hexdigest()]
        digest.update(json.dumps(entry).encode())
    return digest.hexdigest()


def _meta_path(path: Path) -> Path:
    return path.with_suffix(".json")


def _scan(path: Path, dtype: np.dtype) -> tuple[int, str, int]:
    """Number of ids, sha256 and largest id of a token file, read a block at a time."""
    digest, count, largest = hashlib.sha256(), 0, -1
    step = _BLOCK // dtype.itemsize
    with open(path, "rb") as file:
        while True:
            ids = np.fromfile(file, dtype=dtype, count=step)
            if not len(ids):
                break
            digest.update(ids.tobytes())
            count += len(ids)
            largest = max(largest, int(ids.max()))
    return count, digest.hexdigest(), largest


def _valid(path: Path, key: str, dtype: np.dtype, vocab_size: int) -> bool:
    """Whether ``path`` is the complete token file its record describes, every id in the
    vocabulary."""
    try:
        meta = jsonfile.loads(_meta_path(path).read_text())
        if meta.get("key") != key or meta.get("dtype") != dtype.name:
            return False
        if path.stat().st_size != int(meta["tokens"]) * dtype.itemsize:
            return False
        count, sha256, largest = _scan(path, dtype)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return count == meta["tokens"] and sha256 == meta["sha256"] and largest < vocab_size


def _tokenize(
    sources: list[Path], tokenizer: Any, path: Path, key: str, dtype: np.dtype, vocab_size: int
) -> None:
    """Stream the ids of ``sources`` into ``path`` (written under a temporary name first,
    then its record beside it)."""
    staging = path.with_name(f"{path.stem}.{_host()}.{os.getpid()}.tmp")
    record = path.with_name(f"{path.stem}-meta.{_host()}.{os.getpid()}.tmp")
    digest, count = hashlib.sha256(), 0
    try:
        with open(staging, "wb") as file:
            for source in sources:
                text = _read_text(source)
                for ids in tokenizer.iter_encode(text):
                    if not ids:
                        continue
                    array = np.asarray(ids, dtype=np.int64)
                    if int(array.min()) < 0 or int(array.max()) >= vocab_size:
                        raise DataError(
                            f"tokenizer {tokenizer.name!r} gave an id outside its vocabulary "
                            f"(0 .. {vocab_size - 1}) for {source}; the tokenizer is broken"
                        )
                    data = array.astype(dtype).tobytes()
                    digest.update(data)
                    file.write(data)
                    count += len(array)
                del text
            file.flush()
            os.fsync(file.fileno())
        meta = {"key": key, "dtype": dtype.name, "tokens": count, "sha256": digest.hexdigest()}
        _meta_path(path).unlink(missing_ok=True)
        os.replace(staging, path)  # never a half-written token file under the real name
        record.write_text(json.dumps(meta))
        os.replace(record, _meta_path(path))
    finally:
        staging.unlink(missing_ok=True)
        record.unlink(missing_ok=True)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _remove_stale_temporaries(cache: Path) -> None:
    """Remove the temporary token files of writers on this host that are no longer running
    (a run killed while tokenizing)."""
    host = _host()
    for entry in cache.glob("tokens-*.tmp"):
        match = _TEMPORARY.match(entry.name)
        if match and match["host"] == host and not _alive(int(match["pid"])):
            entry.unlink(missing_ok=True)


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
        """Tokenize ``sources`` with ``tokenizer`` into ``cache``, or reuse the token file
        made there before from the same sources and tokenizer.

        The file's name is a digest of the tokenizer's full content
        (:meth:`~zoo.tokenizers.Tokenizer.fingerprint`) and of each source's name, length and
        sha256 in order; a ``.json`` beside it records its length and sha256. A file that
        does not match them, or holds an id outside the vocabulary, is made again. Ids are
        streamed to a temporary file in ``cache`` (renamed when complete), so memory stays
        near the size of one source's text; temporaries left by a killed run are removed.
        """
        if not (hasattr(tokenizer, "fingerprint") and hasattr(tokenizer, "iter_encode")):
            raise DataError(
                f"training data needs a zoo tokenizer (zoo.tokenizers.Tokenizer), got "
                f"{type(tokenizer).__name__}: its fingerprint keys the token cache"
            )
        vocab_size = int(tokenizer.vocab_size)
        dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
        key = _cache_key(sources, tokenizer)
        path = cache / f"tokens-{key[:32]}.bin"
        cache.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(cache)
        if not _valid(path, key, dtype, vocab_size):
            _tokenize(sources, tokenizer, path, key, dtype, vocab_size)
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

    Each target becomes its labels (the ids the decoder learns to predict, ending with
    ``eos``); the decoder's input is the labels shifted right behind the start id, as
    transformers' ``shift_tokens_right`` makes it. How the ids are made depends on the model:

    - a model that names its decoder's start (``config.json``'s ``decoder_start_token_id``,
      zoo's ``decoder_start_id``: Marian's pad, BART's eos, T5's pad) trains as transformers
      trains it: the target encoded with the tokenizer's sequence tokens
      (``add_special_tokens=True``, through ``encode_target`` where the tokenizer has a
      target side of its own: Marian's SentencePiece pair; ``text </s>`` for Marian and T5,
      ``<s> text </s>`` for BART), ``eos`` appended where the tokenizer does not end it so,
      the decoder starting at that id;
    - any other (zoo's own ``transformer-encdec``): the ids of the text alone, the labels
      followed by ``eos``, the decoder starting at the tokenizer's ``bos``.

    The source is encoded as generation encodes it: with the sequence tokens where the
    tokenizer says an encoder-decoder's source has them (``source_special_tokens``:
    transformers' tokenizers), else, as its framing says.

    Attributes:
        pairs: token ids of each source and the labels of its target.
        split: index of the first held-out pair.
        start: the decoder's first input id.
        pad: the id padding shorter rows (masked out, and ignored by the loss).
    """

    pairs: list[tuple[list[int], list[int]]]
    split: int
    start: int
    pad: int

    @classmethod
    def read(
        cls,
        path: Path,
        tokenizer: Any,
        context: int,
        val_fraction: float,
        *,
        decoder_start: int | None = None,
    ) -> PairData:
        """The pairs of ``path``, encoded by ``tokenizer`` for a model whose decoder starts at
        ``decoder_start`` (``None``: zoo's own framing, see the class)."""
        if path.is_dir():
            raise DataError(f"{path} is a folder; an encoder-decoder trains on one .tsv file")
        start, eos, pad = _pair_ids(tokenizer, decoder_start)
        wrap = decoder_start is not None  # the checkpoint's framing: the sequence tokens
        wrap_source = bool(getattr(tokenizer, "source_special_tokens", wrap))
        text = _read_text(path)
        pairs = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            source, tab, target = line.partition("\t")
            if not tab:
                raise DataError(f"{path}, line {number}: no tab; each line is source<TAB>target")
            labels = _labels(tokenizer, target, wrap, eos)
            pair = (_encode(tokenizer, source, wrap_source), labels)
            if len(pair[0]) > context or len(labels) > context:
                raise DataError(
                    f"{path}, line {number}: longer than the context ({context} tokens)"
                )
            pairs.append(pair)
        split = int(len(pairs) * (1 - val_fraction))
        if split < 1 or split == len(pairs):
            raise DataError(f"{path}: {len(pairs)} pairs are too few to hold some out")
        return cls(pairs, split, start, pad)

    def batch(self, part: str, batch_size: int, generator: torch.Generator) -> Batch:
        """Random pairs, right-padded: the source, the labels shifted right behind the start
        id (teacher forcing), their padding masks, and the labels (padding ``IGNORE``)."""
        low, high = (0, self.split) if part == "train" else (self.split, len(self.pairs))
        picks = torch.randint(low, high, (batch_size,), generator=generator).tolist()
        return self.rows(picks)

    def rows(self, picks: list[int]) -> Batch:
        """The batch of pairs ``picks`` (indices into :attr:`pairs`), as :meth:`batch` gives
        it."""
        chosen = [self.pairs[i] for i in picks]
        inputs = [[self.start, *labels[:-1]] for _, labels in chosen]
        src, src_mask = _pad([s for s, _ in chosen], self.pad)
        tgt, tgt_mask = _pad(inputs, self.pad)
        out, _ = _pad([labels for _, labels in chosen], IGNORE)
        return {"src_ids": src, "tgt_ids": tgt, "src_mask": src_mask, "tgt_mask": tgt_mask}, out


def _encode(tokenizer: Any, text: str, wrap: bool) -> list[int]:
    """``text``'s ids, with the tokenizer's sequence tokens when ``wrap``."""
    return list(tokenizer.encode(text, add_special_tokens=True) if wrap else tokenizer.encode(text))


def _labels(tokenizer: Any, text: str, wrap: bool, eos: int) -> list[int]:
    """A target's labels: with ``wrap``, its ids with the sequence tokens (the tokenizer's
    target side where it has one), ``eos`` appended where they do not end with it; else the
    ids of the text and ``eos``."""
    if not wrap:
        return [*tokenizer.encode(text), eos]
    encode = getattr(tokenizer, "encode_target", tokenizer.encode)
    ids = list(encode(text, add_special_tokens=True))
    return ids if ids and ids[-1] == eos else [*ids, eos]


def _pair_ids(tokenizer: Any, decoder_start: int | None) -> tuple[int, int, int]:
    """``(start, eos, pad)`` for :class:`PairData`: the decoder's start (``decoder_start``,
    else the tokenizer's ``bos``), the tokenizer's end and padding ids."""
    start = tokenizer.bos_id if decoder_start is None else decoder_start
    ids = {"eos": tokenizer.eos_id, "pad": tokenizer.pad_id}
    missing = [role for role, i in ids.items() if i is None]
    if start is None:
        missing.insert(0, "bos (the decoder's start: the model names no decoder_start_token_id)")
    if missing:
        raise DataError(
            f"tokenizer {tokenizer.name!r} has no {', no '.join(missing)} id; an "
            "encoder-decoder trains on pairs with them (give a tokenizer that has them)"
        )
    return start, ids["eos"], ids["pad"]


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
