"""The staging file a Hub download streams into, and the sweep of those left behind.

A download writes ``blobs/.zoo-<uuid>.incomplete`` (a name no server chose) and renames it to
``blobs/<etag>`` once its bytes are checked. The file is removed when the download fails in any
way the process survives (an exception, ``KeyboardInterrupt``): :class:`Staging` is a context
manager. A process that is killed (``SIGKILL``, out of memory, power loss) runs no cleanup, so
every download first sweeps its ``blobs`` folder: a staging file is removed unless a live
download holds it. A download holds its file with an exclusive ``flock`` for as long as it is
open (the kernel drops the lock when the process dies); where there is no ``flock`` (Windows),
an open file cannot be deleted, which protects it the same way.

A cut connection resumes within a pull (a ``Range`` request appends to the same staging
file); a new pull starts a file over.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: an open file cannot be deleted there
    fcntl = None  # type: ignore[assignment]

__all__ = ["PATTERN", "Staging", "sweep"]

#: The names of zoo's staging files in a ``blobs`` folder.
PATTERN = ".zoo-*.incomplete"


def _try_lock(fd: int) -> bool:
    """Take an exclusive lock on ``fd`` without waiting; whether it was free."""
    if fcntl is None:  # pragma: no cover - Windows
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def sweep(folder: Path) -> list[Path]:
    """Remove the staging files in ``folder`` that no live download holds (left by a process
    that was killed); the paths removed. Files held by a download, in this process or another,
    are left alone."""
    removed = []
    for path in folder.glob(PATTERN):
        if fcntl is None:  # pragma: no cover - Windows: a live download's file cannot go
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
            continue
        try:
            with open(path, "rb") as probe:
                if not _try_lock(probe.fileno()):
                    continue  # a live download's
                path.unlink()  # while locked: no download can take it up in between
        except OSError:  # gone already, or (Windows) open in a live download
            continue
        removed.append(path)
    return removed


class Staging:
    """A new staging file in ``folder`` (``.zoo-<uuid>.incomplete``), locked while open.

    ``with Staging(folder) as staging:`` sweeps ``folder`` (:func:`sweep`), creates the file,
    and gives :attr:`file` (open for writing) and :attr:`path`; :meth:`publish` renames it to
    its final name. On leaving the block the file is closed and, unless published, removed,
    whatever ended the block.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / ".zoo-unset.incomplete"
        self._file: BinaryIO | None = None
        self._published = False

    @property
    def file(self) -> BinaryIO:
        """The staging file, open for writing (and locked) inside the ``with`` block."""
        if self._file is None:
            raise RuntimeError("Staging.file is only open inside its `with` block")
        return self._file

    def __enter__(self) -> Staging:
        sweep(self.folder)
        for _ in range(8):
            path = self.folder / f".zoo-{uuid.uuid4().hex}.incomplete"
            file = open(path, "xb")
            # A sweep in another process may have taken and removed the file between its
            # creation and the lock: then the lock is on a file no longer in the folder.
            if _try_lock(file.fileno()) and _same_file(file, path):
                self.path, self._file = path, file
                return self
            file.close()
        raise OSError(f"could not create a staging file in {self.folder}")

    def publish(self, target: Path) -> None:
        """Rename the staging file to ``target`` (atomically); it is then no longer removed."""
        self.file.flush()
        if fcntl is None:  # pragma: no cover - Windows renames no open file
            self.file.close()
        os.replace(self.path, target)
        self._published = True

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._file is None:
            return
        if fcntl is None:  # pragma: no cover - Windows deletes no open file
            self._file.close()
        if not self._published:  # removed while still locked (POSIX), then closed
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._file.close()
        self._file = None


def _same_file(file: BinaryIO, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(file.fileno()), os.stat(path))
    except FileNotFoundError:
        return False
