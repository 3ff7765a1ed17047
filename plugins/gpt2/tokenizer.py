"""The GPT-2 tokenizer: byte-level BPE through tiktoken, from rank data shipped in this plugin.

``data/gpt2.tiktoken`` is tiktoken's own ``r50k_base`` / ``gpt2`` rank file (taken from the
openai-whisper source distribution, MIT; see ``data/LICENSE-gpt2-tiktoken.txt``). Its sha256 is
checked at load against the hash tiktoken itself expects, so the encoding equals
``tiktoken.get_encoding("gpt2")`` token for token, with no network.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from zoo import jsonfile
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
#: The files of this tokenizer in a Hugging Face GPT-2 folder (either set will do).
HF_FILES = (("vocab.json", "merges.txt"), ("tokenizer.json",))
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
    ``merges.txt`` or ``tokenizer.json`` (a Hugging Face GPT-2 folder), only once those
    files are checked to be GPT-2's own tokenizer (:func:`check_hf_files`).

    Raises:
        zoo.tokenizers.VocabularyFileError: the shipped ranks are damaged, or the
            directory's files are another tokenizer (zoo will not tokenize with GPT-2's
            in its place).
    """
    tokenizer = _shipped()
    if directory is not None:
        check_hf_files(Path(directory), tokenizer)
    return tokenizer


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 bytes to printable characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1)]
    printable += range(ord("\xae"), ord("\xff") + 1)
    extra = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(extra)) for b in range(256)}


@functools.lru_cache(maxsize=1)
def _ranks(tokenizer: TiktokenTokenizer) -> dict[str, int]:
    table = _byte_to_unicode()
    return {"".join(table[b] for b in token): rank
            for token, rank in tokenizer.encoding._mergeable_ranks.items()}  # fmt: skip


def _read_json(path: Path, where: str) -> Any:
    try:
        return jsonfile.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise VocabularyFileError(f"{where} cannot be read: {exc}") from None


def _check_vocab(vocab: Any, ranks: dict[str, int], where: str) -> None:
    if vocab != {**ranks, ENDOFTEXT: 50256} and vocab != ranks:
        size = len(vocab) if isinstance(vocab, dict) else 0
        raise VocabularyFileError(
            f"{where}: not GPT-2's vocabulary ({size} tokens, not GPT-2's 50257 with their "
            "ids); zoo does not tokenize it with GPT-2's BPE. Load the model with "
            "tokenizer=zoo.tokenizer(NAME) for the right one."
        )


def _check_merges(merges: list[Any], ranks: dict[str, int], where: str) -> None:
    """Merges of two tokens into a token, in the order of its rank, reaching every token
    longer than one byte (GPT-2's own merges file and those :func:`zoo.export` writes)."""
    last, reached = -1, set()
    for number, merge in enumerate(merges, start=1):
        parts = merge.split(" ") if isinstance(merge, str) else merge
        ok = isinstance(parts, list) and len(parts) == 2 and all(isinstance(p, str) for p in parts)
        rank = ranks.get("".join(parts)) if ok else None
        if rank is None or rank < last or parts[0] not in ranks or parts[1] not in ranks:
            raise VocabularyFileError(
                f"{where}: merge {number} ({str(merge)[:60]!r}) is not a merge of GPT-2's "
                "BPE (two tokens into a token, in rank order)"
            )
        last = rank
        reached.add(rank)
    if len(reached) != len(ranks) - 256:
        raise VocabularyFileError(
            f"{where}: the merges reach {len(reached)} of GPT-2's {len(ranks) - 256} merged "
            "tokens; they are not GPT-2's"
        )


#: The pre-tokenizer's split of a ``tokenizer.json`` :func:`zoo.export` writes (tiktoken's).
_SPLIT = {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False}


_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False}


def _pre_tokenizer(pre: dict[str, Any]) -> bool:
    """GPT-2's byte-level split: transformers' own form (GPT-2's regex in ``ByteLevel``), or
    tiktoken's regex then bytes alone (``use_regex`` off: no second split)."""
    if _BYTE_LEVEL.items() <= pre.items() and pre.get("use_regex") is True:
        return True
    steps = pre.get("pretokenizers") or []
    return (
        pre.get("type") == "Sequence"
        and len(steps) == 2
        and steps[0] == _SPLIT
        and _BYTE_LEVEL.items() <= steps[1].items()
        and steps[1].get("use_regex") is False
    )


def _plain_bpe(model: dict[str, Any]) -> bool:
    keys = ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback")
    return model.get("type") == "BPE" and not any(model.get(k) for k in keys)


def _post_processor(post: dict[str, Any] | None) -> bool:
    return (
        post is None
        or post.get("type") == "ByteLevel"
        or (post.get("type") == "TemplateProcessing" and not post.get("special_tokens"))
    )


def _endoftext(added: Any) -> bool:
    """``<|endoftext|>`` = 50256 as tiktoken matches it: a special token that takes no space
    around it (``lstrip`` would take the space before it: "a <|endoftext|>" without " ")."""
    return (
        isinstance(added, dict)
        and added.get("content") == ENDOFTEXT
        and added.get("id") == 50256
        and added.get("special") is True
        and not any(added.get(k) for k in ("lstrip", "rstrip", "single_word"))
    )


#: Each part of a ``tokenizer.json`` and what GPT-2's must be.
_PIPELINE: dict[str, Callable[[Any], bool]] = {
    "normalizer": lambda normalizer: normalizer is None,
    "pre_tokenizer": lambda pre: _pre_tokenizer(pre or {}),
    "model": lambda model: _plain_bpe(model or {}),
    "added_tokens": lambda added: all(_endoftext(t) for t in added or []),
    "decoder": lambda decoder: (decoder or {}).get("type") == "ByteLevel",
    "post_processor": _post_processor,
}


def _check_pipeline(data: dict[str, Any], where: str) -> None:
    """The rest of a ``tokenizer.json``: GPT-2's byte-level pre-tokenizer and decoder, no
    normalizer, a plain BPE model, ``<|endoftext|>`` = 50256 the only added token."""
    wrong = [key for key, ok in _PIPELINE.items() if not ok(data.get(key))]
    if wrong:
        shown = ", ".join(f"{k} = {json.dumps(data.get(k))[:80]}" for k in wrong)
        raise VocabularyFileError(
            f"{where}: not GPT-2's tokenizer ({shown}); zoo does not tokenize it with GPT-2's "
            "BPE. Load the model with tokenizer=zoo.tokenizer(NAME) for the right one."
        )


def check_hf_files(directory: Path, tokenizer: TiktokenTokenizer) -> None:
    """Check that the Hugging Face tokenizer files in ``directory`` (``vocab.json`` +
    ``merges.txt``, ``tokenizer.json``: each that is there) are GPT-2's tokenizer: every
    token with the id of the shipped ranks (``<|endoftext|>`` = 50256), merges GPT-2's BPE
    makes in the order it makes them, and (``tokenizer.json``) GPT-2's byte-level pipeline.

    Raises:
        zoo.tokenizers.VocabularyFileError: naming the file and what differs.
    """
    ranks = _ranks(tokenizer)
    if (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
        where = f"{directory}: vocab.json + merges.txt"
        _check_vocab(_read_json(directory / "vocab.json", where), ranks, where)
        try:
            lines = (directory / "merges.txt").read_text(encoding="utf-8").splitlines()
        except (OSError, ValueError) as exc:
            raise VocabularyFileError(f"{where} cannot be read: {exc}") from None
        merges = [line for line in lines if line and not line.startswith("#version")]
        _check_merges(merges, ranks, where)
    if (directory / "tokenizer.json").is_file():
        where = f"{directory / 'tokenizer.json'}"
        data = _read_json(directory / "tokenizer.json", where)
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise VocabularyFileError(f"{where} is not a tokenizers file")
        _check_pipeline(data, where)
        _check_vocab(data["model"].get("vocab"), ranks, where)
        merges = data["model"].get("merges")
        _check_merges(merges if isinstance(merges, list) else [None], ranks, where)
