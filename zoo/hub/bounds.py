"""How much a Hub download may bring, and for how long: :class:`Limits` (the deadline, the
stall timeout and the byte caps, from the environment) and :class:`Bound` (one file's
bound: the size the Hub declared for it, else its cap).

A file may not exceed the size the Hub declares for it: its file metadata (the ``size`` of
``model_info(files_metadata=True)``'s entry, an LFS file's ``lfs.size``), then the
``X-Linked-Size`` (or ``Content-Length``) of its download, each at most the one before. With
no declaration, the cap bounds it: ``ZOO_HUB_MAX_FILE_BYTES`` (64 MiB) for every file but the
weights, ``ZOO_HUB_MAX_BYTES`` (64 GiB) for a weights file or shard; a declared size over the
cap is refused too, and so is one the disk has no room for; a body of no declared size stops
when less than :data:`DISK_RESERVE` (1 GiB) of the disk stays free.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from ..errors import HubError, UnsafeCheckpointError

__all__ = ["DISK_RESERVE", "Bound", "Limits", "declared_size"]

#: A body of no declared size stops when the disk it is written to has less free than this.
DISK_RESERVE = 1 << 30
#: How often (in bytes received) such a body checks the free disk space.
DISK_CHECK_EVERY = 64 << 20


@dataclasses.dataclass(frozen=True)
class Limits:
    """How long one download may take.

    Args:
        deadline: seconds for the whole file, retries and resumes included.
        stall: seconds the connection may stay silent (connecting or between two reads).
        attempts: tries in all: a cut connection resumes, a 429/503 answer waits and retries.
        max_wait: the longest back-off honoured from a ``Retry-After`` header, in seconds.
        max_file_bytes: the most bytes any file but the weights may have (``config.json``,
            tokenizer files, the model card...).
        max_bytes: the most bytes a weights file (or shard) may have, whatever size the Hub
            declares.
    """

    deadline: float = 3600.0
    stall: float = 60.0
    attempts: int = 4
    max_wait: float = 30.0
    max_file_bytes: int = 64 << 20
    max_bytes: int = 64 << 30

    @classmethod
    def from_env(cls) -> Limits:
        """Defaults, overridden by ``ZOO_HUB_DEADLINE``, ``ZOO_HUB_STALL_TIMEOUT`` (seconds),
        ``ZOO_HUB_MAX_FILE_BYTES`` and ``ZOO_HUB_MAX_BYTES`` (bytes)."""
        from ..settings import Settings

        settings = Settings.from_env()
        return cls(
            deadline=settings.hub_deadline or cls.deadline,
            stall=settings.hub_stall_timeout or cls.stall,
            max_file_bytes=settings.hub_max_file_bytes or cls.max_file_bytes,
            max_bytes=settings.hub_max_bytes or cls.max_bytes,
        )

    def cap(self, large: bool) -> tuple[int, str]:
        """The most bytes a file may have, and what sets it (for messages): ``max_bytes`` for
        the weights (``large``), ``max_file_bytes`` for every other file."""
        if large:
            return self.max_bytes, "limit for one Hub file (ZOO_HUB_MAX_BYTES)"
        return (
            self.max_file_bytes,
            "limit for a checkpoint's files other than the weights (ZOO_HUB_MAX_FILE_BYTES)",
        )


@dataclasses.dataclass(frozen=True)
class Bound:
    """The most bytes a download may bring, and what set it: the Hub's declaration or a cap."""

    size: int
    cap: int
    cap_name: str  # "limit for one Hub file (ZOO_HUB_MAX_BYTES)"...
    declared_by: str | None = None  # "the Hub's file metadata"...; None: the cap

    def tighter(self, size: int | None, declared_by: str, where: str) -> Bound:
        """This bound narrowed to ``size``, a size the Hub declared; a size over the bound is
        refused (before any of the body is read)."""
        if size is None:
            return self
        if size > self.size:
            raise self.exceeded(where, f"{declared_by} declares {size:,} bytes")
        return dataclasses.replace(self, size=size, declared_by=declared_by)

    def exceeded(self, where: str, size: str) -> UnsafeCheckpointError:
        """The error for a file past this bound; ``size``: what is known of it."""
        if self.declared_by is None:
            variable = self.cap_name.rpartition("(")[2].rstrip(")")
            return UnsafeCheckpointError(
                f"{where}: {size}, over the {self.cap:,}-byte {self.cap_name}; it was refused "
                "and nothing was kept in the cache. A file this large is not a real one of "
                f"its kind; if this one is, raise {variable}."
            )
        return UnsafeCheckpointError(
            f"{where}: {size}, more than the {self.size:,} bytes the Hub declared for it "
            f"({self.declared_by}); the download was stopped there and nothing was kept in "
            "the cache. The server is broken or hostile: try again later or another endpoint."
        )

    def check_disk(self, folder: Path, where: str, done: int | None = None) -> None:
        """Refuse a declared size the disk holding ``folder`` has no room for; for a body
        of no declared size (``done`` bytes received so far), stop once less than
        :data:`DISK_RESERVE` is free."""
        free = shutil.disk_usage(folder).free
        if self.declared_by is None:
            if done is not None and free < DISK_RESERVE:
                raise HubError(
                    f"{where}: the server declared no size and {done:,} bytes have arrived; "
                    f"only {free:,} bytes remain free on the disk of {folder} (zoo keeps "
                    f"{DISK_RESERVE:,} free), so the download was stopped and nothing was "
                    "kept. Free some space, or point HF_HUB_CACHE (or HF_HOME) at a larger disk."
                )
            return
        if done is None and self.size > free:
            raise HubError(
                f"{where}: the Hub declared {self.size:,} bytes ({self.declared_by}), but only "
                f"{free:,} bytes are free on the disk of {folder}; nothing was downloaded. "
                "Free some space, or point HF_HUB_CACHE (or HF_HOME) at a larger disk."
            )


def declared_size(entry: Any) -> int | None:
    """The size a file's Hub metadata (a ``RepoSibling``) declares, or ``None`` when it has
    none (or nothing sane: not a whole number >= 0). An LFS file's two sizes must agree; the
    smaller one is taken otherwise."""
    sizes = [getattr(entry, "size", None), getattr(getattr(entry, "lfs", None), "size", None)]
    known = [s for s in sizes if isinstance(s, int) and not isinstance(s, bool) and s >= 0]
    return min(known) if known else None
