"""A Hugging Face tokenizer folder as a zoo tokenizer, with its chat template and end ids.

The folder is what ``transformers``' ``save_pretrained`` writes and every Hub model repo
holds: ``tokenizer.json`` (the ``tokenizers`` pipeline) and, beside it, optionally

- ``tokenizer_config.json``: the special tokens by role (``bos_token``, ``eos_token``,
  ``pad_token``, ``unk_token``...), ``add_bos_token`` / ``add_eos_token``, the
  ``added_tokens_decoder`` and the ``chat_template`` (a string, or a list of named ones);
- ``special_tokens_map.json``: the roles, where ``tokenizer_config.json`` leaves one out;
- ``chat_template.jinja`` and ``additional_chat_templates/*.jinja``: the templates as
  transformers 4.43+ writes them (they win over ``tokenizer_config.json``'s);
- ``generation_config.json``: ``eos_token_id``, one id or a list: every one ends generation.

Only JSON and text are read; nothing is imported or unpickled.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import jsonfile
from .base import ROLES, Tokenizer
from .errors import VocabularyFileError
from .vocab_files import read_json_object, special_token

if TYPE_CHECKING:
    from .chat import ChatTemplate

__all__ = ["TOKENIZER_CONFIG", "from_pretrained", "is_pretrained", "load_folder"]

#: The files read, besides ``tokenizer.json``.
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"

#: The special-token variables a chat template sees (transformers' SPECIAL_TOKENS_ATTRIBUTES).
_TEMPLATE_TOKENS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")

#: Files and JSON documents larger than this are refused (a tokenizer config is kilobytes).


def is_pretrained(directory: str | Path) -> bool:
    """Whether ``directory`` holds a Hugging Face tokenizer: ``tokenizer.json`` and
    ``tokenizer_config.json``."""
    directory = Path(directory)
    return (directory / "tokenizer.json").is_file() and (directory / TOKENIZER_CONFIG).is_file()


def _added_tokens(library: Any, config: Mapping[str, Any], where: Path) -> None:
    """Make the library tokenizer hold ``added_tokens_decoder``'s tokens at their ids, with
    their flags (special or not), as ``transformers`` does when it loads the folder."""
    from tokenizers import AddedToken

    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, Mapping):
        raise VocabularyFileError(f"{where}: added_tokens_decoder must be an object")
    entries = []
    for key, entry in decoder.items():
        content = special_token(entry, f"{where}: added_tokens_decoder[{key}]")
        if not (isinstance(key, str) and key.isdigit()) or content is None:
            raise VocabularyFileError(f"{where}: bad added_tokens_decoder entry {key!r}")
        entries.append((int(key), content, entry if isinstance(entry, Mapping) else {}))
    for token_id, content, flags in sorted(entries):
        found = library.token_to_id(content)
        if found is not None and found != token_id:
            raise VocabularyFileError(
                f"{where}: added_tokens_decoder gives {content!r} id {token_id}, but "
                f"tokenizer.json has it at {found}: the two files are not of one tokenizer"
            )
        token = AddedToken(
            content,
            single_word=bool(flags.get("single_word", False)),
            lstrip=bool(flags.get("lstrip", False)),
            rstrip=bool(flags.get("rstrip", False)),
            normalized=bool(flags.get("normalized", not flags.get("special", False))),
            special=bool(flags.get("special", False)),
        )
        if token.special:
            library.add_special_tokens([token])
        else:
            library.add_tokens([token])
        if library.token_to_id(content) != token_id:
            raise VocabularyFileError(
                f"{where}: added_tokens_decoder gives {content!r} id {token_id}, which "
                f"tokenizer.json's {library.get_vocab_size(True)} ids cannot give it"
            )


def _roles(
    config: Mapping[str, Any], special_map: Mapping[str, Any], where: Path
) -> dict[str, str]:
    """Role (``bos``, ``mask``...) -> token string, from the config, else the special-token
    map."""
    roles: dict[str, str] = {}
    for role in _TEMPLATE_TOKENS:
        key = f"{role}_token"
        value = config[key] if key in config else special_map.get(key)
        token = special_token(value, f"{where}: {key}")
        if token is not None:
            roles[role] = token
    return roles


def _wrap(
    config: Mapping[str, Any], library: Any, roles: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """The roles added around a sequence with ``add_special_tokens=True``: the config's
    ``add_bos_token`` / ``add_eos_token`` where present, else what ``tokenizer.json``'s
    post-processor adds (a template such as ``<s> $A``, or BERT's ``[CLS] $A [SEP]``)."""
    flags = config.get("add_bos_token"), config.get("add_eos_token")
    if any(isinstance(f, bool) for f in flags):
        bos = "bos" if flags[0] is True and "bos" in roles else None
        return (bos, "eos" if flags[1] is True and "eos" in roles else None)

    def role(token: str | None, prefer: tuple[str, ...]) -> str | None:
        found = [r for r in (*prefer, *ROLES) if token is not None and roles.get(r) == token]
        return found[0] if found else None

    state = library.post_processor
    processor = jsonfile.loads(state.__getstate__()) if state is not None else {}
    parts = processor.get("processors") if processor.get("type") == "Sequence" else [processor]
    for part in parts or []:
        kind = part.get("type")
        if kind in ("BertProcessing", "RobertaProcessing"):
            return (role(part["cls"][0], ("cls", "bos")), role(part["sep"][0], ("sep", "eos")))
        if kind == "TemplateProcessing" and part.get("single"):
            single = [item.get("SpecialToken", {}).get("id") for item in part["single"]]
            return (role(single[0], ("bos", "cls")), role(single[-1], ("eos", "sep")))
    return (None, None)


def _chat_templates(directory: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """Template name -> Jinja source: ``chat_template.jinja`` ("default") and
    ``additional_chat_templates/NAME.jinja`` when present, else the config's."""
    templates: dict[str, str] = {}
    try:
        if (directory / CHAT_TEMPLATE_FILE).is_file():
            templates["default"] = (directory / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
        extra = directory / CHAT_TEMPLATE_DIR
        for path in sorted(extra.glob("*.jinja")) if extra.is_dir() else []:
            templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise VocabularyFileError(f"cannot read the chat template in {directory}: {exc}") from None
    if templates:
        return templates
    source = config.get("chat_template")
    if isinstance(source, str):
        return {"default": source}
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
        if all(isinstance(k, str) and isinstance(v, str) for k, v in named.items()):
            return named  # type: ignore[return-value]
    if source is not None:
        raise VocabularyFileError(
            f"{directory / TOKENIZER_CONFIG}: chat_template must be a string or a list of "
            "{'name', 'template'} objects"
        )
    return {}


def _end_ids(generation: Mapping[str, Any], where: Path) -> list[int]:
    """``generation_config.json``'s ``eos_token_id``: one id or a list of them."""
    value = generation.get("eos_token_id")
    ids = value if isinstance(value, list) else [] if value is None else [value]
    if not all(type(i) is int for i in ids):
        raise VocabularyFileError(f"{where}: eos_token_id must be an id or a list of ids")
    return ids


def from_pretrained(
    directory: str | Path, *, name: str | None = None, description: str | None = None
) -> Tokenizer:
    """The tokenizer of a Hugging Face tokenizer folder (see the module's description).

    Args:
        directory: the folder (a Hub snapshot, a ``save_pretrained`` output, a checkpoint).
        name: the tokenizer's name (default: the folder's name).
        description: one line for ``zoo info`` (default: where it was read from).

    Raises:
        VocabularyFileError: no ``tokenizer.json``, a file that cannot be read, or files
            that disagree (an added token at two ids, a role token the vocabulary lacks).
    """
    import tokenizers

    from .hf_backend import HFTokenizer

    directory = Path(directory)
    library = _read_library(directory)
    config = read_json_object(directory / TOKENIZER_CONFIG)
    _added_tokens(library, config, directory / TOKENIZER_CONFIG)
    roles = _roles(config, read_json_object(directory / SPECIAL_TOKENS_MAP), directory)
    missing = [t for t in roles.values() if library.token_to_id(t) is None]
    if missing:  # transformers adds a special token the vocabulary lacks; so does zoo
        library.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in missing])
    chat = _chat_template(directory, config, roles)
    tokenizer = HFTokenizer(
        library,
        name=name or directory.resolve().name,
        roles={role: token for role, token in roles.items() if role in ROLES},
        wrap=_wrap(config, library, roles),
        description=description or f"Hugging Face tokenizer from {directory}",
        chat=chat,
        end_ids=_end_ids(read_json_object(directory / GENERATION_CONFIG), directory),
    )
    tokenizer.source_special_tokens = True  # transformers' tokenizer(source) adds them
    return tokenizer


def _read_library(directory: Path) -> Any:
    """The ``tokenizers`` library's tokenizer of ``directory/tokenizer.json``.

    Raises:
        VocabularyFileError: the file is missing or the library cannot read it.
    """
    import tokenizers

    from .hf_backend import TOKENIZER_FILE, call_library

    if not (directory / TOKENIZER_FILE).is_file():
        present = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
        raise VocabularyFileError(
            f"{directory} holds no Hugging Face tokenizer: {TOKENIZER_FILE} is missing (it "
            f"has: {', '.join(present) or 'nothing'}). Save one there with transformers' "
            "tokenizer.save_pretrained(DIR), or copy the model repo's tokenizer files"
        )
    try:
        return call_library(tokenizers.Tokenizer.from_file, str(directory / TOKENIZER_FILE))
    except Exception as exc:  # the library raises plain Exception on a bad file
        raise VocabularyFileError(
            f"{directory / TOKENIZER_FILE} is not a valid tokenizers file: {exc}"
        ) from None


def _chat_template(
    directory: Path, config: Mapping[str, Any], roles: Mapping[str, str]
) -> ChatTemplate | None:
    """The folder's chat template(s), seeing the special tokens of ``roles``; ``None`` when
    it has none."""
    templates = _chat_templates(directory, config)
    if not templates:
        return None
    from .chat import ChatTemplate

    return ChatTemplate(templates, {f"{role}_token": token for role, token in roles.items()})


def load_folder(directory: str | Path) -> Tokenizer:
    """The tokenizer saved in ``directory``: a zoo tokenizer (``zoo_tokenizer.json``, see
    :func:`~zoo.tokenizers.load_directory`) or a Hugging Face one (``tokenizer.json``, see
    :func:`from_pretrained`; else a SentencePiece pair, ``source.spm``, ``target.spm`` and
    ``vocab.json``, see :func:`~zoo.tokenizers.sentencepiece_pair.read_pair`).

    Raises:
        VocabularyFileError: the folder holds none of them.
    """
    from .sentencepiece_files import SOURCE_SPM, TARGET_SPM
    from .sentencepiece_pair import pair_tokenizer
    from .serialization import load_directory
    from .vocab_files import MANIFEST

    directory = Path(directory)
    if (directory / MANIFEST).is_file():
        return load_directory(directory)
    pair = any((directory / name).is_file() for name in (SOURCE_SPM, TARGET_SPM))
    if pair and not (directory / "tokenizer.json").is_file():
        return pair_tokenizer(directory)  # (a file of the pair missing: named)
    return from_pretrained(directory)
