"""The tokenizer protocol shared by every plugin, and the logic common to all backends.

A backend (:mod:`~zoo.tokenizers.tiktoken_backend`, :mod:`~zoo.tokenizers.hf_backend`) wraps a
well-kept library and implements a handful of ``_``-methods; this base class adds the input
checks (:mod:`.inputs`), special-token roles and ``[CLS] ... [SEP]``-style wrapping
(:mod:`.roles`) and padded tensor batches (:mod:`.padding`), so every tokenizer in the zoo
behaves the same way. Nothing here imports torch until :meth:`Tokenizer.encode_padded` is
called.
"""

from __future__ import annotations

import abc
import hashlib
import json
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, overload

from .errors import ChatTemplateError, TokenizerError
from .inputs import AllowedSpecial, allowed_specials, check_ids, check_text, check_texts
from .padding import Padding, PaddingSide, check_padding, fit, padded
from .roles import ROLES, ending_ids, role_ids, wrapping

if TYPE_CHECKING:
    import torch

    from .chat import ChatTemplate

__all__ = ["ROLES", "Tokenizer", "check_fits"]


class Tokenizer(abc.ABC):
    """A tokenizer: text to token ids and back, with the special ids a model needs.

    Args:
        name: the registered tokenizer name (``"gpt2-bpe"``), kept when saved.
        roles: special-token role (one of :data:`ROLES`) -> token string, e.g.
            ``{"eos": "<|endoftext|>"}``. Each token must be in the vocabulary.
        wrap: the roles added before and after a sequence when ``add_special_tokens=True``,
            e.g. ``("cls", "sep")`` for BERT's ``[CLS] ... [SEP]``; ``None`` adds nothing there.
        description: one line for ``zoo info``.
        by_name: ``True`` when the tokenizer can be recreated from its name alone (shipped or
            pinned data), so saving it next to weights stores only the name.
        chat: the model's chat template (:class:`~zoo.tokenizers.chat.ChatTemplate`), if it
            has one: :meth:`apply_chat_template` renders conversations with it.
        end_ids: ids that end a generated text besides ``eos`` (an instruct model's
            end-of-turn, e.g. Qwen's ``<|im_end|>`` and ``<|endoftext|>``).

    Raises:
        TokenizerError: an unknown role, a role token that is not in the vocabulary, or an
            end id outside it.
    """

    #: Tag of the concrete class in a saved tokenizer's manifest (``zoo_tokenizer.json``).
    kind: ClassVar[str] = ""

    #: Whether an encoder-decoder's source text is encoded with the sequence tokens
    #: (``add_special_tokens=True``), as ``transformers`` encodes Marian's, BART's and T5's
    #: sources (a Hugging Face folder's tokenizer); zoo's own trained ones encode it bare.
    source_special_tokens: bool = False

    def __init__(
        self,
        *,
        name: str,
        roles: Mapping[str, str] | None = None,
        wrap: tuple[str | None, str | None] = (None, None),
        description: str = "",
        by_name: bool = False,
        chat: ChatTemplate | None = None,
        end_ids: Sequence[int] = (),
    ) -> None:
        self.name = name
        self.description = description
        self.by_name = by_name
        self._roles: dict[str, str] = dict(roles or {})
        self._role_ids = role_ids(name, self._roles, self.token_to_id)
        self._wrap = wrap
        self._prefix, self._suffix = wrapping(name, wrap, self._role_ids)
        self._chat = chat
        self._end_ids = ending_ids(name, self._role_ids, end_ids, self.vocab_size)

    # -- what a backend implements ----------------------------------------------------------
    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special tokens included (the model's embedding rows)."""

    @property
    @abc.abstractmethod
    def backend(self) -> str:
        """The library doing the work (``"tiktoken"``, ``"tokenizers"``)."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of ``token`` (a vocabulary entry or special token), ``None`` if absent."""

    @abc.abstractmethod
    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry of ``token_id`` (byte-level tokens as the library shows them)."""

    @property
    @abc.abstractmethod
    def special_tokens(self) -> dict[str, int]:
        """Every special (control) token -> its id."""

    @abc.abstractmethod
    def _encode(self, text: str, allowed: frozenset[str]) -> list[int]:
        """Ids of ``text``; the special-token strings in ``allowed`` become their ids, every
        other special-token string is encoded as the text it is."""

    @abc.abstractmethod
    def _encode_batch(self, texts: list[str], allowed: frozenset[str]) -> list[list[int]]: ...

    def _encode_iter(self, text: str, allowed: frozenset[str]) -> Iterator[list[int]]:
        """The ids of ``text`` in consecutive lists (see :meth:`iter_encode`); a backend that
        can cut long text without changing its ids overrides this."""
        yield self._encode(text, allowed)

    def _content(self) -> Iterator[bytes]:
        """The serialised state that decides the ids (vocabulary, merges or ranks, rules),
        for :meth:`fingerprint`. This default lists every id's token; backends yield their
        exact serialisation."""
        for token_id in range(self.vocab_size):
            try:
                yield self.id_to_token(token_id).encode("utf-8", "surrogatepass")
            except TokenizerError:
                yield b"\x00(no token)"

    @abc.abstractmethod
    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str: ...

    @abc.abstractmethod
    def save(self, directory: str | Path) -> list[str]:
        """Write everything needed to rebuild this tokenizer into ``directory`` (created if
        needed), with a ``zoo_tokenizer.json`` manifest; :func:`zoo.tokenizers.load_directory`
        reads it back. Returns the names of the files written."""

    @classmethod
    def from_manifest(cls, directory: Path, manifest: Mapping[str, Any]) -> Tokenizer:
        """Rebuild a tokenizer written by :meth:`save`; the manifest is already verified.
        Use :func:`zoo.tokenizers.load_directory` rather than calling this directly."""
        raise NotImplementedError(f"{cls.__name__} cannot be loaded from a directory")

    # -- special ids --------------------------------------------------------------------------
    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence id, or ``None``."""
        return self._role_ids.get("bos")

    @property
    def eos_id(self) -> int | None:
        """End-of-sequence id (generation stops there), or ``None``."""
        return self._role_ids.get("eos")

    @property
    def pad_id(self) -> int | None:
        """Padding id, or ``None`` (then :meth:`encode_padded` pads with ``eos_id``)."""
        return self._role_ids.get("pad")

    @property
    def unk_id(self) -> int | None:
        """Unknown-token id, or ``None`` (byte-level vocabularies need none)."""
        return self._role_ids.get("unk")

    @property
    def sep_id(self) -> int | None:
        """Separator id, or ``None``."""
        return self._role_ids.get("sep")

    @property
    def cls_id(self) -> int | None:
        """Classification / start id, or ``None``."""
        return self._role_ids.get("cls")

    @property
    def roles(self) -> dict[str, str]:
        """Special-token role -> token string."""
        return dict(self._roles)

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Every id that ends a generated text: ``eos_id`` first, then the model's other
        end-of-turn ids (``generation_config.json``'s ``eos_token_id``); generation stops at
        any of them."""
        return self._end_ids

    # -- chat ---------------------------------------------------------------------------------
    @property
    def chat_template(self) -> str | dict[str, str] | None:
        """The Jinja source of the model's chat template (a dict of named templates when it
        has several), or ``None``."""
        return self._chat.source if self._chat is not None else None

    @overload
    def apply_chat_template(
        self,
        messages: Any,
        *,
        add_generation_prompt: bool = ...,
        tokenize: Literal[False] = ...,
        continue_final_message: bool | str = ...,
        tools: Sequence[Mapping[str, Any]] | None = ...,
        documents: Sequence[Mapping[str, Any]] | None = ...,
        chat_template: str | None = ...,
        **extra: Any,
    ) -> str: ...
    @overload
    def apply_chat_template(
        self,
        messages: Any,
        *,
        add_generation_prompt: bool = ...,
        tokenize: Literal[True],
        continue_final_message: bool | str = ...,
        tools: Sequence[Mapping[str, Any]] | None = ...,
        documents: Sequence[Mapping[str, Any]] | None = ...,
        chat_template: str | None = ...,
        **extra: Any,
    ) -> list[int]: ...
    def apply_chat_template(
        self,
        messages: Any,
        *,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        continue_final_message: bool | str = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        **extra: Any,
    ) -> str | list[int]:
        """A conversation as the prompt the model was trained on, through its chat template,
        rendered exactly as ``transformers``' ``apply_chat_template`` renders it (see
        :mod:`zoo.tokenizers.chat` for the sandbox it runs in).

            >>> tok.apply_chat_template(
            ...     [{"role": "user", "content": "Hi"}], add_generation_prompt=True
            ... )
            '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n'

        Args:
            messages: the conversation: dicts with ``role`` and ``content`` (and whatever
                else the template reads: ``tool_calls``, ``reasoning_content``...); message
                objects (dataclasses, pydantic models) are taken as their fields.
            add_generation_prompt: end with the start of an assistant turn, for generation.
            tokenize: return the token ids (every special token the template writes becomes
                its id, as ``transformers`` encodes the rendered text) instead of the text.
            continue_final_message: leave the last message open (a prefilled reply the model
                continues); a string names the field to continue (``"reasoning_content"``).
            tools: JSON schemas of the tools the model may call.
            documents: documents for retrieval-augmented templates.
            chat_template: the name of one of the model's templates, or a Jinja source to
                use instead of the model's.
            **extra: more template variables (``enable_thinking=False`` for Qwen3).

        Raises:
            ChatTemplateError: the tokenizer has no chat template (and none is given), the
                template refuses the conversation, or the sandbox stops it.
        """
        from .chat import ChatTemplate

        chat = self._chat
        if chat is None and chat_template is not None:
            chat = ChatTemplate({"default": chat_template}, self._template_tokens())
        if chat is None:
            raise ChatTemplateError(
                f"{self.name} has no chat template: its tokenizer files define none "
                "(no chat_template in tokenizer_config.json and no chat_template.jinja). Use "
                "an instruct (chat) model's tokenizer, or pass chat_template=JINJA_SOURCE"
            )
        text = chat.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            documents=documents,
            chat_template=chat_template,
            **extra,
        )
        return self.encode(text, allowed_special="all") if tokenize else text

    def _template_tokens(self) -> dict[str, str]:
        """The special-token variables a chat template sees (``bos_token``...), from the
        roles."""
        return {f"{role}_token": token for role, token in self._roles.items()}

    def special_id(self, token: str) -> int:
        """The id of the special token ``token``.

        Raises:
            TokenizerError: ``token`` is not one of this tokenizer's special tokens.
        """
        specials = self.special_tokens
        if token not in specials:
            known = ", ".join(sorted(specials)) or "none"
            raise TokenizerError(
                f"{self.name} has no special token {token!r}; its special tokens are: {known}"
            )
        return specials[token]

    # -- encode / decode ----------------------------------------------------------------------
    def encode(
        self,
        text: str,
        *,
        add_special_tokens: bool = False,
        allowed_special: AllowedSpecial = False,
    ) -> list[int]:
        """Token ids of ``text``.

        User text is text: a special-token string in it (``"<|endoftext|>"``, ``"[SEP]"``) is
        encoded as those characters, never as the control token, unless ``allowed_special``
        says so (as tiktoken's ``allowed_special`` and the ``tokenizers`` library's
        ``split_special_tokens`` do).

        Args:
            text: the text (valid Unicode: a lone surrogate is refused).
            add_special_tokens: wrap the ids in the tokenizer's sequence tokens (``[CLS] ...
                [SEP]`` for BERT, ``<s> ... </s>`` for the subword tokenizer; nothing for GPT).
            allowed_special: ``"all"`` (or ``True``) turns every special-token string in the
                text into its id, a set of strings only those; ``False`` (the default) none.
        """
        ids = self._encode(check_text(text, "encode"), self._allowed(allowed_special))
        if add_special_tokens and (self._prefix or self._suffix):
            ids = [*self._prefix, *ids, *self._suffix]
        return ids

    def iter_encode(
        self, text: str, *, allowed_special: AllowedSpecial = False
    ) -> Iterator[list[int]]:
        """The ids of ``text`` as :meth:`encode` gives them (no sequence tokens), in
        consecutive lists whose concatenation is exactly ``encode(text)``: a long text is cut
        where no token can cross, so memory stays bounded by the piece, not the text.
        """
        text = check_text(text, "iter_encode")
        yield from self._encode_iter(text, self._allowed(allowed_special))

    def fingerprint(self) -> str:
        """sha256 (hex) of everything that decides this tokenizer's ids: its class, special
        tokens and roles, and its full serialised state (vocabulary, merges or ranks,
        normalisation and splitting rules). Equal fingerprints encode every text alike;
        caches of token ids are keyed by it (the name and size are not enough)."""
        digest = hashlib.sha256()
        head = {
            "class": f"{type(self).__module__}.{type(self).__qualname__}",
            "vocab_size": self.vocab_size,
            "special_tokens": sorted(self.special_tokens.items()),
            "roles": sorted(self._roles.items()),
            "wrap": list(self._wrap),
        }
        digest.update(json.dumps(head, sort_keys=True).encode())
        for part in self._content():
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        return digest.hexdigest()

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool = False,
        allowed_special: AllowedSpecial = False,
    ) -> list[list[int]]:
        """Token ids of each text (in parallel where the library can), as :meth:`encode`."""
        batch = self._encode_batch(check_texts(texts), self._allowed(allowed_special))
        if add_special_tokens and (self._prefix or self._suffix):
            batch = [[*self._prefix, *ids, *self._suffix] for ids in batch]
        return batch

    def decode(self, ids: Sequence[int] | Any, *, skip_special_tokens: bool = False) -> str:
        """Text of a sequence of ids (a list, or a 1-D tensor).

        Raises:
            TokenizerInputError: ids that are not integers.
            TokenizerError: an id outside ``0 .. vocab_size - 1``.
        """
        return self._decode(self._check_ids(ids), skip_special_tokens)

    def decode_batch(
        self, batch: Iterable[Sequence[int]] | Any, *, skip_special_tokens: bool = False
    ) -> list[str]:
        """Text of each sequence of ids (a list of lists, or a 2-D tensor)."""
        if hasattr(batch, "tolist"):
            batch = batch.tolist()
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in batch]

    def batch_encode(self, texts: Sequence[str], **options: Any) -> dict[str, torch.Tensor]:
        """Deprecated name of :meth:`encode_padded` (it read too much like
        :meth:`encode_batch`, which returns lists of ids)."""
        warnings.warn(
            "Tokenizer.batch_encode is now encode_padded (encode_batch returns lists of ids)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.encode_padded(texts, **options)

    def encode_padded(
        self,
        texts: Sequence[str],
        *,
        max_length: int | None = None,
        padding: Padding = "longest",
        truncation: bool = False,
        add_special_tokens: bool = False,
        allowed_special: AllowedSpecial = False,
        padding_side: PaddingSide = "right",
        device: str | torch.device | None = None,
    ) -> dict[str, torch.Tensor]:
        """Encode a batch into padded tensors (:meth:`encode_batch` gives lists of ids).

        Args:
            texts: the texts.
            max_length: longest sequence allowed (with ``truncation``) and the padded length
                (with ``padding="max_length"``).
            padding: ``"longest"`` pads to the longest sequence, ``"max_length"`` to
                ``max_length``.
            truncation: cut sequences longer than ``max_length`` (the closing special token,
                if any, is kept). Without it a longer sequence is an error.
            add_special_tokens, allowed_special: as in :meth:`encode`.
            padding_side: ``"right"`` (training) or ``"left"`` (batched generation).
            device: where the tensors are created.

        Returns:
            ``{"input_ids": LongTensor[batch, length], "attention_mask": LongTensor[batch,
            length]}``; the mask is 1 on tokens and 0 on padding. Padding uses ``pad_id``, or
            ``eos_id`` when there is none (GPT), or 0.
        """
        check_padding(max_length, padding, truncation, padding_side)
        batch = self.encode_batch(
            texts, add_special_tokens=add_special_tokens, allowed_special=allowed_special
        )
        if max_length is not None:
            batch = [
                fit(ids, i, max_length, truncation, self._suffix) for i, ids in enumerate(batch)
            ]
        longest = max((len(ids) for ids in batch), default=0)
        length = max_length if padding == "max_length" and max_length is not None else longest
        pad = next((i for i in (self.pad_id, self.eos_id) if i is not None), 0)
        return padded(batch, length, pad, padding_side, device)

    # -- description ----------------------------------------------------------------------------
    def describe(self) -> str:
        """A short human description (library, size, special tokens), as ``zoo info`` shows."""
        specials = ", ".join(
            f"{role} {self._roles[role]}={self._role_ids[role]}" for role in self._roles
        )
        head = f"{self.name}: {self.description}" if self.description else self.name
        return f"{head} [{self.backend}, {self.vocab_size} ids; {specials or 'no special tokens'}]"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} vocab_size={self.vocab_size}>"

    # -- helpers ------------------------------------------------------------------------------
    def _encode_with_specials(
        self, text: str, allowed: frozenset[str], encode_text: Callable[[str], list[int]]
    ) -> list[int]:
        """``text`` split at the special-token strings in ``allowed``: those become their ids,
        the text between them is encoded with ``encode_text`` (specials in it stay text)."""
        pattern = "(" + "|".join(re.escape(t) for t in sorted(allowed, key=len, reverse=True)) + ")"
        specials = self.special_tokens
        ids: list[int] = []
        for i, part in enumerate(re.split(pattern, text)):
            if i % 2:  # a separator: an allowed special token
                ids.append(specials[part])
            elif part:
                ids.extend(encode_text(part))
        return ids

    def _allowed(self, allowed_special: AllowedSpecial) -> frozenset[str]:
        """The special-token strings that become ids, from an ``allowed_special`` argument."""
        return allowed_specials(self.name, self.special_tokens, allowed_special)

    def _check_ids(self, ids: Sequence[int] | Any) -> list[int]:
        """``ids`` as a list of ints of the vocabulary (see :func:`~.inputs.check_ids`)."""
        return check_ids(self.name, self.vocab_size, ids)


def check_fits(tokenizer: Tokenizer, vocab_size: int, *, what: str = "the model") -> None:
    """Raise :class:`TokenizerError` unless every id of ``tokenizer`` is below ``vocab_size``
    (a model vocabulary larger than the tokenizer's, padded for speed, is fine: generation
    never samples the extra ids)."""
    if tokenizer.vocab_size > vocab_size:
        raise TokenizerError(
            f"tokenizer {tokenizer.name!r} has {tokenizer.vocab_size} ids but {what} has a "
            f"vocabulary of {vocab_size}: ids {vocab_size}..{tokenizer.vocab_size - 1} would "
            "fall outside it. Use the model's own tokenizer, or a model whose vocab_size is at "
            f"least {tokenizer.vocab_size}"
        )
