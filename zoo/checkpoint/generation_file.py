"""A checkpoint's ``generation_config.json``, as transformers writes it next to the weights:
the generation settings the model was published with (a translation model's beam count, the
token its target starts with, the ids it must never produce...).

:func:`read_generation_file` reads the keys zoo honours into a frozen, validated
:class:`GenerationFile` (every other key, such as ``transformers_version`` or the sampling
keys, is left alone); :func:`zoo.load` attaches it as ``model.generation_config`` (which
:func:`zoo.save` and :func:`zoo.export` write back: :meth:`GenerationFile.to_json`), and
:func:`zoo.generate` and ``zoo generate`` take from it the defaults of what the caller does not
set (:mod:`zoo.generation.checkpoint_defaults`). Plain Python: no torch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from .. import jsonfile
from ..errors import CheckpointError, ConfigError
from ..fields import check_fields

__all__ = ["GENERATION_FILE", "GenerationFile", "read_generation_file"]

#: The file's name in a checkpoint folder.
GENERATION_FILE = "generation_config.json"

#: Fields that must be at least 1 when given, and those that must be at least 0.
_POSITIVE = ("num_beams", "num_return_sequences", "max_new_tokens", "max_length")
_NON_NEGATIVE = (
    "no_repeat_ngram_size",
    "min_new_tokens",
    "min_length",
    "forced_bos_token_id",
    "decoder_start_token_id",
)


@dataclasses.dataclass(frozen=True)
class GenerationFile:
    """The keys of ``generation_config.json`` zoo honours, under transformers' names; ``None``
    where the file does not set one (zoo's own default then applies)."""

    #: beams of a beam search (1: no beam search).
    num_beams: int | None = None
    #: the best hypotheses returned per prompt.
    num_return_sequences: int | None = None
    #: a finished hypothesis scores its summed log-probability / its length ** this.
    length_penalty: float | None = None
    #: when a beam search stops: ``True``, ``False`` (transformers' heuristic) or ``"never"``.
    early_stopping: bool | Literal["never"] | None = None
    #: no n-gram of this size occurs twice.
    no_repeat_ngram_size: int | None = None
    #: the end-of-text id is not picked before this many new tokens.
    min_new_tokens: int | None = None
    #: the end-of-text id is not picked while the sequence (prefix included) is shorter.
    min_length: int | None = None
    #: tokens generated at most.
    max_new_tokens: int | None = None
    #: the longest sequence, prefix included (an encoder-decoder's target: its start token
    #: and the new tokens).
    max_length: int | None = None
    #: sequences of ids never generated (Marian's pad id).
    bad_words_ids: tuple[tuple[int, ...], ...] | None = None
    #: the id forced as the first token of a target.
    forced_bos_token_id: int | None = None
    #: the id (or ids) forced as the last token when the length runs out.
    forced_eos_token_id: int | tuple[int, ...] | None = None
    #: the first token of an encoder-decoder's target.
    decoder_start_token_id: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.bad_words_ids, list):
            object.__setattr__(self, "bad_words_ids", tuple(map(_ids, self.bad_words_ids)))
        if isinstance(self.forced_eos_token_id, list):
            object.__setattr__(self, "forced_eos_token_id", tuple(self.forced_eos_token_id))
        check_fields(self)
        for name in _POSITIVE:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}")
        for name in _NON_NEGATIVE:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be at least 0, got {value}")
        self._check_ids()

    def to_json(self) -> dict[str, object]:
        """The keys this file sets, as ``generation_config.json`` holds them (lists for
        tuples), for a checkpoint zoo writes."""
        return {
            f.name: _lists(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }

    def _check_ids(self) -> None:
        eos = self.forced_eos_token_id
        if isinstance(eos, tuple) and (not eos or min(eos) < 0):
            raise ConfigError(f"forced_eos_token_id must hold ids >= 0, got {list(eos)}")
        if isinstance(eos, int) and eos < 0:
            raise ConfigError(f"forced_eos_token_id must be an id >= 0, got {eos}")
        for words in self.bad_words_ids or ():
            if not words or min(words) < 0:
                raise ConfigError(
                    f"bad_words_ids must be non-empty lists of ids >= 0, got {list(words)}"
                )


def _lists(value: object) -> object:
    """Tuples (of tuples) as JSON lists."""
    return [_lists(v) for v in value] if isinstance(value, tuple) else value


def _ids(value: object) -> object:
    """A JSON list of ids as a tuple (anything else as it is, for the type check to name)."""
    return tuple(value) if isinstance(value, list) else value


def read_generation_file(folder: Path) -> GenerationFile | None:
    """The :class:`GenerationFile` of the checkpoint in ``folder``, or ``None`` when it has no
    ``generation_config.json``.

    Raises:
        CheckpointError: the file is not a JSON object, or a key zoo honours holds a value
            it cannot use (the message names the file and the key).
    """
    path = folder / GENERATION_FILE
    if not path.is_file():
        return None
    try:
        data = jsonfile.read(path, max_bytes=1 << 20)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} cannot be read as JSON: {exc}", path=path) from exc
    if not isinstance(data, dict):
        raise CheckpointError(
            f"{path} must hold a JSON object, got {type(data).__name__}", path=path
        )
    known = {f.name for f in dataclasses.fields(GenerationFile)}
    try:
        return GenerationFile(**{key: value for key, value in data.items() if key in known})
    except ConfigError as exc:
        raise CheckpointError(
            f"{path}: {exc}. Correct the value, or remove the key to use zoo's default",
            path=path,
        ) from None
