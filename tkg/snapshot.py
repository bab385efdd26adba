"""Snapshots: a whole memory in one file, written atomically and verified, read defensively.

The file is a container of checksummed sections followed by a table of contents::

    magic (8 bytes) | format version (u16, big-endian) | section ... | table (msgpack) | trailer

The trailer (big-endian u64 table offset, u64 table length, sha256 of the table) is the file's last 48 bytes; the
table holds the caller's ``meta``, the vector dimension and, for each section, its name, offset, length and
sha256. The core writes two sections per kind of record (:mod:`tkg.codec` encodes them):

* ``records/<kind>`` -- every record of the kind, column by column (msgpack), vectors left out;
* ``vectors/<kind>`` -- the vectors of those records that have one, as one little-endian float32 matrix.

Every other section belongs to the store that wrote it (:meth:`tkg.storage.Store.export_indexes`): this module
stores it verbatim and hands it back to :meth:`tkg.storage.Store.restore`, which checks that it fits the records
and rebuilds what does not. Format 3 (written now) and 2 differ only in the in-memory backend's graph sections;
format 1 (one msgpack payload of row records after a fixed header) is still read.

Writing: the sections go to a temporary file in the target's directory; the file is flushed to disk, read back
and every checksum verified, and only then renamed over the target (and the directory synced). A save that
fails, or is killed, never touches the previous file; temporary files left by killed saves are removed by the
next save or open in that directory. Reading: magic, version, table and every section's checksum are verified
before anything is used (the big vectors sections are read and hashed on a helper thread while the records are
decoded), and nothing existing is touched if any check fails.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import struct
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, TypeVar

import msgpack
import numpy as np
import numpy.typing as npt

from tkg.codec import TimeCache, decode_columns, decode_record, encode_columns, encode_record
from tkg.errors import SnapshotError, SnapshotFormatError, SnapshotVersionError, TkgError
from tkg.models import Kind
from tkg.storage import KIND_ORDER, IndexExport, RecordSet, SectionData, Store
from tkg.writer_lock import still_at

R = TypeVar("R")

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

MAGIC = b"\x89TKGSNP\n"
FORMAT_VERSION = 3
_HEADER = struct.Struct(">HQ32s")  # format 1: version, payload length, sha256 of the payload
_VERSION = struct.Struct(">H")
TRAILER = struct.Struct(">QQ32s")  # formats 2+: table offset, table length, sha256 of the table
_CHUNK = 16 << 20  # bytes hashed at a time
_THREAD_MIN = 1 << 20  # chunks at least this big are hashed on a helper thread while they are written
_SYNC_EVERY = 256 << 20  # bytes written between two background flushes to disk
_VECTOR_ROWS = 16384  # vectors stacked at a time while writing
_STALE_AGE_S = 3600.0  # where files cannot be locked, a temporary file this old is taken as left by a dead save

__all__ = ["FORMAT_VERSION", "MAGIC", "OpenedSnapshot", "open_snapshot", "read", "read_meta", "save"]


# --------------------------------------------------------------------------------------------------------------
# writing
class _Writer:
    """Appends checksummed sections to ``out``. Helper threads keep the disk busy while Python works: one hashes
    a big chunk while it is written (hashlib and file writes release the GIL), one flushes written sections to
    disk (``fdatasync``) while the next are encoded, so the final ``fsync`` has little left to wait for.

    A section's digest is fed strictly in order: a chunk, big or small, is hashed only after the one before it
    (hashing one chunk on the helper thread while the next small one is hashed here would store a wrong digest).
    """

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.offset = 0
        self.sections: list[dict[str, Any]] = []
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="tkg-snapshot-hash")
        self._syncer = ThreadPoolExecutor(1, thread_name_prefix="tkg-snapshot-sync")
        self._sync: Future[None] | None = None
        self._unsynced = 0

    def raw(self, data: bytes | memoryview) -> None:
        self.out.write(data)
        size = memoryview(data).nbytes
        self.offset += size
        self._unsynced += size

    def section(self, name: str, chunks: Iterable[bytes | memoryview]) -> None:
        start, digest = self.offset, hashlib.sha256()
        hashing: Future[None] | None = None
        for chunk in chunks:
            if hashing is not None:
                hashing.result()  # the digest takes chunks in order: the one in flight first
                hashing = None
            if memoryview(chunk).nbytes < _THREAD_MIN:
                digest.update(chunk)
            else:
                hashing = submit(self._hasher, digest.update, chunk)
            self.raw(chunk)
        if hashing is not None:
            hashing.result()
        self.sections.append({"name": name, "offset": start, "length": self.offset - start, "sha256": digest.digest()})
        if self._unsynced >= _SYNC_EVERY and (self._sync is None or self._sync.done()):
            if self._sync is not None:
                self._sync.result()  # surface a failed flush now
            self.out.flush()
            self._sync = submit(self._syncer, _datasync, self.out.fileno())
            self._unsynced = 0

    def finish(self) -> None:
        """Everything written durably on disk."""
        if self._sync is not None:
            self._sync.result()
        self.out.flush()
        os.fsync(self.out.fileno())

    def close(self) -> None:
        self._hasher.shutdown(wait=True)
        self._syncer.shutdown(wait=True)


def _datasync(fd: int) -> None:
    getattr(os, "fdatasync", os.fsync)(fd)


def _vector_chunks(
    vectors: list[npt.NDArray[np.float32]],
    gather: Any,
    positions: npt.NDArray[np.int64],
) -> Iterator[bytes | memoryview]:
    """A kind's vectors section, in blocks: gathered by the store (a few C-level copies, checked against the
    records' own vectors at the start and end of each block) when it offers that, else stacked from the rows."""
    for start in range(0, len(vectors), _VECTOR_ROWS):
        rows = vectors[start : start + _VECTOR_ROWS]
        if gather is None:
            yield np.stack(rows).astype("<f4", copy=False).tobytes()
            continue
        block = np.ascontiguousarray(gather(positions[start : start + _VECTOR_ROWS]), dtype="<f4")
        for i in (0, len(block) - 1):
            if not np.array_equal(block[i], rows[i]):
                raise SnapshotError("the store's vector index disagrees with its records; cannot save")
        yield memoryview(block).cast("B")  # type: ignore[arg-type]


def _byte_chunks(data: SectionData) -> Iterator[bytes | memoryview]:
    """A section's bytes: an array is written from its own memory, a chunk at a time (no whole copy)."""
    if isinstance(data, bytes):
        yield data
        return
    flat = memoryview(np.ascontiguousarray(data)).cast("B")  # type: ignore[arg-type]
    for start in range(0, len(flat), _CHUNK):
        yield flat[start : start + _CHUNK]


def pack(value: Any) -> bytes:
    """msgpack bytes of ``value``; a value msgpack cannot hold is a :class:`SnapshotError`."""
    try:
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise SnapshotError(
            f"cannot encode the memory (an attribute value is not serialisable, or an integer wider than 64 "
            f"bits?): {exc}"
        ) from None


def save(store: Store, path: str | os.PathLike[str], meta: Mapping[str, Any]) -> int:
    """Write every record of ``store`` (and its own index sections) to ``path`` atomically; returns the file size
    in bytes. The file is read back and verified before it replaces the previous one."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise SnapshotError(f"cannot save to {target}: directory {directory} does not exist")
    remove_stale_temporaries(target)
    with _no_gc():  # millions of short-lived lists: none of them cyclic garbage
        return _save(store, target, directory, meta)


def _save(store: Store, target: Path, directory: Path, meta: Mapping[str, Any]) -> int:
    export = store.export_indexes() or IndexExport()
    # Each section is written as soon as it is encoded (the disk works while the next one is encoded). A value
    # that cannot be encoded stops the save with the temporary file deleted: the target is never touched.
    fd, tmp, held = _temporary(target, directory)
    try:
        with os.fdopen(fd, "wb") as out:
            writer = _Writer(out)
            try:
                writer.raw(MAGIC + _VERSION.pack(FORMAT_VERSION))
                for kind in KIND_ORDER:
                    fields = export.fields.get(kind)
                    records = fields or list(store.scan(kind))
                    payload, positions, vectors = encode_columns(kind, records, export.times.get(kind))
                    del records
                    writer.section(f"records/{kind.value}", [pack(payload)])
                    del payload
                    writer.section(
                        f"vectors/{kind.value}", _vector_chunks(vectors, export.vectors.get(kind), positions)
                    )
                for name, data in export.sections.items():
                    if name.startswith(("records/", "vectors/")):
                        raise SnapshotError(f"a store may not write a section named {name!r} (reserved for records)")
                    writer.section(name, _byte_chunks(data))
                table = pack({"meta": dict(meta), "dim": store.dim, "sections": writer.sections})
                table_offset = writer.offset
                writer.raw(table)
                writer.raw(TRAILER.pack(table_offset, len(table), hashlib.sha256(table).digest()))
                writer.finish()
            finally:
                writer.close()
            size = writer.offset
        verify_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        if held is not None:
            os.close(held)
    sync_directory(directory)
    return size


def submit(pool: ThreadPoolExecutor, fn: Callable[..., R], *args: Any) -> Future[R]:
    """``pool.submit(fn, *args)``, or ``fn`` run here when the interpreter is shutting down (Python starts no
    pool work then): a compaction still running as the main thread ends must finish, not fail."""
    try:
        return pool.submit(fn, *args)
    except RuntimeError:
        done: Future[R] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:
            done.set_exception(exc)
        return done


def verify_file(path: str | os.PathLike[str]) -> None:
    """Read a written snapshot back from disk and check its table and every section's checksum; raises
    :class:`SnapshotError` on any mismatch (the caller then keeps the previous file)."""
    with open(path, "rb") as f:
        try:
            places, _, _ = _table(path, f)
        except SnapshotFormatError as exc:
            raise SnapshotError(f"the snapshot just written does not read back: {exc}") from None

    def intact(place: tuple[int, int, bytes]) -> bool:
        offset, length, expected = place
        digest = hashlib.sha256()
        with open(path, "rb") as own:  # a handle per thread: reads at their own offsets
            own.seek(offset)
            left = length
            while left:
                chunk = own.read(min(_CHUNK, left))
                if not chunk:
                    return False
                digest.update(chunk)
                left -= len(chunk)
        return digest.digest() == expected

    # Two threads: hashing and reading release the GIL, and a big snapshot has a few big sections.
    with ThreadPoolExecutor(2, thread_name_prefix="tkg-snapshot-verify") as pool:
        jobs = [submit(pool, intact, place) for place in places.values()]
        checks = {name: job.result() for name, job in zip(places, jobs, strict=True)}
    bad = sorted(name for name, ok in checks.items() if not ok)
    if bad:
        raise SnapshotError(f"the snapshot just written does not read back intact (sections {bad}); not saved")


def sync_directory(directory: str | os.PathLike[str]) -> None:
    """Make renames and new files in ``directory`` durable (where the OS allows syncing a directory)."""
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _temporary(target: Path, directory: Path) -> tuple[int, str, int | None]:
    """A new temporary file beside ``target``: its descriptor, its path, and the descriptor holding its lock (None
    where the OS has no file locks). The file is marked in use until it is renamed or deleted, so that a concurrent
    cleanup leaves it alone; the lock is held on a descriptor of its own (closing the written one must not release
    it before the rename). A cleanup may take a new file for a dead save's in the instant before it is locked: then
    it is gone, and another is made."""
    while True:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
        if fcntl is None:
            return fd, tmp, None
        try:
            held = os.open(tmp, os.O_RDONLY)
        except FileNotFoundError:
            os.close(fd)
            continue
        fcntl.flock(held, fcntl.LOCK_EX)  # waits only while a cleanup looks at the file
        if still_at(held, tmp):
            return fd, tmp, held
        os.close(held)
        os.close(fd)


def remove_stale_temporaries(target: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files that killed saves of ``target`` left in its directory; returns them.

    A file is stale when no live process holds its lock (where the OS has file locks), else when it is older
    than an hour. A save in progress, in this process or another, is never disturbed."""
    target = Path(target)
    directory = target.parent if str(target.parent) else Path(".")
    removed: list[Path] = []
    prefix = f".{target.name}."
    try:
        # Only this target's own temporaries: those of "name.bak" match the pattern too, with a dot in the middle
        # (a save's random part has none).
        candidates = [p for p in directory.glob(f"{prefix}*.tmp") if "." not in p.name[len(prefix) : -len(".tmp")]]
    except OSError:
        return removed
    for candidate in candidates:
        try:
            with open(candidate, "rb") as f:
                if fcntl is not None:
                    try:
                        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError:
                        continue  # a live save holds it
                else:
                    if time.time() - os.fstat(f.fileno()).st_mtime < _STALE_AGE_S:
                        continue
                candidate.unlink()
                removed.append(candidate)
        except OSError:
            continue
    return removed


# --------------------------------------------------------------------------------------------------------------
# reading
class _Sections:
    """The store-owned sections of an open snapshot, read and verified (see :class:`tkg.storage.Sections`)."""

    def __init__(self, version: int, data: dict[str, memoryview]) -> None:
        self.version = version
        self._data = data

    def names(self) -> list[str]:
        return list(self._data)

    def read(self, name: str) -> memoryview:
        return self._data[name]


class OpenedSnapshot:
    """A snapshot whose table, records and sections have all been read and verified: ``meta`` (the caller's map),
    ``dim``, ``version``, ``records`` (a :class:`tkg.storage.RecordSet`) and the store-owned ``sections``."""

    def __init__(self, meta: dict[str, Any], dim: int | None, version: int, records: RecordSet, sections: _Sections):
        self.meta = meta
        self.dim = dim
        self.version = version
        self.records = records
        self.sections = sections

    def restore_into(self, store: Store) -> dict[str, Any]:
        """Fill an empty ``store`` with the records (and its index sections, which the store checks); returns the
        store's report of what it reused and what it rebuilt."""
        with _no_gc(settle=True):
            report = store.restore(self.records, self.sections)
        return {"format": self.version, **report}

    def __enter__(self) -> OpenedSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sections = _Sections(self.version, {})


def open_snapshot(path: str | os.PathLike[str]) -> OpenedSnapshot:
    """Read and verify a snapshot file. Raises :class:`SnapshotError` (missing or unreadable),
    :class:`SnapshotFormatError` (not a snapshot, truncated, corrupt) or :class:`SnapshotVersionError` (newer)."""
    remove_stale_temporaries(path)
    with _snapshot_file(path) as f:
        version = _format_version(path, f)
        if version == 1:
            f.seek(0)
            return _read_v1(path, f.read())
        with _no_gc(settle=True):
            return _read_sections(path, f, version)


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The meta map of a snapshot, from its verified table of contents only (the records are not read; a format
    1 file, which has no table, is read whole). Raises as :func:`open_snapshot` does."""
    with _snapshot_file(path) as f:
        if _format_version(path, f) == 1:
            f.seek(0)
            return _read_v1(path, f.read()).meta
        return _table(path, f)[1]


@contextlib.contextmanager
def _snapshot_file(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """The snapshot file open for reading; a missing or unreadable file is a :class:`SnapshotError`."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below on every path
    except FileNotFoundError:
        raise SnapshotError(f"snapshot {path} does not exist") from None
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None
    with f:
        try:
            yield f
        except OSError as exc:
            raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None


def _format_version(path: str | os.PathLike[str], f: IO[bytes]) -> int:
    """The format version in the header (1, 2 or 3), after checking the magic bytes."""
    head = f.read(len(MAGIC) + _VERSION.size)
    if head[: len(MAGIC)] != MAGIC:
        raise SnapshotFormatError(f"{path} is not a tkg snapshot (wrong magic bytes)")
    if len(head) < len(MAGIC) + _VERSION.size:
        raise SnapshotFormatError(f"{path} is truncated (incomplete header)")
    (version,) = _VERSION.unpack_from(head, len(MAGIC))
    if version > FORMAT_VERSION:
        raise SnapshotVersionError(
            f"{path} uses snapshot format {version}, newer than this tkg reads ({FORMAT_VERSION}); upgrade tkg"
        )
    if version not in (1, 2, 3):
        raise SnapshotFormatError(f"{path} has an unknown snapshot format {version}")
    return int(version)


def read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], RecordSet]:
    """The meta map and the records of a snapshot (verified), without a store."""
    opened = open_snapshot(path)
    return opened.meta, opened.records


@contextlib.contextmanager
def _no_gc(settle: bool = False) -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of records and sets are created: each collection
    would walk every object created so far, and none of them is garbage. With ``settle``, what was built is
    then filed straight into the oldest generation (freeze + unfreeze moves the younger generations there
    without walking them), so that the next collections do not walk millions of long-lived objects twice on
    their way up; skipped if the application has frozen objects of its own."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if settle and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if enabled:
            gc.enable()


def _table(path: str | os.PathLike[str], f: IO[bytes]) -> tuple[dict[str, tuple[int, int, bytes]], dict[str, Any], int]:
    """The sections' places (offset, length, sha256), the meta map and the vector dimension, from the trailer
    and the table of contents (both verified)."""
    start = len(MAGIC) + _VERSION.size
    size = f.seek(0, os.SEEK_END)
    if size < start + TRAILER.size:
        raise SnapshotFormatError(f"{path} is truncated (no table of contents)")
    f.seek(size - TRAILER.size)
    table_offset, table_length, digest = TRAILER.unpack(f.read(TRAILER.size))
    if table_offset < start or table_offset + table_length != size - TRAILER.size:
        raise SnapshotFormatError(f"{path} is truncated or padded (table of contents out of place)")
    f.seek(table_offset)
    raw_table = f.read(table_length)
    if hashlib.sha256(raw_table).digest() != digest:
        raise SnapshotFormatError(f"{path} is corrupt (table of contents checksum mismatch)")
    try:
        table = msgpack.unpackb(raw_table, raw=False, strict_map_key=False)
        meta, dim, sections = table["meta"], int(table["dim"]), table["sections"]
        places = {s["name"]: (int(s["offset"]), int(s["length"]), bytes(s["sha256"])) for s in sections}
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise SnapshotFormatError(f"{path} is corrupt: {exc}") from None
    if not isinstance(meta, dict):
        raise SnapshotFormatError(f"{path} is corrupt: unexpected table structure")
    for name, (offset, length, _) in places.items():
        if offset < start or length < 0 or offset + length > table_offset:
            raise SnapshotFormatError(f"{path} is corrupt: section {name} lies outside the file")
    return places, meta, dim


def _read_sections(path: str | os.PathLike[str], f: IO[bytes], version: int) -> OpenedSnapshot:
    """Formats 2 and 3."""
    places, meta, dim = _table(path, f)

    def load(name: str) -> memoryview:
        """A section's bytes, read into a buffer of its own size and verified."""
        offset, length, _ = places[name]
        buffer = np.empty(length, dtype=np.uint8)
        view = memoryview(buffer)  # type: ignore[arg-type]
        f.seek(offset)
        if f.readinto(view) != length:  # type: ignore[attr-defined]
            raise SnapshotFormatError(f"{path} is truncated (section {name})")
        verify(name, hashlib.sha256(view).digest())
        return view.toreadonly()

    def verify(name: str, digest: bytes) -> None:
        if digest != places[name][2]:
            raise SnapshotFormatError(f"{path} is corrupt (checksum mismatch in section {name})")

    records = RecordSet()
    times = TimeCache()
    refs: dict[str, str] = {}
    # The (big) vectors sections are read and hashed on a helper thread, all of them queued at once, while the
    # records, whose sections are verified as they are loaded, are decoded here: the records only need the
    # matrices' shapes (they hold read-only views of the rows). Nothing is returned before every digest matches.
    reader = ThreadPoolExecutor(1, thread_name_prefix="tkg-snapshot-read")
    fetching: dict[Kind, tuple[str, Future[bytes], npt.NDArray[np.float32]]] = {}
    try:
        for kind in KIND_ORDER:
            vec_name = f"vectors/{kind.value}"
            if f"records/{kind.value}" in places and vec_name in places and places[vec_name][1]:
                offset, length, _ = places[vec_name]
                rows = length // (4 * dim)
                if rows * 4 * dim != length:
                    raise SnapshotFormatError(f"{path} is corrupt: section {vec_name} is not whole vectors")
                buffer = np.empty((rows, dim), dtype="<f4")
                job = submit(reader, _read_into, f, path, buffer, offset, f"{path} (section {vec_name})")
                readable = buffer.view()
                readable.setflags(write=False)
                fetching[kind] = (vec_name, job, readable)
        for kind in KIND_ORDER:
            name = f"records/{kind.value}"
            if name not in places:
                continue
            payload = msgpack.unpackb(load(name), raw=False, strict_map_key=False)
            fetched = fetching.get(kind)
            matrix = fetched[2] if fetched is not None else None
            decoded, time_columns, vec_at = decode_columns(kind, payload, matrix, times, refs)
            records.records[kind] = decoded
            records.times[kind] = time_columns
            if matrix is not None:
                records.vectors[kind] = (vec_at, matrix)
        for vec_name, job, _ in fetching.values():
            verify(vec_name, job.result())
        owned = {name: load(name) for name in places if not name.startswith(("records/", "vectors/"))}
    except SnapshotError:
        raise
    except TkgError as exc:
        raise SnapshotFormatError(f"{path} holds an invalid record: {exc}") from None
    except Exception as exc:  # malformed columns: wrong types, lengths, codes
        raise SnapshotFormatError(f"{path} is corrupt: {exc!r}") from None
    finally:
        reader.shutdown(wait=True, cancel_futures=True)
    return OpenedSnapshot(meta, dim, version, records, _Sections(version, owned))


def _read_into(f: IO[bytes], path: str | os.PathLike[str], array: npt.NDArray[Any], offset: int, what: str) -> bytes:
    """Fill ``array`` from the snapshot at ``offset`` without moving ``f``'s position (the caller goes on reading
    through it) and return the sha256 of what was read: positional reads of the same open file where the OS has
    them, else a handle of its own on ``path``."""
    view = memoryview(array).cast("B")  # type: ignore[arg-type]
    with contextlib.ExitStack() as stack:
        if hasattr(os, "preadv"):
            fd = f.fileno()

            def read_at(part: memoryview, at: int) -> int:
                return os.preadv(fd, [part], at)
        else:  # Windows
            own = stack.enter_context(open(path, "rb"))

            def read_at(part: memoryview, at: int) -> int:
                own.seek(at)
                return own.readinto(part) or 0

        done = 0
        while done < len(view):
            got = read_at(view[done : done + (1 << 30)], offset + done)
            if got <= 0:
                raise SnapshotFormatError(f"{what} is truncated")
            done += got
    return hashlib.sha256(view).digest()


def _read_v1(path: str | os.PathLike[str], data: bytes) -> OpenedSnapshot:
    if len(data) < len(MAGIC) + _HEADER.size:
        raise SnapshotFormatError(f"{path} is truncated (incomplete header)")
    _version, length, digest = _HEADER.unpack_from(data, len(MAGIC))
    payload = memoryview(data)[len(MAGIC) + _HEADER.size :]
    if len(payload) != length:
        raise SnapshotFormatError(f"{path} is truncated or padded: {len(payload)} payload bytes, expected {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise SnapshotFormatError(f"{path} is corrupt (checksum mismatch)")
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        meta, rows = body["meta"], body["records"]
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise SnapshotFormatError(f"{path} is corrupt: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(rows, dict):
        raise SnapshotFormatError(f"{path} is corrupt: unexpected payload structure")
    records = RecordSet()
    for kind in KIND_ORDER:
        out = records.records.setdefault(kind, [])
        for item in rows.get(kind.value, []):
            try:
                out.append(decode_record(kind, item))
            except TkgError as exc:
                raise SnapshotFormatError(f"{path} holds an invalid {kind} record: {exc}") from None
            except Exception as exc:
                raise SnapshotFormatError(f"{path} holds a malformed {kind} record: {exc!r}") from None
    return OpenedSnapshot(meta, meta.get("dim"), 1, records, _Sections(1, {}))


def write_v1(store: Store, path: str | os.PathLike[str], meta: Mapping[str, Any]) -> int:
    """Write a format-1 snapshot (records only). Kept so tests can check that old files still load."""
    records = {kind.value: [encode_record(r) for r in store.scan(kind)] for kind in Kind}
    payload = pack({"meta": dict(meta), "records": records})
    header = MAGIC + _HEADER.pack(1, len(payload), hashlib.sha256(payload).digest())
    Path(path).write_bytes(header + payload)
    return len(header) + len(payload)
