"""The files half of the facade: saving a snapshot, compacting the journal of a memory opened with
:meth:`tkg.Memory.open`, and closing it. :class:`tkg.Memory` is the only class that uses it; opening and loading
are its constructors (:meth:`tkg.Memory.open`, :meth:`tkg.Memory.load`)."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from tkg import persistence
from tkg.clock import Clock
from tkg.embedders.base import Embedder
from tkg.locks import MemoryLocks
from tkg.storage import Store


class MemoryFiles:
    """Snapshots and durable files of a memory (see :class:`tkg.Memory`)."""

    _store: Store
    _locks: MemoryLocks
    _clock: Clock
    _embedder: Embedder
    _files: persistence.DurableFiles | None

    def save(self, path: str | Path) -> int:
        """Write the whole memory to one msgpack file, atomically: the previous file at ``path`` is replaced only
        by a file that has been read back and checked. Returns the file size in bytes. For a memory opened with
        :meth:`tkg.Memory.open`, saving to its own file is :meth:`compact`."""
        if self._files is not None and persistence.file_path(path).resolve() == self._files.path.resolve():
            self.compact()
            return self._files.path.stat().st_size
        meta = {**persistence.vectors_meta(self._embedder), "saved_at": self._clock.now().isoformat()}
        # Under the read lock: the snapshot reads each kind and the indexes separately, and a write in between
        # would leave a file whose facts name entities it does not hold.
        with self._locks.read():
            return persistence.save_snapshot(self._store, path, meta)

    def compact(self) -> None:
        """Fold the journal of a memory opened with :meth:`tkg.Memory.open` into a new snapshot now, and wait for
        it (writes go on meanwhile). A memory without files has nothing to compact."""
        if self._files is not None:
            self._files.compact(wait=True)

    def close(self) -> None:
        """Finish a background compaction and close the journal of a memory opened with :meth:`tkg.Memory.open`
        (its writes are on disk already). The memory must not be written to afterwards."""
        if self._files is not None:
            self._files.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
