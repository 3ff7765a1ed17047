"""The GPT-2 tokenizer: byte-level BPE through tiktoken, from rank data shipped in this plugin.

``data/gpt2.tiktoken`` is tiktoken's own ``r50k_base`` / ``gpt2`` rank file (taken from the
openai-whisper source distribution, MIT; see ``data/LICENSE-gpt2-tiktoken.txt``). Its sha256 is
checked at load against the hash tiktoken itself expects, so the encoding equals
``tiktoken.get_encoding("gpt2")`` token for token, with no network.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from zoo.tokenizers.tiktoken_backend import TiktokenTokenizer

__all__ = ["DESCRIPTION", "ENDOFTEXT", "PATTERN", "RANKS_SHA256", "load"]

#: tiktoken's expected sha256 of the GPT-2 (r50k_base) ranks file.
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
ENDOFTEXT = "<|endoftext|>"
#: tiktoken's split pattern for gpt2 / r50k_base (equivalent to the GPT-2 release's, faster).
PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
DESCRIPTION = "GPT-2 byte-level BPE (tiktoken), 50257 ids, shipped with zoo"


def _ranks_path() -> Path:
    return Path(str(resources.files("zoo_plugins.gpt2").joinpath("data/gpt2.tiktoken")))


@functools.lru_cache(maxsize=1)
def load() -> TiktokenTokenizer:
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
