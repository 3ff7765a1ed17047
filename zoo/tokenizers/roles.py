"""Special-token roles: which token of a vocabulary is its ``bos``, ``eos``, ``pad``... (by
the tokenizer's files or its plugin), which of them wrap a sequence (``[CLS] ... [SEP]``),
and which ids end a generated text. Each is checked against the vocabulary once, when the
tokenizer is made."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from .errors import TokenizerError

__all__ = ["ROLES", "ending_ids", "role_ids", "wrapping"]

#: The special-token roles a tokenizer may fill.
ROLES: tuple[str, ...] = ("bos", "eos", "pad", "unk", "sep", "cls")


def role_ids(
    name: str, roles: Mapping[str, str], token_to_id: Callable[[str], int | None]
) -> dict[str, int]:
    """Role -> id of its token, for tokenizer ``name``.

    Raises:
        TokenizerError: an unknown role, or a role token that is not in the vocabulary.
    """
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise TokenizerError(
            f"unknown special-token role(s) {unknown}; valid roles are {', '.join(ROLES)}"
        )
    ids: dict[str, int] = {}
    for role, token in roles.items():
        token_id = token_to_id(token)
        if token_id is None:
            raise TokenizerError(
                f"{name}: the {role} token {token!r} is not in the vocabulary; "
                "use one of its tokens or add it as a special token first"
            )
        ids[role] = token_id
    return ids


def wrapping(
    name: str, wrap: tuple[str | None, str | None], ids: Mapping[str, int]
) -> tuple[list[int], list[int]]:
    """The ids added before and after a sequence: those of the roles ``wrap`` names.

    Raises:
        TokenizerError: ``wrap`` names a role the tokenizer does not fill.
    """
    for wrapper in wrap:
        if wrapper is not None and wrapper not in ids:
            raise TokenizerError(f"{name}: cannot wrap sequences with {wrapper!r}: no such role")
    return (
        [ids[wrap[0]]] if wrap[0] is not None else [],
        [ids[wrap[1]]] if wrap[1] is not None else [],
    )


def ending_ids(
    name: str, ids: Mapping[str, int], extra: Sequence[int], vocab_size: int
) -> tuple[int, ...]:
    """Every id that ends a generated text: the ``eos`` role's first, then ``extra``, once each.

    Raises:
        TokenizerError: an ``extra`` id outside the vocabulary.
    """
    for token_id in extra:
        if type(token_id) is not int or not 0 <= token_id < vocab_size:
            raise TokenizerError(
                f"{name}: end id {token_id!r} is not an id of the vocabulary "
                f"(0 .. {vocab_size - 1})"
            )
    eos = [ids["eos"]] if "eos" in ids else []
    return tuple(dict.fromkeys([*eos, *extra]))
