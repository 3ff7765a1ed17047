"""A zoo tokenizer as the files ``transformers.AutoTokenizer.from_pretrained`` reads.

:func:`zoo.export` writes a model in a Hugging Face layout; with these files beside the
weights, ``AutoTokenizer.from_pretrained(DIR)`` gives the model's own tokenizer too: the same
ids for the same text, the same text back. What is written:

- ``tokenizer.json``: the whole pipeline in the ``tokenizers`` library's format. A tiktoken
  tokenizer (``gpt2-bpe``) becomes the equivalent byte-level BPE: its ranks are the vocabulary,
  every split of a token into two tokens is a merge ordered by the token's rank, the vocabulary
  is matched before merging (``ignore_merges``, as tiktoken does), and its own split pattern
  cuts the text first. A ``tokenizers`` tokenizer (``gpt1-bpe``, Llama's) is written as it is.
  The post-processor adds exactly the sequence tokens zoo adds with ``add_special_tokens=True``.
- ``tokenizer_config.json``: the special tokens by role and ``model_max_length``.
- ``vocab.json`` + ``merges.txt`` for a byte-level BPE (tools that read GPT-2's two files).

A tokenizer with Hugging Face files of its own writes those instead (its ``hf_files``): a
SentencePiece pair writes ``MarianTokenizer``'s ``source.spm``, ``target.spm``,
``vocab.json`` and ``tokenizer_config.json``.

A tokenizer that cannot be written this way raises :class:`TokenizerExportError` saying why.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from ..errors import CheckpointError

__all__ = ["TokenizerExportError", "hf_tokenizer_files", "library_of"]


class TokenizerExportError(CheckpointError):
    """A zoo tokenizer has no faithful Hugging Face ``tokenizer.json`` form."""


@functools.lru_cache(maxsize=1)
def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 bytes to printable characters (the ``ByteLevel``
    alphabet of ``tokenizers``)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return chars


def _as_unicode(token: bytes) -> str:
    table = _byte_to_unicode()
    return "".join(table[b] for b in token)


def _byte_level_bpe(
    ranks: dict[bytes, int], pattern: str | None, specials: dict[str, int], what: str
) -> tuple[Any, dict[str, int], list[tuple[str, str]]]:
    """The ``tokenizers`` byte-level BPE equal to tiktoken over ``ranks`` and ``pattern``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TokenizerExportError(f"{what}: its ranks are not the ids 0 .. {len(ranks) - 1}")
    vocab = {_as_unicode(token): rank for token, rank in ranks.items()}
    found: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = ranks.get(token[:cut]), ranks.get(token[cut:])
            if left is not None and right is not None:
                found.append(
                    (rank, left, right, _as_unicode(token[:cut]), _as_unicode(token[cut:]))
                )
    found.sort()
    merges = [(left, right) for _, _, _, left, right in found]
    library = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=True))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pattern is None:
        library.pre_tokenizer = byte_level
    else:
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
        library.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    library.decoder = decoders.ByteLevel()
    for special, token_id in sorted(specials.items(), key=lambda item: item[1]):
        library.add_special_tokens([AddedToken(special, special=True, normalized=False)])
        if library.token_to_id(special) != token_id:
            raise TokenizerExportError(
                f"{what}: special token {special!r} has id {token_id}, which a tokenizer.json "
                "cannot give it (special tokens there follow the vocabulary)"
            )
    return library, vocab, merges


def library_of(tokenizer: Any, what: str) -> tuple[Any, dict[str, bytes]]:
    """The ``tokenizers.Tokenizer`` equal to ``tokenizer`` (without sequence tokens), and the
    extra files (``vocab.json``, ``merges.txt``) a byte-level BPE is also read from."""
    from tokenizers import Tokenizer

    from ..tokenizers.byte import ByteTokenizer
    from ..tokenizers.hf_backend import HFTokenizer
    from ..tokenizers.tiktoken_backend import TiktokenTokenizer

    if isinstance(tokenizer, HFTokenizer):
        return Tokenizer.from_str(tokenizer.tokenizer.to_str()), {}
    if isinstance(tokenizer, TiktokenTokenizer):
        encoding = tokenizer.encoding
        ranks, pattern = dict(encoding._mergeable_ranks), encoding._pat_str
    elif isinstance(tokenizer, ByteTokenizer):
        ranks, pattern = {bytes([b]): b for b in range(256)}, None
    else:
        raise TokenizerExportError(
            f"{what} is a {type(tokenizer).__name__}, which zoo cannot write as a Hugging Face "
            "tokenizer.json (it writes tiktoken, tokenizers and byte tokenizers)"
        )
    library, vocab, merges = _byte_level_bpe(ranks, pattern, tokenizer.special_tokens, what)
    text = "#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in merges)
    extra = {
        "vocab.json": json.dumps({**vocab, **tokenizer.special_tokens}, ensure_ascii=False).encode(
            "utf-8"
        ),
        "merges.txt": text.encode("utf-8"),
    }
    return library, extra


def hf_tokenizer_files(tokenizer: Any, *, model_max_length: int | None) -> dict[str, bytes]:
    """The Hugging Face tokenizer files of a zoo tokenizer, by file name.

    Args:
        tokenizer: a :class:`zoo.tokenizers.Tokenizer`.
        model_max_length: the model's context length (``tokenizer_config.json``), if any.

    Raises:
        TokenizerExportError: the tokenizer has no faithful ``tokenizer.json`` form.
    """
    own_files = getattr(tokenizer, "hf_files", None)
    if callable(own_files):  # a tokenizer with files of its own (a SentencePiece pair's)
        return dict(own_files(model_max_length=model_max_length))
    return _library_files(tokenizer, model_max_length)


def _library_files(tokenizer: Any, model_max_length: int | None) -> dict[str, bytes]:
    """``tokenizer.json`` (and its companions) of a tokenizer the ``tokenizers`` library can
    hold, with ``tokenizer_config.json``."""
    from tokenizers import processors

    what = f"tokenizer {getattr(tokenizer, 'name', '?')!r}"
    library, files = library_of(tokenizer, what)
    specials = tokenizer.special_tokens
    library.add_special_tokens([t for t in specials if library.token_to_id(t) is None])
    # the sequence tokens zoo adds with add_special_tokens=True (transformers' default)
    ids = {token: library.token_to_id(token) for token in specials}
    prefix, suffix = (tokenizer.roles.get(r) if r else None for r in tokenizer._wrap)
    single = " ".join([*([prefix] if prefix else []), "$A", *([suffix] if suffix else [])])
    pair = " ".join([single, *([prefix] if prefix else []), "$B:1", *([suffix] if suffix else [])])
    used = [t for t in (prefix, suffix) if t]
    library.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, ids[t]) for t in dict.fromkeys(used)]
    )
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length if model_max_length else int(1e30),
    }
    for role, token in tokenizer.roles.items():
        config[f"{role}_token"] = token
    files["tokenizer.json"] = library.to_str(pretty=True).encode("utf-8")
    files["tokenizer_config.json"] = (json.dumps(config, indent=2) + "\n").encode("utf-8")
    return files
