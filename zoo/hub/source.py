"""What to fetch: ``hf:org/name[@revision]`` strings, repo ids and named models, parsed into a
:class:`HubSource`. Nothing here touches the network."""

from __future__ import annotations

import dataclasses

from ..errors import HubError
from ..plugin.current import get_registry
from ..plugin.specs import WeightsSource

__all__ = ["PREFIX", "HubSource", "parse_hf_source", "resolve_source"]

#: The prefix that marks a Hub repo in :func:`zoo.load`: ``"hf:org/name@revision"``.
PREFIX = "hf:"


@dataclasses.dataclass(frozen=True)
class HubSource:
    """A checkpoint on the Hub.

    Args:
        repo_id: ``"org/name"``.
        revision: branch, tag or commit sha (``None``: the default branch).
        filename: the weights file in the repo; a repo that has its index
            (``model.safetensors.index.json``) instead is sharded, and the index may be named.
        layout: ``"auto"`` (read ``config.json``), ``"zoo"`` or a layout such as ``"hf-gpt2"``.
        sha256: the pinned hash of the weights file (from the registry), or ``None``.
        model_name: the named model these weights belong to, or ``None``.
    """

    repo_id: str
    revision: str | None = None
    filename: str = "model.safetensors"
    layout: str = "auto"
    sha256: str | None = None
    model_name: str | None = None

    def __str__(self) -> str:
        return f"{PREFIX}{self.repo_id}" + (f"@{self.revision}" if self.revision else "")

    @property
    def pull_argument(self) -> str:
        """What ``zoo pull`` takes to fetch this source."""
        return self.model_name or str(self)


def _check_repo_id(repo_id: str, given: str) -> str:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise HubError(
            f"{given!r} does not name a Hub repo: {exc} Use 'org/name' "
            "(or 'hf:org/name@revision' in zoo.load)."
        ) from None
    return repo_id


def parse_hf_source(source: str, revision: str | None = None) -> HubSource:
    """Parse ``"hf:org/name"`` or ``"hf:org/name@revision"`` (the ``hf:`` prefix is optional).

    Args:
        source: the string.
        revision: a revision given separately; an error if the string names another one.
    """
    text = source.removeprefix(PREFIX)
    repo_id, at, named = text.partition("@")
    if at and not named:
        raise HubError(f"{source!r}: nothing after '@'; write 'hf:org/name@revision'")
    if named and revision is not None and named != revision:
        raise HubError(f"{source!r} names revision {named!r} but revision={revision!r} was given")
    return HubSource(repo_id=_check_repo_id(repo_id, source), revision=named or revision)


def _from_weights(name: str, weights: WeightsSource | None, revision: str | None) -> HubSource:
    if weights is None or not weights.repo:
        where = f" (its weights are {weights})" if weights is not None else ""
        raise HubError(
            f"named model {name!r} has no weights on the Hub{where}. Add a weights table with "
            f'repo = "org/name" to its registry entry, or give a repo id such as '
            f"'org/name' instead of the model name."
        )
    return HubSource(
        repo_id=_check_repo_id(weights.repo, weights.repo),
        revision=revision or weights.revision,
        filename=weights.filename,
        layout=weights.layout,
        sha256=weights.sha256.lower() if weights.sha256 else None,
        model_name=name,
    )


def resolve_source(name_or_repo: str, revision: str | None = None) -> HubSource:
    """A named model with Hub weights (``"gpt2-124m"``), a repo id (``"org/name"``) or an
    ``hf:`` string, as a :class:`HubSource`.

    A named model keeps its registry entry's pinned sha256 even when ``revision`` overrides
    the registry's revision: the pin says which file the name stands for.
    """
    if not isinstance(name_or_repo, str) or not name_or_repo:
        raise HubError(f"expected a named model or a Hub repo id, got {name_or_repo!r}")
    if name_or_repo.startswith(PREFIX) or "/" in name_or_repo:
        return parse_hf_source(name_or_repo, revision)
    spec = get_registry().model(name_or_repo)  # UnknownModelError lists close matches
    return _from_weights(spec.name, spec.weights, revision)
