"""``zoo.load("hf:org/name@rev")`` and ``zoo.load("gpt2-124m")`` with Hub weights: fetch into
the Hugging Face cache, then hand the snapshot directory to the checkpoint loader.

Loading never runs code from the repo: ``config.json`` is data; the architecture it names (a
zoo checkpoint) or its ``model_type`` (a Hugging Face one) must come from an installed plugin,
and an unknown one is an error naming what to install.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..checkpoint.load import load_local
from ..errors import ChecksumMismatchError, CorruptCheckpointError, HubNotFoundError
from .download import Snapshot, evict, fetch, pin
from .source import HubSource, parse_hf_source, resolve_source

if TYPE_CHECKING:
    from ..nn.base import ZooModel

__all__ = ["load_hf", "load_hf_gguf", "load_hub", "load_named"]


def load_hub(source: HubSource, *, token: str | bool | None = None, **kwargs: Any) -> ZooModel:
    """Fetch ``source`` and load it with :func:`zoo.checkpoint.load_local`.

    ``kwargs`` are :func:`zoo.load`'s (``device``, ``dtype``, ``strict``, ``verify``,
    ``tokenizer``). The weights are hashed by the loader while it builds the model (unless
    ``verify=False``); a file that does not match is deleted from the cache and nothing is
    returned.
    """
    snapshot = fetch(source, token=token, verify=False)
    try:
        return load_local(
            snapshot.directory,
            layout=source.layout,
            sha256=snapshot.sha256,
            model_name=source.model_name,
            filename=snapshot.weights.name,
            shard_sha256=snapshot.shards or None,
            **kwargs,
        )
    except CorruptCheckpointError as exc:  # ChecksumMismatchError included
        if snapshot.shards:
            raise _damaged_shards(source, snapshot, exc) from exc
        evict(snapshot.weights)
        if isinstance(exc, ChecksumMismatchError) and snapshot.sha256 and exc.actual:
            problem = (
                f"has sha256 {exc.actual}, not {snapshot.sha256} as {snapshot.expected_from} says"
            )
        else:
            problem = f"is damaged ({exc})"
        raise exc.reworded(
            f"{source}: the downloaded {snapshot.weights.name} {problem}. It was deleted from "
            "the Hugging Face cache and nothing was loaded. Try again; if it persists, the repo "
            "(or the pin) is wrong."
        ) from exc


def _damaged_shards(
    source: HubSource, snapshot: Snapshot, exc: CorruptCheckpointError
) -> CorruptCheckpointError:
    """The error for a sharded download the loader found damaged, once the files it names
    (shards, or the index) are deleted from the cache so that the next pull fetches them."""
    damaged = set(exc.mismatches) if isinstance(exc, ChecksumMismatchError) else set()
    damaged.update([] if exc.path is None else [exc.path])
    files = [snapshot.weights, *(snapshot.directory / name for name in snapshot.shards)]
    named = [path for path in files if path in damaged]
    for path in named:
        evict(path)
    which = ", ".join(path.name for path in named) or "a file"
    return exc.reworded(
        f"{source}: the downloaded {which} of the sharded checkpoint is damaged or not the one "
        f"expected ({exc}). It was deleted from the Hugging Face cache and nothing was loaded. "
        "Try again; if it persists, the repo (or the pin) is wrong."
    )


def load_hf(source: str, **kwargs: Any) -> ZooModel:
    """:func:`zoo.load` for ``"hf:org/name"`` and ``"hf:org/name@revision"``."""
    return load_hub(parse_hf_source(source), **kwargs)


def load_named(name: str, **kwargs: Any) -> ZooModel:
    """:func:`zoo.load` for a named model whose registry entry points at a Hub repo."""
    return load_hub(resolve_source(name), **kwargs)


#: A GGUF file's name in a repo: a relative path of plain parts, ending ``.gguf``.
_GGUF_NAME = re.compile(r"(?!.*(^|/)\.\.?(/|$))[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*\.gguf")


def load_hf_gguf(
    source: object, gguf: str, *, token: str | bool | None = None, **kwargs: Any
) -> Any:
    """:func:`zoo.load` of ``"hf:org/name[@revision]"`` with ``gguf="file.gguf"``: that one
    file of the repo, the revision pinned to a commit, checked against the sha256 the Hub's
    LFS metadata gives (a mismatch deletes it from the cache and loads nothing)."""
    from ..checkpoint.gguf.load import load_gguf

    if not (isinstance(source, str) and source.startswith("hf:")):
        raise ValueError(
            f"gguf={gguf!r} names a file of a Hub repo: give it with an hf:org/name source "
            "(a GGUF file on this machine is loaded by its path)"
        )
    hub_source = parse_hf_source(source)
    if not _GGUF_NAME.fullmatch(gguf):
        raise ValueError(
            f"gguf={gguf!r}: give the file's path in the repo, e.g. 'model-q8_0.gguf' (plain "
            "names separated by '/', ending .gguf)"
        )
    pinned = pin(hub_source, token=token)
    entries = pinned.entries
    if entries is not None and gguf not in entries:
        present = sorted(name for name in entries if name.endswith(".gguf"))
        raise HubNotFoundError(
            f"{pinned.what} has no {gguf} (its GGUF files: {', '.join(present) or 'none'})"
        )
    lfs = getattr((entries or {}).get(gguf), "lfs", None)
    path = pinned.download(gguf, large=True)
    try:
        return load_gguf(path, sha256=getattr(lfs, "sha256", None), **kwargs)
    except ChecksumMismatchError as exc:
        evict(path)
        raise exc.reworded(
            f"{pinned.what}: the downloaded {gguf} does not have the sha256 the Hub's LFS "
            f"metadata gives ({exc}). It was deleted from the Hugging Face cache and nothing "
            "was loaded. Try again; if it persists, the repo is wrong."
        ) from exc
