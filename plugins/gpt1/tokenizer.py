"""The GPT-1 tokenizer: the original OpenAI GPT BPE (40,478 ids, ``</w>`` word ends),
built with the ``tokenizers`` library exactly as ``transformers.OpenAIGPTTokenizer`` builds it.

Text standardisation is BERT's basic tokenisation (drop control characters, split CJK
characters, lowercase and strip accents, split on whitespace and punctuation): that is what
``OpenAIGPTTokenizer`` does (and what its older Python version fell back to without ftfy and
spaCy). The original 2018 release ran ftfy + spaCy + a few character replacements instead;
that pipeline needs spaCy and is not reproduced.

The vocabulary is not on any package registry: ``vocab.json`` and ``merges.txt`` are fetched
from the Hub repo ``openai-community/openai-gpt`` and cached, or read from a local directory.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from zoo import jsonfile
from zoo.hub.tokenizer_files import hub_files
from zoo.tokenizers.errors import VocabularyFileError
from zoo.tokenizers.hf_backend import HFTokenizer
from zoo.tokenizers.vocab_files import read_verified

__all__ = ["DESCRIPTION", "HUB_REPO", "N_MERGES", "VOCAB_SIZE", "from_files", "load"]

HUB_REPO = "openai-community/openai-gpt"
VOCAB_SIZE = 40478
N_MERGES = 40000
UNK = "<unk>"
DESCRIPTION = (
    "OpenAI GPT BPE (tokenizers), 40478 ids, lowercased, </w> word ends; "
    f"files from the Hub repo {HUB_REPO}"
)
_FIX = (
    "pass directory=... holding vocab.json and merges.txt of openai-community/openai-gpt "
    "(zoo.tokenizer('gpt1', directory=...))"
)


def _read_vocab(path: Path) -> dict[str, int]:
    data = read_verified(path, sha256=None, what="GPT-1 vocab.json", fix=_FIX)
    try:
        vocab = jsonfile.loads(data)
    except ValueError as exc:  # not UTF-8, not JSON, nested too deep
        raise VocabularyFileError(f"{path} is not a JSON vocabulary: {exc}") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise VocabularyFileError(f"{path} is not a token -> id JSON object")
    if len(vocab) != VOCAB_SIZE or sorted(vocab.values()) != list(range(VOCAB_SIZE)):
        raise VocabularyFileError(
            f"{path} holds {len(vocab)} tokens, expected {VOCAB_SIZE} with ids 0 .. "
            f"{VOCAB_SIZE - 1}: it is not the GPT-1 vocabulary (vocab.json of {HUB_REPO})"
        )
    return vocab


def _read_merges(path: Path) -> list[tuple[str, str]]:
    data = read_verified(path, sha256=None, what="GPT-1 merges.txt", fix=_FIX)
    merges: list[tuple[str, str]] = []
    for number, line in enumerate(data.decode("utf-8", "replace").split("\n"), start=1):
        if not line or line.startswith("#version"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise VocabularyFileError(f"{path}: line {number} is not a merge 'a b': {line!r}")
        merges.append((parts[0], parts[1]))
    if len(merges) != N_MERGES:
        raise VocabularyFileError(
            f"{path} holds {len(merges)} merges, expected {N_MERGES}: it is not the GPT-1 "
            f"merges file (merges.txt of {HUB_REPO})"
        )
    return merges


def from_files(vocab_file: str | Path, merges_file: str | Path) -> HFTokenizer:
    """The GPT-1 tokenizer from local files (``vocab.json`` / ``encoder_bpe_40000.json`` and
    ``merges.txt`` / ``vocab_40000.bpe``), checked for size and shape.

    Raises:
        zoo.tokenizers.VocabularyFileError: a file missing, malformed or of the wrong size.
    """
    vocab = _read_vocab(Path(vocab_file))
    merges = _read_merges(Path(merges_file))
    tokenizer = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="</w>",
            fuse_unk=False,
            unk_token=UNK,
        )
    )
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.BPEDecoder(suffix="</w>")
    tokenizer.add_special_tokens([UNK])  # already id 0 of the vocabulary: marks it special
    return HFTokenizer(
        tokenizer,
        name="gpt1-bpe",
        roles={"unk": UNK},
        description=DESCRIPTION,
        by_name=True,
    )


def load(
    directory: str | Path | None = None,
    *,
    revision: str = "main",
    cache_dir: str | Path | None = None,
) -> HFTokenizer:
    """The GPT-1 tokenizer.

    Args:
        directory: a local directory holding ``vocab.json`` and ``merges.txt``; by default
            they are fetched from the Hub repo ``openai-community/openai-gpt`` (cached).
        revision: Hub revision of that repo.
        cache_dir: Hub cache directory (default ``HF_HUB_CACHE``).

    Raises:
        zoo.tokenizers.TokenizerUnavailableError: offline (or no network) and not cached.
        zoo.tokenizers.VocabularyFileError: the files are not the GPT-1 vocabulary.
    """
    if directory is not None:
        directory = Path(directory)
        return from_files(directory / "vocab.json", directory / "merges.txt")
    vocab, merges = hub_files(
        HUB_REPO,
        ["vocab.json", "merges.txt"],
        revision=revision,
        cache_dir=cache_dir,
        what="GPT-1 BPE vocabulary",
        fix=_FIX,
    )
    return from_files(vocab, merges)
