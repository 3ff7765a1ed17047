"""All-or-nothing writes of a checkpoint folder, under ``kill -9``, Ctrl-C and concurrent
writers.

A checkpoint is several files (weights, ``config.json``, tokenizer files) and no file system
renames several files at once. So a save writes a complete new *version* folder inside the
checkpoint folder and switches to it with one atomic rename of a link::

    ckpt/
      config.json        -> .zoo-current/config.json        (stable links, made once)
      model.safetensors  -> .zoo-current/model.safetensors
      .zoo-current       -> .zoo-v<id>                      (the one link a save replaces)
      .zoo-v<id>/        the files of the current version
      .zoo-lock          held by the writer (filelock)

Whatever instant a process dies at, every name resolves to files of one version, the old or
the new: never a mix. A load reads every file from one version folder, which it *pins* (a
shared ``flock`` on the folder) so that no save removes it mid-read; a save removes only
versions no load has pinned (the others go at a later save or load). Readers (zoo,
transformers, any tool) see ordinary file names. Other files in the folder are left alone. A
folder written by an older zoo (plain files) is adopted first, by hard links, without a
moment where a name is missing or mixed. Versions left behind by a killed writer are removed
by the next save, or by the next load that can take the lock.
Where links are not allowed (some Windows set-ups), files are moved into place one by one,
``config.json`` last (its sha256 check then catches a mix).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..errors import CheckpointError

try:
    import fcntl
except ImportError:  # Windows: no pins; a replaced version is removed at once
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CURRENT",
    "atomic_directory",
    "clean_stale",
    "current_version",
    "pinned_version",
    "process_umask",
]

#: The link naming the current version folder.
CURRENT = ".zoo-current"
_VERSION = ".zoo-v"
_LOCK = ".zoo-lock"
_LEGACY_STAGING = ".zoo-save-"  # staging folders of zoo versions before this one
_LINK_STAGING = ".zoo-link-"  # a link being made, before its atomic rename


def _lock(target: Path, *, blocking: bool = True) -> contextlib.AbstractContextManager[object]:
    from filelock import FileLock

    return FileLock(str(target / _LOCK), blocking=blocking)


def _current(target: Path) -> Path | None:
    link = target / CURRENT
    return (target / os.readlink(link)) if link.is_symlink() else None


def current_version(target: Path) -> Path:
    """The folder holding the files of ``target``'s current version, resolved once: a reader
    that takes every file from it sees one version whatever a concurrent save switches to
    meanwhile. ``target`` itself when it is not versioned (an older zoo's, a foreign one)."""
    current = _current(target)
    return current if current is not None and current.is_dir() else target


#: Tries to pin the current version when each one tried was replaced and removed meanwhile.
_PIN_TRIES = 100


@contextlib.contextmanager
def pinned_version(target: Path) -> Iterator[Path]:
    """The folder of ``target``'s current version, which no save removes while the block runs.

    Read every file of one load from it: a concurrent save may switch ``target`` to a newer
    version meanwhile, but never removes a pinned one, so config.json and weights always come
    from the same save. ``target`` itself when it is not versioned, or when a name of the
    version no longer links to it (a file replaced or removed by hand is read as it stands).
    """
    fd = None
    for _ in range(_PIN_TRIES):
        version = current_version(target)
        if version == target or fcntl is None:
            break
        fd = _pin(version)
        if fd is not None and not _as_written(target, version):
            os.close(fd)  # edited by hand: read the names as they stand
            fd, version = None, target
        if fd is not None or version == target:
            break
    else:
        raise CheckpointError(
            f"{target} was saved again {_PIN_TRIES} times while a load tried to open it; load "
            "it when the writer pauses"
        )
    try:
        yield version
    finally:
        if fd is not None:
            os.close(fd)  # releases the pin


def _pin(version: Path) -> int | None:
    """A descriptor holding a shared lock on ``version``, or ``None`` when a save removed
    the folder before it could be pinned."""
    try:
        fd = os.open(version, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a save removes it (an exclusive lock)
        if os.stat(version).st_ino == os.fstat(fd).st_ino:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _as_written(target: Path, version: Path) -> bool:
    """Whether every file of ``version`` is still named in ``target`` by zoo's link to it."""
    try:
        names = [entry.name for entry in version.iterdir()]
        return all(
            (target / n).is_symlink() and os.readlink(target / n) == f"{CURRENT}/{n}" for n in names
        )
    except OSError:
        return False


def _remove_version(folder: Path) -> None:
    """Remove a version folder unless a load has pinned it (a later save or load will)."""
    if fcntl is None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(folder, ignore_errors=True)
    except OSError:  # pinned by a load
        return
    finally:
        os.close(fd)


def clean_stale(target: Path) -> None:
    """Remove version folders other than the current one, and staging folders, left by a
    writer that was killed. Only while holding the lock, so a save in progress is never
    touched; a load that cannot take the lock at once skips it."""
    if not target.is_dir() or not _stale(target):  # the common case: no lock file made
        return
    with contextlib.suppress(TimeoutError, OSError), _lock(target, blocking=False):
        _remove_stale(target)


def _remove_stale(target: Path) -> None:
    """:func:`clean_stale`'s work, for a caller that holds the lock (a save: trying the lock
    again from the same process would fail, and nothing would ever be cleaned)."""
    for entry in _stale(target):
        if entry.is_symlink() or not entry.is_dir():
            entry.unlink(missing_ok=True)
        elif entry.name.startswith(_VERSION):
            _remove_version(entry)
        else:
            shutil.rmtree(entry, ignore_errors=True)


def _stale(target: Path) -> list[Path]:
    """Version folders other than the current one, links a killed writer had not renamed
    into place yet, and staging folders of older zoo saves."""
    current = _current(target)
    return [
        entry
        for entry in target.iterdir()
        if (entry.name.startswith(_VERSION) and entry != current)
        or entry.name.startswith((_LEGACY_STAGING, _LINK_STAGING))
    ]


def _link(target: Path, name: str, points_to: str) -> None:
    """Make ``target/name`` a link to ``points_to``, atomically replacing what was there."""
    temporary = target / f"{_LINK_STAGING}{uuid.uuid4().hex}"
    os.symlink(points_to, temporary)
    os.replace(temporary, target / name)


def _adopt(target: Path, names: set[str]) -> None:
    """Turn a folder of plain checkpoint files into a versioned one without changing what any
    name reads: the files are hard-linked into a version folder, ``.zoo-current`` points at
    it, then each plain file is replaced by a link to the same content."""
    plain = [n for n in sorted(names) if (target / n).is_file() and not (target / n).is_symlink()]
    if not plain or _current(target) is not None:
        return
    version = target / f"{_VERSION}{uuid.uuid4().hex}"
    version.mkdir()
    for name in plain:
        os.link(target / name, version / name)
    _link(target, CURRENT, version.name)
    for name in plain:
        _link(target, name, f"{CURRENT}/{name}")


def _fsync(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform/filesystem allows it on folders
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def process_umask() -> int:
    """The process umask, read without changing it where the platform allows."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: read it by setting it, and restore it at once
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_directory(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """Write a new version of the checkpoint folder ``directory``: the body writes the files
    into the folder it is given, and on success they replace the previous version in one
    atomic step (see the module docstring). If the body raises or the process dies, the
    previous version stays exactly as it was. Concurrent writers take turns (a lock file).

    Files get the permissions ``open()`` would give them under the umask (safetensors
    itself writes 0600).

    Args:
        directory: the checkpoint folder (created if missing).
    """
    if not os.fspath(directory):
        raise CheckpointError(
            "the checkpoint directory is an empty path; give a folder such as 'ckpt/' (or '.' "
            "to write into the current folder on purpose)"
        )
    target = Path(directory)
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    from safetensors import SafetensorError

    try:
        with _lock(target):
            yield from _write(target)
    except BaseException as exc:
        if created:  # a first save that failed leaves nothing, not even the folder
            shutil.rmtree(target, ignore_errors=True)
        if isinstance(exc, (OSError, SafetensorError)):  # disk full, read-only, quota...
            kept = "" if created else " The checkpoint that was there is unchanged."
            raise CheckpointError(
                f"could not write the checkpoint to {target}: {exc}.{kept} Free space (or fix "
                "the permissions) and save again."
            ) from exc
        raise


def _write(target: Path) -> Iterator[Path]:
    """Write a version folder (yielded to the caller to fill) and switch to it; called with
    the lock held."""
    _remove_stale(target)
    version = target / f"{_VERSION}{uuid.uuid4().hex}"
    version.mkdir()
    try:
        yield version
        names = {p.name for p in version.iterdir()}
        mode = 0o666 & ~process_umask()
        for name in names:
            if (version / name).is_file():
                os.chmod(version / name, mode)
                _fsync(version / name)
        _fsync(version)
        _switch(target, version, names)
    except BaseException:
        shutil.rmtree(version, ignore_errors=True)
        raise


def _switch(target: Path, version: Path, names: set[str]) -> None:
    """Make ``version`` the current version of ``target``."""
    try:
        _adopt(target, names)
        for name in names:  # links to the current version, made once per name
            link = target / name
            if not (link.is_symlink() and os.readlink(link) == f"{CURRENT}/{name}"):
                _link(target, name, f"{CURRENT}/{name}")
    except OSError:  # no links here: move files into place, config.json last
        for name in sorted(names, key=lambda n: (n == "config.json", n)):
            if (target / name).is_dir():
                shutil.rmtree(target / name)
            os.replace(version / name, target / name)
        shutil.rmtree(version, ignore_errors=True)
        _fsync(target)
        return
    old = _current(target)
    _link(target, CURRENT, version.name)  # the one atomic switch
    _fsync(target)
    for entry in target.iterdir():  # names only the old version had
        ours = entry.is_symlink() and os.readlink(entry).startswith(f"{CURRENT}/")
        if ours and entry.name not in names:
            entry.unlink()
    if old is not None and old != version:
        _remove_version(old)
