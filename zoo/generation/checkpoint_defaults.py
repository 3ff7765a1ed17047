"""A checkpoint's ``generation_config.json`` as the defaults of a generation, as transformers
reads it: what the caller leaves unset comes from the file, what the file does not set from
zoo's defaults.

:func:`zoo.load` attaches the file's values to the model as ``model.generation_config`` (a
:class:`zoo.checkpoint.generation_file.GenerationFile`, read here by attribute name: this
package stands below the checkpoint code). The keys honoured, with the
:class:`~zoo.generation.GenerationConfig` field each sets: ``num_beams``,
``num_return_sequences``, ``length_penalty``, ``early_stopping``, ``no_repeat_ngram_size``,
``min_new_tokens``, ``min_length``, ``max_new_tokens``, ``bad_words_ids``,
``forced_bos_token_id`` (``forced_bos_id``), ``forced_eos_token_id`` (``forced_eos_id``) and
``decoder_start_token_id`` (``start_id``; where the file has none, the model config's
``decoder_start_id``, read from ``config.json``). An encoder-decoder's ``max_length`` (its target:
the start token and the new tokens) sets ``max_new_tokens`` to one less when the file has no
``max_new_tokens``; a decoder's is not read (it counts the prompt too, and a decoder-only
checkpoint's ``max_length`` is usually its context: zoo's 50 new tokens stay the default).
Sampling keys (``do_sample``, ``temperature``, ...) and the end ids are not read: the
tokenizer gives the end ids. Plain Python: no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import GenerationConfig

__all__ = ["FILE_KEYS", "checkpoint_defaults", "with_checkpoint_defaults"]

#: Each :class:`~zoo.generation.GenerationConfig` field the file may set -> its key there.
FILE_KEYS = {
    "num_beams": "num_beams",
    "num_return_sequences": "num_return_sequences",
    "length_penalty": "length_penalty",
    "early_stopping": "early_stopping",
    "no_repeat_ngram_size": "no_repeat_ngram_size",
    "min_new_tokens": "min_new_tokens",
    "min_length": "min_length",
    "max_new_tokens": "max_new_tokens",
    "bad_words_ids": "bad_words_ids",
    "forced_bos_id": "forced_bos_token_id",
    "forced_eos_id": "forced_eos_token_id",
    "start_id": "decoder_start_token_id",
}


def checkpoint_defaults(model: Any, given: Collection[str] = ()) -> dict[str, Any]:
    """The :class:`~zoo.generation.GenerationConfig` values ``model``'s
    ``generation_config.json`` sets for the fields not in ``given`` (those the caller set);
    empty for a model loaded without one (or built)."""
    values = _config_defaults(model, given)
    found = getattr(model, "generation_config", None)
    if found is None:
        return values
    values |= {
        field: getattr(found, key, None)
        for field, key in FILE_KEYS.items()
        if field not in given and getattr(found, key, None) is not None
    }
    max_length = getattr(found, "max_length", None)
    if (
        "max_new_tokens" not in given
        and "max_new_tokens" not in values
        and max_length is not None
        and max_length > 1
        and getattr(model, "is_encoder_decoder", False)
    ):
        values["max_new_tokens"] = max_length - 1  # the target's start token counts
    return values


def _config_defaults(model: Any, given: Collection[str]) -> dict[str, Any]:
    """What the model's config says where its ``generation_config.json`` may say more: an
    encoder-decoder's ``decoder_start_id`` (from ``config.json``'s
    ``decoder_start_token_id``) as ``start_id``."""
    start = getattr(getattr(model, "config", None), "decoder_start_id", None)
    if "start_id" in given or start is None or not getattr(model, "is_encoder_decoder", False):
        return {}
    return {"start_id": start}


def with_checkpoint_defaults(
    config: GenerationConfig, model: Any, given: Collection[str]
) -> GenerationConfig:
    """``config`` with each field not in ``given`` taken from ``model``'s
    ``generation_config.json`` where that sets it (:func:`checkpoint_defaults`)."""
    values = checkpoint_defaults(model, given)
    return dataclasses.replace(config, **values) if values else config
