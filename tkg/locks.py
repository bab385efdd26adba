"""The concurrency rule of a memory, in one place.

* Every read of a :class:`tkg.Memory` (search, context, get, listings, snapshots) holds the memory's lock for
  reading; every write holds it for writing. Reads run together; a write runs alone. A waiting writer stops new
  readers from starting, so writes are never starved by a stream of searches.
* Episodes of one group apply one at a time, in order: ingestion and removal hold the group's lock for the whole
  read-modify-write cycle (LLM calls included, the store lock not), so two episodes of a group never plan from
  the same state. A store shared between processes (:attr:`tkg.storage.Store.shared`) adds its own cross-process
  group lock. What writes several groups at once (an import) takes their locks in sorted order, each before
  the store lock, as every writer does.
* Nothing outside the facade touches the store: the doors (servers, CLI, pictures, background ingestion) call
  :class:`tkg.Memory`'s methods, which take these locks.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

from tkg.storage import Store


class ReadWriteLock:
    """Many readers or one writer, writer-preferring.

    Re-entrant: a thread may take the read lock again while it holds it (even with a writer waiting), take the
    write lock again while it holds it, and read while it writes. Taking the write lock while holding only the
    read lock would deadlock two such threads, so it raises :class:`RuntimeError` instead.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers: dict[int, int] = {}  # thread id -> read depth
        self._writer: int | None = None
        self._writer_depth = 0
        self._waiting_writers = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer != me and me not in self._readers:
                while self._writer is not None or self._waiting_writers:
                    self._cond.wait()
            self._readers[me] = self._readers.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                depth = self._readers[me] - 1
                if depth:
                    self._readers[me] = depth
                else:
                    del self._readers[me]
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._writer_depth += 1
            else:
                if me in self._readers:
                    raise RuntimeError("a thread holding the read lock cannot take the write lock (deadlock)")
                self._waiting_writers += 1
                try:
                    while self._writer is not None or self._readers:
                        self._cond.wait()
                finally:
                    self._waiting_writers -= 1
                self._writer, self._writer_depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._writer_depth -= 1
                if not self._writer_depth:
                    self._writer = None
                    self._cond.notify_all()


class MemoryLocks:
    """The locks of one memory: the store's readers-writer lock and a lock per group (see the module docstring)."""

    def __init__(self) -> None:
        self.store = ReadWriteLock()
        self._groups: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def read(self) -> contextlib.AbstractContextManager[None]:
        return self.store.read()

    def write(self) -> contextlib.AbstractContextManager[None]:
        return self.store.write()

    @contextlib.contextmanager
    def group(self, group_id: str, store: Store) -> Iterator[None]:
        """Held while one episode of the group is ingested or removed; a shared store's own group lock too."""
        with self._guard:
            local = self._groups.setdefault(group_id, threading.Lock())
        with local, store.group_lock(group_id):
            yield

    @contextlib.contextmanager
    def groups(self, group_ids: Iterable[str], store: Store) -> Iterator[None]:
        """The locks of several groups (an import), taken in sorted order: two such writers never wait for each
        other crosswise."""
        with contextlib.ExitStack() as held:
            for group_id in sorted(set(group_ids)):
                held.enter_context(self.group(group_id, store))
            yield
