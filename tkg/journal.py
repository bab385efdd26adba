"""The write-ahead journal of an embedded memory: every committed write, on disk before the call returns.

A memory opened with :meth:`tkg.Memory.open` lives in two kinds of files beside each other: its snapshot
(``mem.tkg``, :mod:`tkg.snapshot`) and journal segments (``mem.tkg.journal.000001``, ...). Every
:class:`~tkg.storage.WriteBatch` the store commits is first appended to the newest segment, then applied; the
snapshot's meta records the sequence number of the last batch it holds (``journal_seq``), so opening is: the
snapshot, then every journalled batch after it, in order.

Segment format (msgpack payloads, like the snapshot)::

    magic (8 bytes) | format version (u16) | meta entry | entry ...
    entry = payload length (u32) | crc32 of the payload (u32) | payload (msgpack map: seq, puts, deletes)
    meta entry = the same frame, its payload a map {"meta": {"embedder": name, "dim": size}} (format 2)

The meta entry records which embedder made the segment's vectors, so that a memory that has no snapshot yet
refuses another embedder as a snapshot does (format 1 segments have none and are read as before; a memory whose
newest segment is of format 1 writes on in a new segment, which records its embedder).

Puts are records in row form (:func:`tkg.codec.encode_record`, vectors as float32 bytes). A batch is whole or
absent: a torn or corrupt entry at the end of the newest segment (a crash mid-append: no whole batch after it) is
reported and cut off at the last whole batch; damage anywhere else -- in an older segment, or with whole batches
after it -- is an error (:class:`tkg.errors.JournalError`), never guessed over.

Durability (:class:`JournalPolicy`): by default every batch is flushed and ``fdatasync``-ed before the write
returns (``sync="always"``: an acknowledged write survives a crash of the process or the machine). With
``sync="interval"`` a helper thread syncs every ``interval`` seconds and writes return after the flush: faster,
and a machine crash may lose the last interval's acknowledged writes (a process crash loses nothing: the OS
holds the flushed bytes).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import msgpack

from tkg.codec import decode_record, encode_record
from tkg.config_fields import check_field_types
from tkg.errors import ConfigurationError, JournalError, TkgError
from tkg.models import Kind, vector_of
from tkg.storage import WriteBatch

log = logging.getLogger(__name__)

MAGIC = b"\x89TKGJRN\n"
FORMAT_VERSION = 2
_HEAD = struct.Struct(">H")
_ENTRY = struct.Struct(">II")  # payload length, crc32
_MAX_ENTRY = 1 << 31


@dataclass(frozen=True, slots=True)
class JournalPolicy:
    """How a journalled memory syncs and compacts.

    ``sync``: ``"always"`` (each batch synced before the write returns) or ``"interval"`` (synced every
    ``interval`` seconds by a helper thread). ``compact_bytes``: once the journal holds this many bytes, a new
    snapshot is written in the background and the journal starts afresh (0: only on :meth:`tkg.Memory.compact`).
    """

    sync: Literal["always", "interval"] = "always"
    interval: float = 0.05
    compact_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.sync not in ("always", "interval"):
            raise ConfigurationError(f"JournalPolicy.sync must be 'always' or 'interval', not {self.sync!r}")
        if not self.interval > 0:
            raise ConfigurationError("JournalPolicy.interval must be positive")
        if self.compact_bytes < 0:
            raise ConfigurationError("JournalPolicy.compact_bytes must be >= 0")


@dataclass(slots=True)
class Entry:
    """One journalled batch, decoded."""

    seq: int
    batch: WriteBatch


@dataclass(slots=True)
class ReadReport:
    """What reading the journal found: the batches in order, and the bytes cut off a torn tail (0: none)."""

    entries: list[Entry] = field(default_factory=list)
    cut_bytes: int = 0
    cut_segment: str = ""
    #: Each segment's number and the last sequence number in it (0: none).
    last_seq: dict[int, int] = field(default_factory=dict)
    #: Each segment's file name and its meta entry (the embedder that made its vectors), oldest first, for the
    #: segments that have one.
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)


def segment_paths(snapshot: Path) -> list[Path]:
    """The journal segments of the snapshot at ``snapshot``, oldest first."""
    prefix = f"{snapshot.name}.journal."
    found = []
    for candidate in snapshot.parent.glob(f"{prefix}*"):
        suffix = candidate.name[len(prefix) :]
        if suffix.isdigit() and len(suffix) == 6:
            found.append((int(suffix), candidate))
    return [path for _, path in sorted(found)]


def _number_of(segment: Path) -> int:
    return int(segment.name.rsplit(".", 1)[1])


def _segment_path(snapshot: Path, number: int) -> Path:
    return snapshot.parent / f"{snapshot.name}.journal.{number:06d}"


#: The first bytes of every batch payload: msgpack's map of three, and its first key, "seq" (:func:`encode_batch`).
_BATCH_START = b"\x83\xa3seq"


def encode_batch(seq: int, batch: WriteBatch) -> bytes:
    payload = {
        "seq": seq,
        "puts": [[r.kind.value, encode_record(r)] for r in batch.puts],
        "deletes": [[Kind(kind).value, record_id] for kind, record_id in batch.deletes],
    }
    try:
        body: bytes = msgpack.packb(payload, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise JournalError(f"cannot journal the write (a value msgpack cannot hold?): {exc}") from None
    return _frame(body)


def encode_meta(meta: dict[str, Any]) -> bytes:
    """A segment's meta entry (see the module docstring)."""
    return _frame(msgpack.packb({"meta": meta}, use_bin_type=True))


def _frame(body: bytes) -> bytes:
    """An entry: ``body`` behind its length and checksum."""
    return _ENTRY.pack(len(body), zlib.crc32(body)) + body


def _decode_entry(body: bytes) -> Entry | dict[str, Any]:
    """A batch, or a segment's meta (a map)."""
    data = msgpack.unpackb(body, raw=False, strict_map_key=False)
    if "meta" in data and "seq" not in data:
        if not isinstance(data["meta"], dict):
            raise ValueError("a meta entry that is not a map")
        return dict(data["meta"])
    puts = [decode_record(Kind(kind), row) for kind, row in data["puts"]]
    deletes = [(Kind(kind), str(record_id)) for kind, record_id in data["deletes"]]
    return Entry(int(data["seq"]), WriteBatch(puts=puts, deletes=deletes))


def read_segments(snapshot: Path, *, repair: bool) -> ReadReport:
    """Every whole batch of the snapshot's journal, oldest first. A torn or corrupt tail of the newest segment is
    cut off (``repair``: truncated on disk too). Raises :class:`JournalError` for damage anywhere else."""
    report = ReadReport()
    paths = segment_paths(snapshot)
    for index, path in enumerate(paths):
        newest = index == len(paths) - 1
        before = len(report.entries)
        metas: list[dict[str, Any]] = []
        try:
            with open(path, "rb") as f:
                good, cut = _read_segment(f, path, report.entries, metas, newest)
        except OSError as exc:
            raise JournalError(f"cannot read the journal segment {path}: {exc}") from None
        found = report.entries[before:]
        report.last_seq[_number_of(path)] = found[-1].seq if found else 0
        if metas:
            report.meta[path.name] = metas[0]
        if cut:
            report.cut_bytes, report.cut_segment = cut, path.name
            if repair:
                with open(path, "r+b") as f:
                    f.truncate(good)
                    f.flush()
                    os.fsync(f.fileno())
    seqs = [e.seq for e in report.entries]
    if any(b <= a for a, b in itertools.pairwise(seqs)):
        raise JournalError(f"the journal of {snapshot} is out of order (sequence numbers do not increase)")
    return report


def recorded_meta(snapshot: Path) -> dict[str, Any]:
    """What the journal of ``snapshot`` records of its vectors: ``dim``, their length (None when it holds none),
    and ``embedder``, which made them, when its newest segment with a meta entry names it (format 1 segments do
    not: their records' vectors tell the length). Reads without repairing."""
    read = read_segments(snapshot, repair=False)
    meta = dict(list(read.meta.values())[-1]) if read.meta else {}
    if not isinstance(meta.get("dim"), int):
        meta["dim"] = next(
            (len(v) for e in read.entries for r in e.batch.puts if (v := vector_of(r)) is not None), None
        )
    return meta


def _read_segment(
    f: IO[bytes], path: Path, into: list[Entry], metas: list[dict[str, Any]], newest: bool
) -> tuple[int, int]:
    """Append the segment's whole batches to ``into`` and its meta entries to ``metas``; returns (bytes of whole
    entries, bytes cut after them)."""
    data = f.read()
    head = len(MAGIC) + _HEAD.size
    if len(data) < head and newest:
        return 0, len(data)  # a segment whose header itself was torn: nothing was acknowledged in it
    if data[: len(MAGIC)] != MAGIC:
        raise JournalError(f"{path} is not a tkg journal segment (wrong magic bytes)")
    (version,) = _HEAD.unpack_from(data, len(MAGIC))
    if version > FORMAT_VERSION:
        raise JournalError(f"{path} uses journal format {version}, newer than this tkg reads; upgrade tkg")
    at = head
    while at < len(data):
        decoded, end, problem = _entry_at(data, at)
        if isinstance(decoded, Entry):
            into.append(decoded)
        elif decoded is not None:
            metas.append(decoded)
        else:
            if not newest:
                raise JournalError(
                    f"the journal segment {path} is damaged at byte {at} ({problem}) and a newer segment follows; "
                    "restore it from a backup, or move the segments from this one on aside to open what precedes"
                )
            after = _whole_batch_after(data, at + 1)
            if after is not None:  # a crash tears the last write only: what lies before a whole batch is damage
                raise JournalError(
                    f"the journal segment {path} is damaged at byte {at} ({problem}), and whole batches follow it "
                    f"(from byte {after}): not a write torn by a crash. Restore it from a backup; or, to keep only "
                    f"what precedes the damage, truncate the file to {at} bytes"
                )
            return at, len(data) - at
        at = end
    return at, 0


def _entry_at(data: bytes, at: int) -> tuple[Entry | dict[str, Any] | None, int, str]:
    """The entry whose frame begins at byte ``at`` (a batch or a meta entry), where the next begins, and the
    problem that makes it no whole entry (then None; "" when it is whole)."""
    if at + _ENTRY.size > len(data):
        return None, at, "an incomplete entry header"
    length, crc = _ENTRY.unpack_from(data, at)
    end = at + _ENTRY.size + length
    body = data[at + _ENTRY.size : end]
    if len(body) < length:
        return None, at, "an incomplete entry"
    if zlib.crc32(body) != crc:
        return None, at, "a checksum mismatch"
    try:
        return _decode_entry(body), end, ""
    except (TkgError, ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
        return None, at, f"an undecodable entry ({exc})"


def _whole_batch_after(data: bytes, start: int) -> int | None:
    """Where the first whole batch entry at or after byte ``start`` begins, or None. Found by the first bytes
    every batch payload has (:func:`encode_batch`: a map whose first key is "seq"), then read whole."""
    find = data.find(_BATCH_START, start + _ENTRY.size)
    while find >= 0:
        if isinstance(_entry_at(data, find - _ENTRY.size)[0], Entry):
            return find - _ENTRY.size
        find = data.find(_BATCH_START, find + 1)
    return None


class Journal:
    """The open journal of one memory: appends batches to its newest segment (see the module docstring)."""

    def __init__(
        self, snapshot: Path, next_seq: int, policy: JournalPolicy, meta: dict[str, Any] | None = None
    ) -> None:
        self.snapshot = snapshot
        self.policy = policy
        self._meta = meta  # written at the head of each new segment: the embedder that makes its vectors
        self._lock = threading.Lock()
        self._next_seq = next_seq
        paths = segment_paths(snapshot)
        self._number = _number_of(paths[-1]) if paths else 0
        self._file: IO[bytes] | None = None
        self._bytes = sum(p.stat().st_size for p in paths)
        self._closed = False
        self._dirty = threading.Event()
        #: Called with the journal's size after each append (the owner starts a compaction past a threshold).
        self.on_grow: Callable[[int], None] | None = None
        self._syncer: threading.Thread | None = None
        self._broken: str | None = None  # why no append may follow (a failed sync, a partial entry left)
        # appends go on in the newest segment, unless there is none or it is of an older format (a format 1
        # segment records no embedder: what is written from now on must)
        self._open_segment(new=not paths or _format_of(paths[-1]) < FORMAT_VERSION)
        if policy.sync == "interval":
            self._syncer = threading.Thread(target=self._sync_loop, name="tkg-journal-sync", daemon=True)
            self._syncer.start()

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def size(self) -> int:
        """Bytes in every segment not yet folded into a snapshot."""
        return self._bytes

    def _open_segment(self, *, new: bool) -> None:
        """Open the current segment (``new``: the next one) for appends; on an ``OSError`` the journal is as it
        was (a new segment that could not be started is removed)."""
        number = self._number + 1 if new else self._number
        path = _segment_path(self.snapshot, number)
        # Unbuffered: an append that fails leaves nothing in a buffer to reach the disk later (a later flush
        # would write the failed entry after all, under the sequence number of the next one).
        f = open(path, "ab", buffering=0)  # noqa: SIM115 - kept open for appends, closed by close()/rotate()
        try:
            if os.fstat(f.fileno()).st_size == 0:
                head = MAGIC + _HEAD.pack(FORMAT_VERSION) + (encode_meta(self._meta) if self._meta is not None else b"")
                _write_all(f, head)
                os.fsync(f.fileno())
                _sync_directory(self.snapshot.parent)
                self._bytes += len(head)
        except OSError:
            f.close()
            if new:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        self._number = number
        self._file = f

    def append(self, batch: WriteBatch) -> int:
        """Write ``batch`` at the end of the journal (synced per the policy) and return its sequence number.
        Raises :class:`JournalError` if it cannot be written durably; then nothing of it counts."""
        with self._lock:
            if self._closed or self._file is None:
                raise JournalError("the journal is closed; reopen the memory to write to it")
            if self._broken is not None:
                raise JournalError(self._broken)
            seq = self._next_seq
            entry = encode_batch(seq, batch)
            if len(entry) >= _MAX_ENTRY:
                raise JournalError("a single write is larger than the journal accepts (2 GiB)")
            f = self._file
            start = os.fstat(f.fileno()).st_size
            try:
                _write_all(f, entry)
                if self.policy.sync == "always":
                    os.fdatasync(f.fileno()) if hasattr(os, "fdatasync") else os.fsync(f.fileno())
                else:
                    self._dirty.set()
            except OSError as exc:
                try:  # leave no partial entry behind for the next append to follow
                    os.ftruncate(f.fileno(), start)
                except OSError as cut:  # a partial entry stays at the end: no append may follow it
                    self._broken = f"a failed append to the journal {f.name} could not be cut off: {cut}"
                raise JournalError(f"cannot append to the journal {f.name}: {exc}") from None
            self._next_seq = seq + 1
            self._bytes += len(entry)
            size = self._bytes
        if self.on_grow is not None:
            try:
                self.on_grow(size)
            except Exception:  # the batch is written and durable: a compaction that cannot start fails no write
                log.exception("a compaction of %s could not start; the journal keeps every write", self.snapshot)
        return seq

    def rotate(self) -> tuple[int, int]:
        """Close the current segment and start the next one. Returns (number of the segment closed, last sequence
        number written so far): a snapshot holding every batch up to that number replaces those segments."""
        with self._lock:
            if self._file is None:
                raise JournalError("the journal is closed")
            old, closed = self._file, self._number
            try:  # the next segment first: if it cannot be started, appends go on to this one
                self._open_segment(new=True)
            except OSError as exc:
                raise JournalError(f"cannot start a new journal segment for {self.snapshot}: {exc}") from None
            self._close_file(old)
            return closed, self._next_seq - 1

    def drop_through(self, number: int) -> None:
        """Delete the segments up to ``number`` (a snapshot now holds what they held)."""
        with self._lock:
            for path in segment_paths(self.snapshot):
                if _number_of(path) <= number and _number_of(path) != self._number:
                    size = path.stat().st_size
                    path.unlink()
                    self._bytes -= size
            _sync_directory(self.snapshot.parent)

    def sync(self) -> None:
        """Everything appended so far on disk."""
        with self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close_file()
        self._dirty.set()
        if self._syncer is not None:
            self._syncer.join(timeout=5)

    def _close_file(self, file: IO[bytes] | None = None) -> None:
        """Sync and close ``file`` (default: the current segment's, which is then gone)."""
        if file is None:
            file, self._file = self._file, None
        if file is not None:
            try:
                os.fsync(file.fileno())
            finally:
                file.close()

    def _sync_loop(self) -> None:
        while not self._closed:
            self._dirty.wait()
            self._dirty.clear()
            if self._closed:
                return
            try:
                with self._lock:
                    if self._file is not None:
                        os.fsync(self._file.fileno())
            except OSError as exc:  # surfaced by the next append
                self._broken = f"the journal could not be synced to disk: {exc}"
            threading.Event().wait(self.policy.interval)


def _format_of(segment: Path) -> int:
    """The format version in a segment's header; an empty segment (a torn header is cut to nothing) gets the
    current one when it is opened."""
    with open(segment, "rb") as f:
        head = f.read(len(MAGIC) + _HEAD.size)
    if not head:
        return FORMAT_VERSION
    return int(_HEAD.unpack_from(head, len(MAGIC))[0]) if len(head) == len(MAGIC) + _HEAD.size else 0


def _write_all(f: IO[bytes], data: bytes) -> None:
    """Write all of ``data`` to an unbuffered file (a raw write may take only part of it)."""
    view = memoryview(data)
    while view:
        written = f.write(view)
        if not written:
            raise OSError(f"a write to {f.name} took no bytes")
        view = view[written:]


def _sync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def iter_after(report: ReadReport, seq: int) -> Iterator[Entry]:
    """The journalled batches after sequence number ``seq`` (what a snapshot at ``seq`` lacks)."""
    return (e for e in report.entries if e.seq > seq)


__all__ = ["Entry", "Journal", "JournalPolicy", "ReadReport", "encode_batch", "read_segments", "segment_paths"]
