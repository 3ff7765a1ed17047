"""The GPT-2 tokenizer: byte-level BPE through tiktoken, from rank data shipped in this plugin.

``data/gpt2.tiktoken`` is tiktoken's own ``r50k_base`` / ``gpt2`` rank file (taken from the
openai-whisper source distribution, MIT; see ``data/LICENSE-gpt2-tiktoken.txt``). Its sha256 is
checked at load against the hash tiktoken itself expects, so the encoding equals
``tiktoken.get_encoding("gpt2")`` token for token, with no network.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path

from zoo.tokenizers.errors import VocabularyFileError
from zoo.tokenizers.tiktoken_backend import TiktokenTokenizer

__all__ = [
    "DESCRIPTION",
    "ENDOFTEXT",
    "HF_FILES",
    "PATTERN",
    "RANKS_SHA256",
    "check_hf_files",
    "load",
]

#: tiktoken's expected sha256 of the GPT-2 (r50k_base) ranks file.
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
ENDOFTEXT = "<|endoftext|>"
#: tiktoken's split pattern for gpt2 / r50k_base (equivalent to the GPT-2 release's, faster).
PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
#: The files of this tokenizer in a Hugging Face GPT-2 folder.
HF_FILES = ("vocab.json", "merges.txt")
DESCRIPTION = "GPT-2 byte-level BPE (tiktoken), 50257 ids, shipped with zoo"


def _ranks_path() -> Path:
    return Path(str(resources.files("zoo_plugins.gpt2").joinpath("data/gpt2.tiktoken")))


@functools.lru_cache(maxsize=1)
def _shipped() -> TiktokenTokenizer:
    """The GPT-2 tokenizer (``<|endoftext|>`` = 50256 is bos and eos; no pad, no unk).

    Built once per process and shared: treat it as read-only.

    Raises:
        zoo.tokenizers.VocabularyFileError: the shipped ranks file is missing or corrupted.
    """
    return TiktokenTokenizer.from_ranks_file(
        _ranks_path(),
        pattern=PATTERN,
        special_tokens={ENDOFTEXT: 50256},
        sha256=RANKS_SHA256,
        expected_size=50256,
        what="GPT-2 BPE ranks",
        fix="Reinstall zoo (pip install --force-reinstall torch-zoo) to restore the shipped file.",
        name="gpt2-bpe",
        roles={"bos": ENDOFTEXT, "eos": ENDOFTEXT},
        description=DESCRIPTION,
        by_name=True,
    )


def load(directory: str | Path | None = None) -> TiktokenTokenizer:
    """The GPT-2 tokenizer; for a checkpoint ``directory`` holding ``vocab.json`` and
    ``merges.txt`` (a Hugging Face GPT-2 folder), only once those files are checked to be
    GPT-2's own vocabulary (see :func:`check_hf_files`).

    Raises:
        zoo.tokenizers.VocabularyFileError: the shipped ranks are damaged, or the
            directory's files are another vocabulary (zoo will not tokenize with GPT-2's
            in its place).
    """
    tokenizer = _shipped()
    if directory is not None and all((Path(directory) / f).is_file() for f in HF_FILES):
        check_hf_files(Path(directory), tokenizer)
    return tokenizer


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 bytes to printable characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1)]
    printable += range(ord("\xae"), ord("\xff") + 1)
    extra = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(extra)) for b in range(256)}


def check_hf_files(directory: Path, tokenizer: TiktokenTokenizer) -> None:
    """Check that ``vocab.json`` + ``merges.txt`` in ``directory`` are GPT-2's vocabulary:
    every token with the id of the shipped ranks (``<|endoftext|>`` = 50256, nothing else),
    and merges of two tokens into a token, in the order of its rank, reaching every token
    longer than one byte (the Hub's files and those :func:`zoo.export` writes are such)."""
    table = _byte_to_unicode()
    ranks = {"".join(table[b] for b in token): rank
             for token, rank in tokenizer.encoding._mergeable_ranks.items()}  # fmt: skip
    want = {**ranks, ENDOFTEXT: 50256}
    where = f"{directory}: vocab.json + merges.txt"
    try:
        vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        lines = (directory / "merges.txt").read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError, RecursionError) as exc:
        raise VocabularyFileError(f"{where} cannot be read: {exc}") from None
    if vocab != want:
        raise VocabularyFileError(
            f"{where} are not GPT-2's vocabulary ({len(vocab) if isinstance(vocab, dict) else 0}"
            " tokens, not GPT-2's 50257 with their ids); zoo does not tokenize them with "
            "GPT-2's BPE. Load the model with tokenizer=zoo.tokenizer(NAME) for the right one."
        )
    last, reached = -1, set()
    for number, line in enumerate(lines, start=1):
        if not line or line.startswith("#version"):
            continue
        parts = line.split(" ")
        rank = ranks.get("".join(parts)) if len(parts) == 2 else None
        if rank is None or rank < last or parts[0] not in ranks or parts[1] not in ranks:
            raise VocabularyFileError(
                f"{where}: merges.txt line {number} ({line[:60]!r}) is not a merge of GPT-2's "
                "BPE (two tokens into a token, in rank order)"
            )
        last = rank
        reached.add(rank)
    if len(reached) != len(ranks) - 256:
        raise VocabularyFileError(
            f"{where}: merges.txt reaches {len(reached)} of GPT-2's {len(ranks) - 256} merged "
            "tokens; it is not GPT-2's merges file"
        )
