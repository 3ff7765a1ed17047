"""Reading a Hugging Face ``config.json`` without guessing.

A layout's ``config_from_foreign`` turns a transformers config into zoo config values. Every
key of that file either changes the arithmetic (and is then honoured or refused) or does not
(dropouts, token ids, bookkeeping). :class:`HFConfigReader` makes that explicit: a layout
reads each key it honours, states the value each key it cannot honour must have, and
:meth:`HFConfigReader.finish` refuses every key nobody read that is not known to leave the
math alone, so a key a newer transformers adds is an error naming it, never silently dropped.

Both transformers generations are read: 4.x writes ``rope_theta`` and ``rope_scaling`` at the
top level, 5.x writes ``rope_parameters: {"rope_theta": ..., "rope_type": ...}``.

Example (a layout's ``config_from_foreign``)::

    def config_from_hf(hf):
        r = HFConfigReader(hf, family="Llama")
        r.expect("hidden_act", "silu")
        d_model = r.integer("hidden_size")
        values = {"d_model": d_model, "rope_theta": r.rope_theta()}
        return r.finish(values)

The pieces: :mod:`.hf_keys` (what each key may hold), :mod:`.hf_reader` (the reader),
:mod:`.hf_format` (a family's format, declared as a table). Plugins import them from here.
"""

from __future__ import annotations

from .hf_format import LLAMA_FIELDS, HFConfigFormat, HFField, full_attention_only
from .hf_keys import (
    BOOL,
    FLAG_OR_STRING,
    INERT_KEYS,
    INT,
    KEY_TYPES,
    LIST,
    NUMBER,
    OBJECT,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    STRING,
    STRINGS,
    TOKEN_IDS,
    KeyType,
)
from .hf_reader import HFConfigError, HFConfigReader

__all__ = [
    "BOOL",
    "FLAG_OR_STRING",
    "INERT_KEYS",
    "INT",
    "KEY_TYPES",
    "LIST",
    "LLAMA_FIELDS",
    "NUMBER",
    "OBJECT",
    "POSITIVE_INT",
    "POSITIVE_NUMBER",
    "STRING",
    "STRINGS",
    "TOKEN_IDS",
    "HFConfigError",
    "HFConfigFormat",
    "HFConfigReader",
    "HFField",
    "KeyType",
    "full_attention_only",
]
