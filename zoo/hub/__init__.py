"""The Hugging Face Hub: publish zoo checkpoints and fetch them (or official weights) by name.

    >>> import zoo
    >>> ref = zoo.push(model, "org/name")          # model.safetensors, config.json, README.md
    >>> zoo.push(model, "org/big", max_shard_size="5GB")  # shards + index, as transformers
    >>> model = zoo.load("hf:org/name")            # or "hf:org/name@<branch, tag or sha>"
    >>> model = zoo.load("gpt2-124m")              # official weights: openai-community/gpt2
    >>> zoo.pull("gpt1")                           # into the HF cache, nothing built

Everything goes through ``huggingface_hub`` and the standard Hugging Face cache, so
``HF_ENDPOINT``, ``HF_HOME``/``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and ``HF_TOKEN`` apply as for
any Hub client. A revision is resolved to a commit once and every file is fetched at that
commit; downloads are checked against the Hub's metadata, the sha256 a registry entry pins
and the one ``config.json`` records (for each shard of a sharded repo). No code from a repo
is ever run and no pickle is read.

Modules: :mod:`.source` (``hf:`` strings and named models), :mod:`.download` (pull),
:mod:`.snapshot` (``zoo.load`` on top of pull), :mod:`.upload` (push), :mod:`.card` (the model
card), :mod:`.failures` (Hub errors as zoo errors), :mod:`.tokenizer_files` (a named model's
tokenizer files, for :mod:`zoo.tokenizers`, which never fetches), :mod:`.transfer` (one
file's checked download into the cache), :mod:`.adapter` (a LoRA adapter's pull and its facts:
``zoo.load(BASE, adapter="hf:org/name")``, ``zoo info``, ``zoo push ADAPTER_DIR``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

if TYPE_CHECKING:  # type checkers see the real names
    from .download import Snapshot, fetch, pull
    from .source import PREFIX, HubSource, parse_hf_source, resolve_source
    from .upload import CommitRef, push

__all__ = [
    "PREFIX",
    "CommitRef",
    "HubSource",
    "Snapshot",
    "fetch",
    "parse_hf_source",
    "pull",
    "push",
    "resolve_source",
]

#: Imported on first use, so that importing one module of the package (the tokenizer files'
#: fetcher, say) does not run the uploader and the loader too.
__getattr__ = lazy_attributes(
    __name__,
    {
        "Snapshot": "zoo.hub.download:Snapshot",
        "fetch": "zoo.hub.download:fetch",
        "pull": "zoo.hub.download:pull",
        "PREFIX": "zoo.hub.source:PREFIX",
        "HubSource": "zoo.hub.source:HubSource",
        "parse_hf_source": "zoo.hub.source:parse_hf_source",
        "resolve_source": "zoo.hub.source:resolve_source",
        "CommitRef": "zoo.hub.upload:CommitRef",
        "push": "zoo.hub.upload:push",
    },
)
