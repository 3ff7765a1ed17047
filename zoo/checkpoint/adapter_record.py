"""The base an adapter was trained on, as its folder records it: :class:`BaseRecord` in the
header metadata of ``adapter_model.safetensors`` (key :data:`METADATA_KEY`, JSON), where
peft and every safetensors reader leave it alone. Plain Python: the Hub client reads it
without torch (``zoo info``), :mod:`zoo.adapters` writes and checks it."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from .. import jsonfile
from ..errors import CheckpointError

__all__ = ["METADATA_KEY", "BaseRecord"]

#: The safetensors metadata key that holds the base record.
METADATA_KEY = "zoo.base"

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True)
class BaseRecord:
    """The base model an adapter was trained on: its zoo ``name`` (a named model), its Hub
    ``repo`` and ``revision`` (when it came from the Hub), and the ``sha256`` fingerprint of
    its weights (:func:`base_fingerprint`)."""

    name: str | None
    repo: str | None
    revision: str | None
    sha256: str

    def __post_init__(self) -> None:
        for field in ("name", "repo", "revision"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, str) or not value or len(value) > 512):
                raise ValueError(
                    f"BaseRecord.{field} must be a non-empty string or None, got {value!r}"
                )
        if not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256):
            raise ValueError(
                f"BaseRecord.sha256 must be 64 lowercase hex digits (base_fingerprint(model)), "
                f"got {self.sha256!r}"
            )

    def describe(self) -> str:
        """``name`` or ``repo@revision``, and the first digits of the fingerprint."""
        where = self.name or self.repo or "an unnamed model"
        if self.repo and self.name and self.repo != self.name:
            where = f"{self.name} ({self.repo})"
        if self.revision:
            where += f"@{self.revision}"
        return f"{where}, sha256 {self.sha256[:12]}"

    def to_metadata(self) -> dict[str, str]:
        """The safetensors metadata entry that records this base."""
        return {METADATA_KEY: json.dumps(dataclasses.asdict(self), sort_keys=True)}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str], *, where: str) -> BaseRecord | None:
        """The record in a safetensors header's ``metadata`` (``None`` when it has none, as in
        an adapter peft wrote); a :class:`CheckpointError` naming ``where`` when it is bad."""
        text = metadata.get(METADATA_KEY)
        if text is None:
            return None
        try:
            values: Any = jsonfile.loads(text)
            if not isinstance(values, dict) or set(values) != {
                "name",
                "repo",
                "revision",
                "sha256",
            }:
                raise ValueError("it needs exactly the keys name, repo, revision and sha256")
            return cls(**values)
        except ValueError as exc:
            raise CheckpointError(
                f"{where}: the base record (metadata {METADATA_KEY!r}) is not valid: {exc}",
                path=where,
            ) from None
