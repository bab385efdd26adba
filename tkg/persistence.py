"""Where a memory lives between processes, and what is durable when.

* :func:`load_snapshot` (:meth:`tkg.Memory.load`): the snapshot file, then whatever its journal holds after it,
  into a store; nothing is kept open.
* :class:`DurableFiles` (:meth:`tkg.Memory.open`): the same, and from then on every committed write is appended to
  the journal (:mod:`tkg.journal`) before it is applied: an acknowledged write survives a crash. Past a size
  threshold the journal is compacted: the segments written so far are closed (an instant, under the write lock),
  and a new snapshot holding everything up to them is built from the old snapshot and those segments, in a
  background thread, on a separate store: writers are never blocked by it. The new snapshot replaces the old one
  atomically (read back and verified first) and only then are the segments it holds deleted; a crash at any
  point leaves a snapshot and the segments after it, which open gives back whole.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tkg import snapshot
from tkg.embedders.base import Embedder
from tkg.errors import BackendError, ConfigurationError, JournalError, SnapshotError, ValidationError
from tkg.journal import Entry, Journal, JournalPolicy, ReadReport, read_segments, segment_paths
from tkg.locks import MemoryLocks
from tkg.models import Kind, Record
from tkg.storage import Store, WriteBatch
from tkg.writer_lock import WriterLock

log = logging.getLogger(__name__)


def save_snapshot(store: Store, path: str | os.PathLike[str], meta: Mapping[str, Any]) -> int:
    """Write ``store`` to a snapshot at ``path`` (atomic, verified); returns the file size in bytes. A path that
    cannot be a file (a directory, or in a directory that does not exist) is a :class:`SnapshotError`, before
    anything is written; a failure of the disk itself stays the ``OSError`` it is."""
    target = file_path(path)
    problem = unsavable(target)
    if problem is not None:
        raise SnapshotError(f"cannot save {path}: {problem}")
    lock = WriterLock(target).take(shared=True)  # not under an open memory: its journal would not follow
    try:
        # A journal beside the file is the replaced memory's: the new snapshot covers it (its journal_seq is the
        # journal's last), so no open or load replays it onto this one, even if a crash stops its deletion.
        segments = segment_paths(target)
        if segments:
            meta = {**meta, "journal_seq": _last_seq(target, segments)}
        size = snapshot.save(store, target, meta)
        for segment in segments:
            segment.unlink(missing_ok=True)
        return size
    finally:
        lock.release()


def _last_seq(target: Path, segments: Sequence[Path]) -> int:
    """The last sequence number of the journal ``segments`` of ``target``; a damaged journal (which no one could
    open) is deleted first instead (the save replaces what it held)."""
    try:
        return max(read_segments(target, repair=False).last_seq.values(), default=0)
    except JournalError:
        for segment in segments:
            segment.unlink(missing_ok=True)
        return 0


def file_path(path: object, what: str = "a memory's file path") -> Path:
    """``path`` (a string or path-like) as a :class:`Path`; :class:`ValidationError` for anything else (a NUL
    character included: no file system takes one)."""
    if isinstance(path, str | os.PathLike) and not isinstance(path, bytes):
        text = os.fspath(path)
        if isinstance(text, str) and text and "\x00" not in text:
            return Path(text)
    raise ValidationError(f"{what} must be a non-empty string or path, not {path!r}")


def shared_temporary(target: Path, suffix: str = ".tmp") -> tuple[int, str]:
    """A new temporary file beside ``target`` (its descriptor, open for writing, and its path) with the permissions
    any new file there gets (0666 less the umask), for files others read -- exports, pictures -- once renamed into
    place; ``tempfile.mkstemp`` makes them 0600."""
    directory = target.parent if str(target.parent) else Path(".")
    while True:
        path = directory / f".{target.name}.{secrets.token_hex(6)}{suffix}"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), str(path)
        except FileExistsError:
            continue


def unsavable(path: Path) -> str | None:
    """Why no snapshot can be saved at ``path`` (it is a directory, or its directory does not exist), or None."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        return f"directory {directory} does not exist"
    if path.is_dir():
        return "it is a directory"
    return None


def vectors_meta(embedder: Embedder) -> dict[str, Any]:
    """What a snapshot's meta and each journal segment record of the vectors they hold: the embedder that made
    them and their size (checked on open by :func:`_check_meta`)."""
    return {"embedder": embedder.name, "dim": embedder.dim}


def _check_meta(what: str, meta: Mapping[str, Any], embedder: Embedder, check: bool) -> None:
    """Refuse ``embedder`` for the vectors that ``meta`` (of a snapshot, or of a journal segment: ``what``)
    describes, when it makes vectors of another size, or (``check``) is another embedder."""
    if meta.get("dim") != embedder.dim:
        raise ConfigurationError(f"{what} holds {meta.get('dim')}-d vectors; the embedder makes {embedder.dim}-d")
    if check and meta.get("embedder") != embedder.name:
        raise ConfigurationError(
            f"{what} was embedded with {meta.get('embedder')!r}, not {embedder.name!r}; "
            "pass the same embedder, or check_embedder=False to mix them knowingly"
        )


def _empty_store(store: Store | None, embedder: Embedder) -> Store:
    if store is None:
        from tkg.backends.memory import InMemoryStore

        store = InMemoryStore(dim=embedder.dim)
    if store.dim != embedder.dim:
        raise ConfigurationError(f"the store holds {store.dim}-d vectors; the embedder makes {embedder.dim}-d")
    if any(store.count(kind) for kind in Kind):
        raise BackendError("Memory.load() needs an empty store; the one given holds records")
    return store


@dataclass(slots=True)
class OpenReport:
    """What opening a memory's files found."""

    snapshot: bool = False
    #: The sequence number of the last journalled batch the snapshot holds.
    snapshot_seq: int = 0
    #: Batches replayed from the journal after the snapshot.
    replayed: int = 0
    #: Bytes cut off a torn journal tail (a crash mid-append), and the segment they were in.
    cut_bytes: int = 0
    cut_segment: str = ""
    removed_temporaries: list[str] = field(default_factory=list)


def _fill(
    path: Path, embedder: Embedder, store: Store | None, check_embedder: bool, repair: bool, upto: int | None = None
) -> tuple[Store, OpenReport, ReadReport]:
    """The snapshot at ``path`` (if any) and its journal's later batches (up to ``upto`` when given), into an
    empty store."""
    report = OpenReport(removed_temporaries=[str(p) for p in snapshot.remove_stale_temporaries(path)])
    journal = read_segments(path, repair=repair)
    for segment, meta in journal.meta.items():  # before anything is read in: a memory without a snapshot too
        _check_meta(f"journal segment {segment}", meta, embedder, check_embedder)
    if path.exists():
        with snapshot.open_snapshot(path) as opened:
            _check_meta(f"snapshot {path}", opened.meta, embedder, check_embedder)
            store = _empty_store(store, embedder)
            opened.restore_into(store)
            report.snapshot = True
            report.snapshot_seq = int(opened.meta.get("journal_seq", 0))
    elif journal.entries or segment_paths(path):
        store = _empty_store(store, embedder)
    else:
        raise snapshot.SnapshotError(f"snapshot {path} does not exist")
    pending = [e for e in journal.entries if e.seq > report.snapshot_seq and (upto is None or e.seq <= upto)]
    replay(store, pending)
    report.replayed = len(pending)
    report.cut_bytes, report.cut_segment = journal.cut_bytes, journal.cut_segment
    if journal.cut_bytes:
        log.warning(
            "the journal of %s ended in a torn write (a crash mid-append): %d bytes cut from %s; every whole batch "
            "before it was kept",
            path,
            journal.cut_bytes,
            journal.cut_segment,
        )
    return store, report, journal


def replay(store: Store, entries: Sequence[Entry]) -> None:
    """Apply journalled batches, in order, as one write of their end state: every record as the last batch left
    it, in the order it was first written (as the batches would have left the store's order), deleted ones
    deleted. Into an empty store it is a bulk load (indexes built once); into a filled one, one batch."""
    if not entries:
        return
    final: dict[tuple[Kind, str], Record | None] = {}
    for entry in entries:
        for record in entry.batch.puts:
            final[(record.kind, record.id)] = record
        for kind, record_id in entry.batch.deletes:
            final[(Kind(kind), record_id)] = None
    puts = [r for r in final.values() if r is not None]
    if not any(store.count(kind) for kind in Kind):
        store.load(puts)
    else:
        store.write(WriteBatch(puts=puts, deletes=[key for key, r in final.items() if r is None]))


def load_snapshot(
    path: str | os.PathLike[str], embedder: Embedder, store: Store | None = None, *, check_embedder: bool = True
) -> Store:
    """The store filled from the snapshot at ``path`` and the journal beside it, if any (a fresh in-memory store
    unless an empty ``store`` is given), after checking that ``embedder`` made its vectors. Nothing is changed on
    disk, and nothing is kept open."""
    filled, _, _ = _fill(file_path(path), embedder, store, check_embedder, repair=False)
    return filled


class DurableFiles:
    """The snapshot and journal of a memory opened with :meth:`tkg.Memory.open` (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        embedder: Embedder,
        store: Store,
        journal: Journal,
        policy: JournalPolicy,
        report: OpenReport,
        check_embedder: bool,
        lock: WriterLock,
    ) -> None:
        self.path = path
        self._writer = lock
        self.embedder = embedder
        self.store = store
        self.journal = journal
        self.policy = policy
        self.report = report
        self._check_embedder = check_embedder
        self._locks: MemoryLocks | None = None
        self._compacting = threading.Lock()
        self._worker: threading.Thread | None = None
        self.last_error: BaseException | None = None

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        embedder: Embedder,
        *,
        store: Store | None = None,
        check_embedder: bool = True,
        policy: JournalPolicy | None = None,
        create: bool = True,
    ) -> DurableFiles:
        target = file_path(path)
        if not target.parent.is_dir():
            raise snapshot.SnapshotError(f"cannot open {target}: directory {target.parent} does not exist")
        policy = policy or JournalPolicy()
        lock = WriterLock(target).take()  # before anything is read: no other writer appends meanwhile
        try:
            if not target.exists() and not segment_paths(target):
                if not create:
                    raise snapshot.SnapshotError(f"snapshot {target} does not exist")
                filled, report, journal_read = _empty_store(store, embedder), OpenReport(), ReadReport()
            else:
                filled, report, journal_read = _fill(target, embedder, store, check_embedder, repair=True)
            if not filled.journals:
                raise ConfigurationError(
                    f"{type(filled).__name__} persists its own writes; open it with Memory(store=...), not "
                    "Memory.open()"
                )
            last = max([report.snapshot_seq, *(e.seq for e in journal_read.entries)], default=0)
            covered = [n for n, seq in journal_read.last_seq.items() if seq and seq <= report.snapshot_seq]
            journal = Journal(target, last + 1, policy, vectors_meta(embedder))
        except BaseException:
            lock.release()
            raise
        if covered:  # segments a finished compaction did not get to delete
            journal.drop_through(max(covered))
        files = cls(target, embedder, filled, journal, policy, report, check_embedder, lock)
        journal.on_grow = files._grew
        filled.attach_journal(journal)
        return files

    def bind(self, locks: MemoryLocks) -> None:
        """The locks of the memory these files belong to (compaction takes its write lock for the switch)."""
        self._locks = locks

    def _grew(self, size: int) -> None:
        if self.policy.compact_bytes and size >= self.policy.compact_bytes:
            self.compact(wait=False)

    def compact(self, *, wait: bool = True) -> bool:
        """Fold the journal into a new snapshot (see the module docstring). Returns False if a compaction was
        already running (``wait=False``). With ``wait``, raises what the compaction raised."""
        if not self._compacting.acquire(blocking=wait):
            return False
        try:
            locks = self._locks or MemoryLocks()
            with locks.write():  # the switch: new writes go to a fresh segment
                closed, upto = self.journal.rotate()
        except BaseException:
            self._compacting.release()
            raise
        if wait:
            try:
                self._fold(closed, upto)
            finally:
                self._compacting.release()
            return True

        def work() -> None:
            try:
                self._fold(closed, upto)
            except BaseException as exc:  # the files are intact: the next compaction tries again
                self.last_error = exc
                log.exception("compaction of %s failed; the journal keeps every write", self.path)
            finally:
                self._compacting.release()

        # Not a daemon: a process that ends mid-compaction waits for it (as close() does). A daemon thread stopped
        # inside hnswlib (the replica's index build) aborted the process at exit, the files intact but exit 134.
        self._worker = threading.Thread(target=work, name="tkg-compact")
        self._worker.start()
        return True

    def _fold(self, closed: int, upto: int) -> None:
        """A snapshot holding every batch up to ``upto``, built apart from the live store, then the old segments
        deleted."""
        replica, _, _ = _fill(self.path, self.embedder, None, self._check_embedder, repair=False, upto=upto)
        meta = {**vectors_meta(self.embedder), "saved_at": datetime.now(UTC).isoformat(), "journal_seq": upto}
        snapshot.save(replica, self.path, meta)
        self.journal.drop_through(closed)

    def wait(self) -> None:
        """Wait for a background compaction to finish."""
        worker = self._worker
        if worker is not None:
            worker.join()

    def close(self) -> None:
        self.wait()
        # Under the memory's write lock: a write in flight is on disk before the journal closes. The closed
        # journal stays attached, so a write that comes later fails (JournalError) and changes nothing, instead
        # of being applied in memory and never stored.
        with (self._locks or MemoryLocks()).write():
            self.journal.close()
        self._writer.release()  # another writer may open the files now
