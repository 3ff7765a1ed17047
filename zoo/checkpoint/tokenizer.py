"""The tokenizer that comes with a checkpoint: attached when it loads (the one it saved, the
registered one of its named model, or its own Hugging Face ``tokenizer.json``; never a
guess), and written as Hugging Face files when it is exported."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, UnknownModelError, ZooError
from ..plugin.current import get_registry
from ..plugin.specs import ArchitectureSpec

if TYPE_CHECKING:
    from torch import nn

    from ..tokenizers.base import Tokenizer

__all__ = ["checkpoint_tokenizer", "export_tokenizer_files"]

log = logging.getLogger("zoo.checkpoint")


#: The failures that leave a model without its tokenizer (or, for files the checkpoint holds,
#: refuse the checkpoint): zoo's own errors (a tokenizer that cannot be made here, files that
#: do not fit, a plugin not installed, the Hub out of reach) and unreadable files.
_EXPECTED = (ZooError, OSError)


def _registered(name: str) -> Tokenizer:
    """The registered tokenizer ``name``, as a checkpoint that stores it by name needs it."""
    return get_registry().tokenizer(name).load()


def _registry_tokenizer(
    arch: ArchitectureSpec, config: Any, model_name: str | None, directory: Path
) -> str | None:
    """The registered tokenizer these weights come with, never a guess.

    With ``model_name``: the tokenizer that named model declares, when the vocabulary sizes
    agree (a shrunken test model keeps its name but not the tokenizer). Without one (an
    imported checkpoint): a tokenizer of the architecture's named models that reads its own
    files from the checkpoint (``TokenizerSpec.checkpoint_files``), when all the files of one
    of its sets are in ``directory``; a matching vocabulary size alone attaches nothing.
    """
    registry = get_registry()
    candidates = [model_name] if model_name is not None else registry.models()
    for name in candidates:
        try:
            spec = registry.model(name)
        except UnknownModelError:
            return None
        if spec.architecture != arch.name or spec.tokenizer is None:
            continue
        if model_name is None:
            try:
                sets = registry.tokenizer(spec.tokenizer).checkpoint_file_sets
            except ZooError:
                continue
            if not any(all((directory / f).is_file() for f in files) for files in sets):
                continue
        named_vocab = getattr(registry.resolve(name)[2], "vocab_size", None)  # defaults too
        if named_vocab == getattr(config, "vocab_size", None):
            return spec.tokenizer
    return None


def _own_tokenizer(
    directory: Path, arch: ArchitectureSpec, config: Any, model_name: str | None, *, shown: Path
) -> Any:
    """The tokenizer of a checkpoint that names none, or ``None``: never a guess.

    A Hugging Face ``tokenizer.json`` (beside the weights, or in the folder given: zoo keeps
    a saved model's own files in a version folder inside it) is the tokenizer transformers
    uses, and zoo uses it as written, through the ``tokenizers`` library, whichever family it
    sits beside (:func:`~zoo.tokenizers.pretrained.from_pretrained`, with the roles, chat
    template and end ids of the ``tokenizer_config.json`` and ``generation_config.json``
    beside it). The registered tokenizer of the model named, or of a named model of the
    architecture whose files the folder holds (:func:`_registry_tokenizer`), takes its place
    only when its factory accepts the folder's files: ``gpt2-bpe`` checks them to be GPT-2's
    own (the same ids, through tiktoken), Llama's reads that very ``tokenizer.json``. When
    the factory refuses them, the file is used as written; only a file the library cannot
    read is refused (both reasons are given). A folder without ``tokenizer.json`` whose
    files are a SentencePiece pair (``source.spm``, ``target.spm``, ``vocab.json``:
    ``transformers``' ``MarianTokenizer``) gets that pair, read as written.

    Raises:
        TokenizerError: the registered tokenizer cannot be made and the folder holds no
            ``tokenizer.json`` the library reads.
    """
    from ..tokenizers import TokenizerError, VocabularyFileError
    from ..tokenizers.hf_backend import TOKENIZER_FILE
    from ..tokenizers.pretrained import from_pretrained

    name = _registry_tokenizer(arch, config, model_name, directory)
    folder = next((d for d in (directory, shown) if (d / TOKENIZER_FILE).is_file()), None)
    if name is None:
        if folder is None:
            return _sentencepiece_pair(directory, shown, model_name)
        return from_pretrained(folder, name=model_name or shown.name)
    factory = get_registry().tokenizer(name)
    try:
        return factory.load(directory=directory) if factory.reads_checkpoint else factory.load()
    except TokenizerError as refused:
        if folder is None:
            raise
        try:
            own = from_pretrained(folder, name=model_name or shown.name)
        except TokenizerError as exc:
            raise VocabularyFileError(
                f"{str(refused).rstrip('.')}; nor can zoo use it as written: {exc}"
            ) from None
        log.info("%s: %s; its %s is used as written", shown, refused, TOKENIZER_FILE)
        return own


def _sentencepiece_pair(directory: Path, shown: Path, model_name: str | None) -> Any:
    """The SentencePiece pair beside the weights or in the folder given (see
    :mod:`zoo.tokenizers.sentencepiece_files`), or ``None`` when neither holds one."""
    from ..tokenizers.sentencepiece_files import is_sentencepiece_pair
    from ..tokenizers.sentencepiece_pair import read_pair

    for where in (directory, shown):
        if is_sentencepiece_pair(where):
            return read_pair(where, name=model_name or shown.name)
    return None


def checkpoint_tokenizer(
    spec: Mapping[str, Any] | None,
    directory: Path,
    arch: ArchitectureSpec,
    config: Any,
    model_name: str | None,
    *,
    shown: Path,
) -> tuple[Any, str | None]:
    """The tokenizer for a loaded model, or ``None`` and the reason there is none.

    A tokenizer whose files the checkpoint holds must load (an error otherwise: the
    checkpoint is incomplete). A tokenizer named in the checkpoint or inferred from the
    registry is best effort: if it cannot be created here (e.g. its vocabulary is on the Hub
    and this machine is offline) the model still loads, with a warning and the reason in
    ``model.tokenizer_error``. A checkpoint that names no tokenizer gets its own
    (:func:`_own_tokenizer`): a registered tokenizer that accepts its files (read from the
    checkpoint directory, never downloaded), else its Hugging Face ``tokenizer.json`` as
    written. Every tokenizer must fit the model's vocabulary.
    """
    from ..tokenizers import check_fits, load_tokenizer

    vocab_size = getattr(config, "vocab_size", None)
    if spec is not None and spec.get("files"):
        try:
            tokenizer = load_tokenizer(dict(spec), directory)
            if vocab_size is not None:
                check_fits(tokenizer, vocab_size, what=f"the model in {shown}")
        except _EXPECTED as exc:
            raise CheckpointError(
                f"{shown}: the checkpoint's tokenizer {dict(spec)} cannot be loaded: {exc}"
            ) from exc
        return tokenizer, None
    try:
        if spec is not None:
            tokenizer = load_tokenizer(dict(spec), directory, by_name=_registered)
        else:
            tokenizer = _own_tokenizer(directory, arch, config, model_name, shown=shown)
            if tokenizer is None and any(
                (d / "spiece.model").is_file() for d in (directory, shown)
            ):
                return None, (
                    f"{shown} holds a SentencePiece model (spiece.model) without the "
                    "tokenizer.json transformers reads it through; write that file with "
                    "transformers (AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)), "
                    "or pass token ids"
                )
            if tokenizer is None:
                return None, (
                    f"{shown} holds no tokenizer zoo can read and names no model whose "
                    f"tokenizer fits its {vocab_size}-id vocabulary (zoo never guesses one); "
                    "give one with tokenizer=zoo.tokenizer(NAME) or `zoo generate "
                    "--tokenizer NAME`, save it with the weights (zoo.save(model, DIR, "
                    "tokenizer=...)), or pass token ids"
                )
        if vocab_size is not None:
            check_fits(tokenizer, vocab_size)
    except _EXPECTED as exc:  # anything else is a bug, and raises
        log.warning("model loaded without its tokenizer: %s", exc)
        return None, str(exc)
    return tokenizer, None


def export_tokenizer_files(
    model: nn.Module, config: Any, directory: str | os.PathLike[str]
) -> dict[str, bytes]:
    """The Hugging Face tokenizer files of ``model.tokenizer`` (none when it has none); a
    tokenizer that cannot be written is a warning saying so, and the weights are still
    exported."""
    from .hf_tokenizer import TokenizerExportError, hf_tokenizer_files

    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return {}
    try:
        return hf_tokenizer_files(
            tokenizer, model_max_length=getattr(config, "context_length", None)
        )
    except TokenizerExportError as exc:
        warnings.warn(
            f"{directory}: no tokenizer files written, so transformers' AutoTokenizer will "
            f"not load one from it: {exc}. Give the tokenizer separately.",
            UserWarning,
            stacklevel=3,
        )
        return {}
