"""One writer per memory's files: the lock a memory opened with :meth:`tkg.Memory.open` holds on them for as long
as it is open (exclusive), and a save to a snapshot file holds while it writes (shared: saves of whole memories to
one file may run at once, each replacing the file atomically).

Two open memories on one snapshot and journal would each append batches with their own sequence numbers, and the
journal would no longer read back; a save over a file another memory has open would put a snapshot under its
journal that the journal does not follow. So the second is refused (:class:`tkg.errors.MemoryInUseError`), in this
process or another. The lock is the operating system's advisory lock (``flock``) on a file beside the snapshot,
``<name>.lock``: released by the OS when the process dies, so a crash leaves no stale lock (only, possibly, the
empty file, which the next writer reuses). The last holder deletes the file. Where the OS has no ``flock``
(Windows) there is no lock: one writer per file is then the caller's to ensure.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from tkg.errors import MemoryInUseError, SnapshotError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class WriterLock:
    """The lock on the files of the snapshot at ``snapshot`` (see the module docstring)."""

    def __init__(self, snapshot: Path) -> None:
        self.path = snapshot.with_name(snapshot.name + ".lock")
        self._fd: int | None = None

    def take(self, *, shared: bool = False) -> WriterLock:
        """Hold the lock (``shared``: beside other shared holders), or raise :class:`MemoryInUseError` at once if a
        holder it cannot be beside holds it."""
        if fcntl is None:  # pragma: no cover - Windows
            return self
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise SnapshotError(f"cannot take the writer's lock {self.path}: {exc}") from None
            if not _lock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX):
                os.close(fd)
                raise MemoryInUseError(
                    f"{self.path.name.removesuffix('.lock')} is in use by another writer (a memory opened on it with "
                    "Memory.open, or a save to it under way), in this process or another: close that memory "
                    "first, or read the file with Memory.load"
                ) from None
            # The file may have been deleted by the writer that held it, between our open and our lock: then the
            # lock is on a file no one else will look at; take the one at the path.
            if still_at(fd, self.path):
                self._fd = fd
                return self
            os.close(fd)

    def release(self) -> None:
        """Let the lock go; nothing when not held. The last holder deletes the file first, while it holds the lock
        alone (a shared holder finds whether it is the last by taking it exclusively, without waiting)."""
        fd, self._fd = self._fd, None
        if fd is None or fcntl is None:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held already when exclusive
            os.unlink(self.path)
        os.close(fd)


def still_at(fd: int, path: str | os.PathLike[str]) -> bool:
    """Whether the file open as ``fd`` is still the one at ``path`` (not deleted, nor replaced, since it was opened):
    a lock taken on it guards what others find at the path."""
    try:
        held, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


#: How long a writer tries the lock before it is refused: the last of several saves holds it exclusively for the
#: instant it takes to delete the file.
_PATIENCE_S = 0.2


def _lock(fd: int, mode: int) -> bool:
    """Take the lock ``mode`` on ``fd``, trying for :data:`_PATIENCE_S`; whether it was taken."""
    deadline = time.monotonic() + _PATIENCE_S
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
