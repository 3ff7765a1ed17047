"""The checks every tokenizer makes on what it is given: text (a ``str`` of valid Unicode),
batches of text, ``allowed_special`` arguments and ids to decode. Each refusal says what was
wrong and how to fix it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from .errors import TokenizerError, TokenizerInputError

__all__ = ["AllowedSpecial", "allowed_specials", "check_ids", "check_text", "check_texts"]

#: What ``allowed_special`` may be: ``False`` (special-token strings in the text are text),
#: ``"all"`` / ``True`` (each becomes its id), or the set of those that may.
AllowedSpecial = bool | Literal["all"] | Iterable[str]


def _check_unicode(text: str, where: str) -> None:
    """Refuse text that is not valid Unicode (a lone surrogate such as ``"\\ud800"``, what
    ``bytes.decode(errors="surrogateescape")`` leaves): libraries replace it or crash."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TokenizerInputError(
            f"{where}: the text holds a lone surrogate {text[exc.start]!r} at index {exc.start}, "
            "which is not a Unicode character; decode the bytes with errors='replace' (or fix "
            "the source) first"
        ) from None


def _text_error(value: object, where: str) -> TokenizerInputError:
    return TokenizerInputError(
        f"{where} takes text as str, got {type(value).__name__}"
        + (": decode bytes first (bytes.decode('utf-8'))" if isinstance(value, bytes) else "")
    )


def check_text(text: object, where: str) -> str:
    """``text``, refused unless it is a ``str`` of valid Unicode (``where``: the method, for
    the message)."""
    if not isinstance(text, str):
        raise _text_error(text, where)
    _check_unicode(text, where)
    return text


def check_texts(texts: Sequence[str]) -> list[str]:
    """A batch of texts as a list, each checked as :func:`check_text` checks one."""
    if isinstance(texts, str) or not isinstance(texts, Iterable):
        raise TokenizerInputError(
            f"expected a sequence of str, got {type(texts).__name__}"
            + ("; wrap a single text in a list" if isinstance(texts, str) else "")
        )
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise _text_error(text, f"item {i} of the batch:")
        _check_unicode(text, f"item {i} of the batch")
    return texts


def allowed_specials(
    name: str, specials: Mapping[str, int], allowed_special: AllowedSpecial
) -> frozenset[str]:
    """The special-token strings of ``specials`` (tokenizer ``name``'s) that become ids, from
    an ``allowed_special`` argument."""
    if allowed_special is False or allowed_special is None:
        return frozenset()
    if allowed_special is True or allowed_special == "all":
        return frozenset(specials)
    if isinstance(allowed_special, str) or not isinstance(allowed_special, Iterable):
        raise TokenizerInputError(
            f"allowed_special must be False, 'all' or a set of special tokens, got "
            f"{allowed_special!r}"
        )
    allowed = frozenset(allowed_special)
    unknown = sorted(allowed - set(specials))
    if unknown:
        raise TokenizerError(
            f"{name} has no special token(s) {unknown}; its special tokens are: "
            f"{', '.join(sorted(specials)) or 'none'}"
        )
    return allowed


def check_ids(name: str, vocab_size: int, ids: Sequence[int] | Any) -> list[int]:
    """``ids`` (a sequence, or a tensor or array) as a list of ints of tokenizer ``name``'s
    vocabulary (``0 .. vocab_size - 1``)."""
    if hasattr(ids, "tolist"):  # torch / numpy arrays
        ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TokenizerInputError(f"decode takes a sequence of int ids, got {type(ids).__name__}")
    ids = list(ids)
    if not ids:
        return ids
    if not all(type(i) is int for i in ids):
        bad = next(i for i in ids if type(i) is not int)
        hint = "; use decode_batch for a batch" if isinstance(bad, (list, tuple)) else ""
        raise TokenizerInputError(f"decode takes int ids, got {type(bad).__name__} ({bad!r}){hint}")
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise TokenizerError(
            f"id {bad} is outside the vocabulary of {name} (valid ids are 0 .. {vocab_size - 1})"
        )
    return ids
