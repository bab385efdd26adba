"""Snapshots: a whole memory in one file, written atomically, read defensively.

Format 3 (written now) and format 2 are a sequence of checksummed sections followed by a table of contents::

    magic (8 bytes) | format version (u16, big-endian) | section ... | table (msgpack) | trailer

The trailer (big-endian u64 table offset, u64 table length, sha256 of the table) is the file's last 48 bytes; the
table holds the caller's ``meta`` and, for each section, its name, offset, length and sha256. Sections:

* ``records/<kind>`` -- every record of a kind, column by column (msgpack): datetimes as little-endian int64
  microseconds since the epoch (UTC), repeated strings dictionary-encoded, vectors left out;
* ``vectors/<kind>`` -- the vectors of those records that have one, as one little-endian float32 matrix;
* optional index sections, written by a store that offers ``export_snapshot`` (the in-memory backend):
  ``slots/<kind>`` (each record's slot), ``scale/<kind>`` (each record's stored ``1 / norm``, float32),
  ``hnsw/<kind>`` and ``hnswdata/<kind>`` (the HNSW graph) and ``bm25/<kind>``, so that a load restores the
  indexes instead of rebuilding them. A store without that hook, or a snapshot without those sections, rebuilds
  them; an index section that does not fit the records is dropped and rebuilt, never used.

Format 3 differs from format 2 only in the graph sections. Format 2 stored hnswlib's own index file in
``hnsw/<kind>``, which holds a second copy of every vector and which hnswlib can only load from a path (so a load
copied it to a temporary file). Format 3 stores hnswlib's pickle state instead: ``hnsw/<kind>`` is a msgpack map of
its parameters and small arrays, ``hnswdata/<kind>`` its per-element block (links and label) with the vector cut
out; a load puts the vectors back from ``vectors/<kind>`` and ``scale/<kind>`` (bit for bit what hnswlib was given)
and hands the state to hnswlib in memory. That makes the file ~40% smaller and both save and load faster.

Format 1 (one msgpack payload of row records after a fixed header) is still read; its indexes are rebuilt.

A save goes to a temporary file in the same directory, is fsynced, then renamed over the target, so a crash
leaves the previous snapshot intact. A load checks magic, version and table, and every section's checksum before
decoding or using it (a vectors section is hashed on a helper thread while the records of its kind, already
verified, are decoded), and builds a new store; nothing existing is touched if any check fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import hashlib
import os
import struct
import tempfile
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from itertools import repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import IO, Any

import msgpack
import numpy as np
import numpy.typing as npt

from tkg import models
from tkg.errors import SnapshotError, SnapshotFormatError, SnapshotVersionError, TkgError
from tkg.models import RECORD_TYPES, VECTOR_FIELD, Kind, Record
from tkg.storage import Store, WriteBatch
from tkg.timeutil import from_micros, to_micros

MAGIC = b"\x89TKGSNP\n"
FORMAT_VERSION = 3
_HEADER = struct.Struct(">HQ32s")  # format 1: version, payload length, sha256 of the payload
_VERSION = struct.Struct(">H")
_TRAILER = struct.Struct(">QQ32s")  # format 2: table offset, table length, sha256 of the table
DT_TAG = "__dt__"
MAP_TAG = "__map__"  # wraps a user's map that would read as a tagged value
_TAGS = frozenset({DT_TAG, MAP_TAG})
_NONE = np.iinfo(np.int64).min  # an absent optional datetime in an int64 column
_CHUNK = 16 << 20  # bytes copied / hashed at a time
_THREAD_MIN = 1 << 20  # chunks at least this big are hashed on a helper thread while they are written
_SYNC_EVERY = 256 << 20  # bytes written between two background flushes to disk
_VECTOR_ROWS = 16384  # vectors stacked at a time while writing
#: Dependency order: endpoints before the edges that point to them.
ORDER = (Kind.EPISODE, Kind.ENTITY, Kind.COMMUNITY, Kind.FACT, Kind.MENTION, Kind.MEMBERSHIP)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # as in tkg.timeutil.from_micros
_REF_FIELDS = frozenset({"source_id", "target_id", "episode_id", "entity_id", "community_id", "invalidated_by"})


# --------------------------------------------------------------------------------------------------------------
# format 1 rows (still read; also the codec of nested attribute values)
def _encode_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return {DT_TAG: to_micros(value)}
    if isinstance(value, np.ndarray):
        return value.astype("<f4").tobytes()
    if isinstance(value, tuple):
        return [_encode_value(v) for v in value]
    if isinstance(value, Mapping):
        return escape_map({str(k): _encode_value(v) for k, v in value.items()}, _TAGS)
    if isinstance(value, list):
        return [_encode_value(v) for v in value]
    if hasattr(value, "value") and isinstance(getattr(value, "value", None), str):  # StrEnum
        return value.value
    return value


def escape_map(encoded: dict[str, Any], tags: frozenset[str]) -> dict[str, Any]:
    """A user's map whose one key is a tag (``{"__dt__": 5}``) is wrapped as ``{"__map__": ...}``, so that it is
    never read back as a tagged value. Shared by every tagged codec (snapshots, PostgreSQL's JSON)."""
    return {MAP_TAG: encoded} if len(encoded) == 1 and next(iter(encoded)) in tags else encoded


def encode_record(record: Record) -> dict[str, Any]:
    return {f.name: _encode_value(getattr(record, f.name)) for f in dataclasses.fields(record)}


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and DT_TAG in value:
            return from_micros(value[DT_TAG])
        if len(value) == 1 and MAP_TAG in value:
            return {k: _decode_value(v) for k, v in value[MAP_TAG].items()}
        return {k: _decode_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_value(v) for v in value]
    return value


_VECTOR_FIELDS = {"embedding", "name_embedding"}
_TUPLE_FIELDS = {"labels", "aliases", "episodes"}


def decode_record(kind: Kind, data: Mapping[str, Any]) -> Record:
    fields: dict[str, Any] = {}
    for name, value in data.items():
        if name in _VECTOR_FIELDS and value is not None:
            fields[name] = np.frombuffer(value, dtype="<f4").astype(np.float32)
        elif name in _TUPLE_FIELDS:
            fields[name] = tuple(value)
        else:
            fields[name] = _decode_value(value)
    return RECORD_TYPES[kind](**fields)


# --------------------------------------------------------------------------------------------------------------
# format 2 columns
def _field_codes(cls: type) -> list[tuple[str, str]]:
    """Each field of a record type with how its column is encoded: dt, dt?, tuple, map, vec or val."""
    out = []
    for f in dataclasses.fields(cls):
        t = str(f.type).replace(" ", "")
        if t == "datetime":
            code = "dt"
        elif t in ("datetime|None", "Optional[datetime]"):
            code = "dt?"
        elif t.startswith("tuple["):
            code = "tuple"
        elif t.startswith("Mapping[") or t.startswith("dict["):
            code = "map"
        elif f.name == VECTOR_FIELD.get(cls.kind):  # type: ignore[attr-defined]
            code = "vec"
        else:
            code = "val"
        out.append((f.name, code))
    return out


def _enum_of(cls: type, name: str) -> type[enum.Enum] | None:
    annotation = str(next(f.type for f in dataclasses.fields(cls) if f.name == name))
    found = getattr(models, annotation, None)
    return found if isinstance(found, type) and issubclass(found, enum.Enum) else None


def _encode_column(code: str, values: list[Any]) -> Any:
    if code == "dt":
        return np.fromiter(map(to_micros, values), dtype="<i8", count=len(values)).tobytes()
    if code == "dt?":
        return np.fromiter((_NONE if v is None else to_micros(v) for v in values), "<i8", len(values)).tobytes()
    if code == "tuple":
        return values  # msgpack writes tuples as arrays
    if code == "map":
        at = [i for i, v in enumerate(values) if v]
        return {"at": at, "values": [_encode_value(values[i]) for i in at]}
    if values and isinstance(values[0], enum.Enum):
        values = [v.value for v in values]
    unique = dict.fromkeys(values)
    if len(unique) <= max(1, len(values) // 2):  # repeated values (groups, relations, labels): codes + table
        codes = {v: i for i, v in enumerate(unique)}
        return {"u": list(unique), "c": np.fromiter(map(codes.__getitem__, values), "<i4", len(values)).tobytes()}
    return {"v": values}


class _Times:
    """Microseconds -> datetime, sharing one object per distinct value (many records share a timestamp)."""

    def __init__(self) -> None:
        self._cache: dict[int, datetime] = {}

    def get(self, micros: int) -> datetime:
        found = self._cache.get(micros)
        if found is None:
            found = self._cache[micros] = from_micros(micros)
        return found

    def many(self, values: list[int]) -> list[datetime | None]:
        """:meth:`get` of each value (``None`` for the missing marker), with the loops at C speed: new values
        become ``EPOCH + timedelta(0, 0, micros)`` through ``map``, exactly what :func:`from_micros` computes."""
        cache = self._cache
        new = [m for m in values if m not in cache and m != _NONE]
        if new:
            deltas = map(timedelta, repeat(0, len(new)), repeat(0, len(new)), new)
            cache.update(zip(new, map(_EPOCH.__add__, deltas), strict=True))
        cache.setdefault(_NONE, None)  # type: ignore[arg-type]
        return list(map(cache.__getitem__, values))

    def column(self, raw: bytes, n: int, optional: bool) -> tuple[list[datetime | None], npt.NDArray[np.int64]]:
        array = np.frombuffer(raw, dtype="<i8")
        if len(array) != n:
            raise ValueError("a time column has the wrong length")
        if n == 0:
            return [], array
        # One datetime per distinct value, then a C-level gather: far fewer Python calls than one per record.
        unique, inverse = np.unique(array, return_inverse=True)
        if not optional and len(unique) and int(unique[0]) == _NONE:
            raise ValueError("a required time is missing")
        table = self.many(unique.tolist())
        picked = itemgetter(*inverse.reshape(-1).tolist())(table)
        return ([picked] if n == 1 else list(picked)), array


def _maker(cls: type) -> Callable[..., Record]:
    """A constructor that sets every slot without re-running validation: the records were validated when they
    were stored, and the section they come from has just passed its checksum."""
    names = [f.name for f in dataclasses.fields(cls)]
    args = ", ".join(f"a{i}" for i in range(len(names)))
    body = "".join(f"    s(o, {name!r}, a{i})\n" for i, name in enumerate(names))
    source = f"def make({args}):\n    o = new(cls)\n{body}    return o\n"
    scope: dict[str, Any] = {"new": object.__new__, "s": object.__setattr__, "cls": cls}
    exec(source, scope)  # generated from the dataclass's own field names, nothing from the file
    return scope["make"]  # type: ignore[no-any-return]


@dataclasses.dataclass
class Contents:
    """What :func:`read` found: the records by kind (in store order), each kind's int64 time columns, the vectors
    as one matrix per kind with the records' vectors being rows of it, and the optional index sections.

    Iterating yields every record in dependency order (endpoints first), which is all a generic store needs;
    :func:`restore` hands the rest to a store that can use it. Call :meth:`close` (or let :func:`restore` do it)
    to delete the temporary index files."""

    records: dict[Kind, list[Record]]
    version: int = FORMAT_VERSION
    times: dict[Kind, dict[str, npt.NDArray[np.int64]]] = dataclasses.field(default_factory=dict)
    vectors: dict[Kind, tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]] = dataclasses.field(default_factory=dict)
    indexes: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[Record]:
        for kind in ORDER:
            yield from self.records.get(kind, ())

    def close(self) -> None:
        tmp = (self.indexes or {}).pop("_tmp", None)
        if tmp is not None:
            tmp.cleanup()


def _decode_kind(
    kind: Kind,
    payload: Any,
    matrix: npt.NDArray[np.float32] | None,
    times: _Times,
    refs: dict[str, str],
) -> tuple[list[Record], dict[str, npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
    cls = RECORD_TYPES[kind]
    n = int(payload["n"])
    raw = payload["columns"]
    columns: list[list[Any]] = []
    time_columns: dict[str, npt.NDArray[np.int64]] = {}
    vec_at = np.frombuffer(payload["vec_at"], dtype="<i8")
    for name, code in _field_codes(cls):
        if code == "vec":
            values: list[Any] = [None] * n
            if len(vec_at):
                if matrix is None or len(matrix) != len(vec_at) or int(vec_at.max()) >= n or int(vec_at.min()) < 0:
                    raise ValueError("the vectors do not match the records")
                if len(vec_at) == n and bool((vec_at == np.arange(n)).all()):
                    values = list(matrix)  # every record has one: the rows in order (C-level iteration)
                else:
                    for position, row in zip(vec_at.tolist(), matrix, strict=True):
                        values[position] = row
        elif code in ("dt", "dt?"):
            values, time_columns[name] = times.column(raw[name], n, code == "dt?")
        elif code == "tuple":
            values = (
                [tuple(map(refs.get, v, v)) for v in raw[name]] if name == "episodes" else list(map(tuple, raw[name]))
            )
        elif code == "map":
            values = [{} for _ in range(n)]
            for i, value in zip(raw[name]["at"], raw[name]["values"], strict=True):
                values[i] = _decode_value(value)
        else:
            column = raw[name]
            if "u" in column:
                table = column["u"]
                enum_type = _enum_of(cls, name)
                if enum_type is not None:
                    table = [enum_type(v) for v in table]
                if name in _REF_FIELDS:  # the same string object as the record's id (mapped once per value)
                    table = list(map(refs.get, table, table))
                values = list(map(table.__getitem__, np.frombuffer(column["c"], dtype="<i4").tolist()))
            else:
                values = list(column["v"])
                enum_type = _enum_of(cls, name)
                if enum_type is not None:
                    values = [enum_type(v) for v in values]
                if name in _REF_FIELDS:
                    values = list(map(refs.get, values, values))
        if len(values) != n:
            raise ValueError(f"column {name} has {len(values)} values for {n} records")
        columns.append(values)
    records = list(map(_maker(cls), *columns)) if n else []
    if kind in (Kind.EPISODE, Kind.ENTITY, Kind.COMMUNITY):
        for record in records:
            refs[record.id] = record.id  # later kinds point here: share the id strings
    return records, time_columns, vec_at


# --------------------------------------------------------------------------------------------------------------
# writing
class _Writer:
    """Appends checksummed sections to ``out``. Two helper threads keep the disk busy while Python works:
    one hashes a chunk while the next is written (hashlib and file writes release the GIL), and one flushes
    written sections to disk (``fdatasync``) while the next are encoded, so the final ``fsync`` has little left
    to wait for."""

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

    def section(self, name: str, chunks: Iterator[bytes | memoryview]) -> None:
        start, digest = self.offset, hashlib.sha256()
        hashing: Future[None] | None = None
        for chunk in chunks:
            if memoryview(chunk).nbytes < _THREAD_MIN:
                digest.update(chunk)
            else:
                if hashing is not None:
                    hashing.result()  # one chunk in flight at a time: bounded memory, sequential digest
                hashing = self._hasher.submit(digest.update, chunk)
            self.raw(chunk)
        if hashing is not None:
            hashing.result()
        self.sections.append({"name": name, "offset": start, "length": self.offset - start, "sha256": digest.digest()})
        if self._unsynced >= _SYNC_EVERY and (self._sync is None or self._sync.done()):
            if self._sync is not None:
                self._sync.result()  # surface a failed flush now
            self.out.flush()
            self._sync = self._syncer.submit(_datasync, self.out.fileno())
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


def _file_chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def _vector_chunks(vectors: list[npt.NDArray[np.float32]]) -> Iterator[bytes]:
    for start in range(0, len(vectors), _VECTOR_ROWS):
        yield np.stack(vectors[start : start + _VECTOR_ROWS]).astype("<f4", copy=False).tobytes()


def _gathered_chunks(
    rows: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float32]],
    slots: npt.NDArray[np.int64],
    vectors: list[npt.NDArray[np.float32]],
) -> Iterator[memoryview]:
    """The vectors of ``slots`` gathered by the store's index (a few C-level copies instead of stacking a list
    of rows), checked against the records' own vectors at the start and end of each chunk."""
    for start in range(0, len(slots), _VECTOR_ROWS):
        block = np.ascontiguousarray(rows(slots[start : start + _VECTOR_ROWS]), dtype="<f4")
        for i in (0, len(block) - 1):
            if not np.array_equal(block[i], vectors[start + i]):
                raise SnapshotError("the store's vector index disagrees with its records; cannot save")
        yield memoryview(block).cast("B")  # type: ignore[arg-type]


def _byte_chunks(data: bytes | npt.NDArray[Any]) -> Iterator[bytes | memoryview]:
    """A section's bytes: an array is written from its own memory, a chunk at a time (no whole copy)."""
    if isinstance(data, bytes):
        yield data
        return
    flat = memoryview(np.ascontiguousarray(data)).cast("B")  # type: ignore[arg-type]
    for start in range(0, len(flat), _CHUNK):
        yield flat[start : start + _CHUNK]


def _pack(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise SnapshotError(
            f"cannot encode the memory (an attribute value is not serialisable, or an integer wider than 64 "
            f"bits?): {exc}"
        ) from None


def _array(value: npt.NDArray[Any]) -> dict[str, Any]:
    return {"dtype": value.dtype.str, "shape": list(value.shape), "data": np.ascontiguousarray(value).tobytes()}


def _unarray(value: Any) -> npt.NDArray[Any]:
    dtype = np.dtype(value["dtype"])
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed")
    return np.frombuffer(value["data"], dtype=dtype).reshape(value["shape"])


def _time_column(code: str, values: list[Any], given: npt.NDArray[np.int64] | None) -> bytes:
    """A time column: the store's own int64 column when it exported one of the right length (no per-record
    conversion), else computed from the records."""
    if given is not None and len(given) == len(values):
        return np.ascontiguousarray(given, dtype="<i8").tobytes()
    return _encode_column(code, values)  # type: ignore[no-any-return]


def _graph_sections(kind: Kind, state: Mapping[str, Any]) -> dict[str, bytes | npt.NDArray[Any]]:
    """The two sections of one exported HNSW graph: its parameters and small arrays, and its element block."""
    small = {k: _array(v) for k, v in state.items() if isinstance(v, np.ndarray) and k != "level0"}
    return {
        f"hnsw/{kind.value}": _pack({"params": dict(state["params"]), **small}),
        f"hnswdata/{kind.value}": np.ascontiguousarray(state["level0"]),
    }


def save(store: Store, path: str | os.PathLike[str], meta: Mapping[str, Any]) -> int:
    """Write every record of ``store`` (and its indexes, if it can export them) to ``path`` atomically; returns
    the file size in bytes."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise SnapshotError(f"cannot save to {target}: directory {directory} does not exist")
    with _no_gc():  # millions of short-lived lists: none of them cyclic garbage
        return _save(store, target, directory, meta)


def _save(store: Store, target: Path, directory: Path, meta: Mapping[str, Any]) -> int:
    export: Callable[[], dict[str, Any]] | None = getattr(store, "export_snapshot", None)
    indexes = export() if export is not None else None
    # Each section is written as soon as it is encoded (the disk works while the next one is encoded). A value
    # that cannot be encoded stops the save with the temporary file deleted: the target is never touched.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            writer = _Writer(out)
            try:
                writer.raw(MAGIC + _VERSION.pack(FORMAT_VERSION))
                for kind in ORDER:
                    payload, chunks = _encode_kind(store, kind, indexes)
                    writer.section(f"records/{kind.value}", iter([payload]))
                    del payload
                    writer.section(f"vectors/{kind.value}", chunks)
                for name, data in _index_sections(indexes):
                    writer.section(name, _byte_chunks(data))
                table = _pack({"meta": dict(meta), "dim": store.dim, "sections": writer.sections})
                table_offset = writer.offset
                writer.raw(table)
                writer.raw(_TRAILER.pack(table_offset, len(table), hashlib.sha256(table).digest()))
                writer.finish()
            finally:
                writer.close()
            size = writer.offset
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return size


def _encode_kind(
    store: Store, kind: Kind, indexes: dict[str, Any] | None
) -> tuple[bytes, Iterator[bytes | memoryview]]:
    """One kind's records section (columns, msgpack) and the chunks of its vectors section."""
    records = list(store.scan(kind))
    cls = RECORD_TYPES[kind]
    columns: dict[str, Any] = {}
    chunks: Iterator[bytes | memoryview] = iter(())
    vec_at = np.zeros(0, dtype="<i8")
    given_times = (indexes or {}).get("times", {}).get(kind, {})
    for name, code in _field_codes(cls):
        values = list(map(attrgetter(name), records))
        if code == "vec":
            at = [i for i, v in enumerate(values) if v is not None]
            vec_at = np.asarray(at, dtype="<i8")
            rows = (indexes or {}).get("rows", {}).get(kind)
            slots = (indexes or {}).get("slots", {}).get(kind)
            if rows is not None and slots is not None and len(slots) == len(records):
                chunks = _gathered_chunks(rows, np.asarray(slots)[vec_at], [values[i] for i in at])
            else:
                chunks = _vector_chunks([values[i] for i in at])
        elif code in ("dt", "dt?"):
            columns[name] = _time_column(code, values, given_times.get(name))
        else:
            columns[name] = _encode_column(code, values)
    return _pack({"n": len(records), "columns": columns, "vec_at": vec_at.tobytes()}), chunks


def _index_sections(indexes: dict[str, Any] | None) -> Iterator[tuple[str, bytes | npt.NDArray[Any]]]:
    if indexes is None:
        return
    for kind, slots in indexes.get("slots", {}).items():
        yield f"slots/{Kind(kind).value}", np.asarray(slots, dtype="<i8")
    for kind, scales in indexes.get("scales", {}).items():
        yield f"scale/{Kind(kind).value}", np.asarray(scales, dtype="<f4")
    for kind, state in indexes.get("text", {}).items():
        packed = {k: (_array(v) if isinstance(v, np.ndarray) else v) for k, v in state.items()}
        yield f"bm25/{Kind(kind).value}", _pack(packed)
    for kind, state in indexes.get("graphs", {}).items():
        yield from _graph_sections(Kind(kind), state).items()


# --------------------------------------------------------------------------------------------------------------
# reading
def read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Contents]:
    """Check and decode a snapshot file: its meta map, and its contents (iterable as records in dependency
    order). Every section's checksum is verified before its contents are used."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below on every path
    except FileNotFoundError:
        raise SnapshotError(f"snapshot {path} does not exist") from None
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None
    with f:
        try:
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
            if version == 1:
                f.seek(0)
                return _read_v1(path, f.read())
            if version not in (2, 3):
                raise SnapshotFormatError(f"{path} has an unknown snapshot format {version}")
            with _no_gc(settle=True):
                return _read_v2(path, f, version)
        except OSError as exc:
            raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None


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


def _read_v2(path: str | os.PathLike[str], f: IO[bytes], version: int) -> tuple[dict[str, Any], Contents]:
    """Formats 2 and 3 (they differ only in how the HNSW graphs are stored)."""
    start = len(MAGIC) + _VERSION.size
    size = f.seek(0, os.SEEK_END)
    if size < start + _TRAILER.size:
        raise SnapshotFormatError(f"{path} is truncated (no table of contents)")
    f.seek(size - _TRAILER.size)
    table_offset, table_length, digest = _TRAILER.unpack(f.read(_TRAILER.size))
    if table_offset < start or table_offset + table_length != size - _TRAILER.size:
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

    def load(name: str, into: npt.NDArray[Any] | None = None, check: bool = True) -> bytes | npt.NDArray[Any]:
        """A section's bytes (into ``into`` if given), its checksum verified unless ``check`` is false (the
        caller then verifies it with :func:`verify` before using it)."""
        offset, length, _ = places[name]
        f.seek(offset)
        if into is None:
            data: bytes | npt.NDArray[Any] = f.read(length)
            view = memoryview(data)  # type: ignore[arg-type]
        else:
            view = memoryview(into).cast("B")  # type: ignore[arg-type]
            if view.nbytes != length or f.readinto(view) != length:  # type: ignore[attr-defined]
                raise SnapshotFormatError(f"{path} is corrupt: section {name} has the wrong length")
            data = into
        if len(view) != length:
            raise SnapshotFormatError(f"{path} is truncated (section {name})")
        if check:
            verify(name, hashlib.sha256(view).digest())
        return data

    def verify(name: str, digest: bytes) -> None:
        if digest != places[name][2]:
            raise SnapshotFormatError(f"{path} is corrupt (checksum mismatch in section {name})")

    contents = Contents(records={}, version=version)
    times = _Times()
    refs: dict[str, str] = {}
    # The (big) vectors sections are read and hashed on a helper thread, all of them queued at once, while the
    # records, whose sections are verified as they are loaded, are decoded here: the records only need the
    # matrices' shapes (they hold read-only views of the rows). Nothing is returned before every digest matches.
    reader = ThreadPoolExecutor(1, thread_name_prefix="tkg-snapshot-read")
    fetching: dict[Kind, tuple[str, Future[bytes], npt.NDArray[np.float32]]] = {}
    try:
        for kind in ORDER:
            vec_name = f"vectors/{kind.value}"
            if f"records/{kind.value}" in places and vec_name in places and places[vec_name][1]:
                offset, length, _ = places[vec_name]
                rows = length // (4 * dim)
                if rows * 4 * dim != length:
                    raise SnapshotFormatError(f"{path} is corrupt: section {vec_name} is not whole vectors")
                buffer = np.empty((rows, dim), dtype="<f4")
                job = reader.submit(_read_into, f, path, buffer, offset, f"{path} (section {vec_name})")
                readable = buffer.view()
                readable.setflags(write=False)
                fetching[kind] = (vec_name, job, readable)
        for kind in ORDER:
            name = f"records/{kind.value}"
            if name not in places:
                continue
            payload = msgpack.unpackb(load(name), raw=False, strict_map_key=False)
            fetched = fetching.get(kind)
            matrix = fetched[2] if fetched is not None else None
            records, time_columns, vec_at = _decode_kind(kind, payload, matrix, times, refs)
            contents.records[kind] = records
            contents.times[kind] = time_columns
            if matrix is not None:
                contents.vectors[kind] = (vec_at, matrix)  # type: ignore[assignment]
        for vec_name, job, _ in fetching.values():
            verify(vec_name, job.result())
        contents.indexes = _read_indexes(path, places, load, version)
    except SnapshotError:
        contents.close()
        raise
    except TkgError as exc:
        contents.close()
        raise SnapshotFormatError(f"{path} holds an invalid record: {exc}") from None
    except Exception as exc:  # malformed columns: wrong types, lengths, codes
        contents.close()
        raise SnapshotFormatError(f"{path} is corrupt: {exc!r}") from None
    finally:
        reader.shutdown(wait=True, cancel_futures=True)
    return meta, contents


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


def _read_indexes(
    path: str | os.PathLike[str],
    places: dict[str, tuple[int, int, bytes]],
    load: Callable[..., Any],
    version: int,
) -> dict[str, Any] | None:
    names = [n for n in places if n.split("/", 1)[0] in ("slots", "scale", "hnsw", "bm25")]
    if not names:
        return None
    indexes: dict[str, Any] = {"slots": {}, "scales": {}, "graphs": {}, "text": {}, "_tmp": None}
    for name in names:
        part, kind_name = name.split("/", 1)
        kind = Kind(kind_name)
        if part == "slots":
            indexes["slots"][kind] = np.frombuffer(load(name), dtype="<i8")
        elif part == "scale":
            indexes["scales"][kind] = np.frombuffer(load(name), dtype="<f4")
        elif part == "bm25":
            state = msgpack.unpackb(load(name), raw=False, strict_map_key=False)
            indexes["text"][kind] = {
                k: (_unarray(v) if isinstance(v, dict) and "dtype" in v else v) for k, v in state.items()
            }
        elif part == "hnsw" and version >= 3:
            state = msgpack.unpackb(load(name), raw=False, strict_map_key=False)
            graph = {k: (_unarray(v) if isinstance(v, dict) and "dtype" in v else v) for k, v in state.items()}
            data_name = f"hnswdata/{kind_name}"
            if data_name in places:  # without it the graph is rebuilt (the store finds the state incomplete)
                graph["level0"] = load(data_name, np.empty(places[data_name][1], dtype=np.uint8))
            indexes["graphs"][kind] = graph
    graphs = [n for n in names if n.startswith("hnsw/")] if version == 2 else []
    if graphs:
        # hnswlib loads from a path: copy each graph next to the snapshot, checking its digest on the way.
        try:
            tmp = tempfile.TemporaryDirectory(prefix=".tkg-load.", dir=Path(path).parent)
        except OSError:
            tmp = tempfile.TemporaryDirectory(prefix="tkg-load.")
        indexes["_tmp"] = tmp
        for name in graphs:
            offset, length, expected = places[name]
            target = Path(tmp.name) / name.replace("/", "-")
            digest = hashlib.sha256()
            with open(path, "rb") as src, open(target, "wb") as dst:
                src.seek(offset)
                left = length
                while left:
                    chunk = src.read(min(_CHUNK, left))
                    if not chunk:
                        raise SnapshotFormatError(f"{path} is truncated (section {name})")
                    digest.update(chunk)
                    dst.write(chunk)
                    left -= len(chunk)
            if digest.digest() != expected:
                tmp.cleanup()
                raise SnapshotFormatError(f"{path} is corrupt (checksum mismatch in section {name})")
            indexes["graphs"][Kind(name.split("/", 1)[1])] = str(target)
    return indexes


def _read_v1(path: str | os.PathLike[str], data: bytes) -> tuple[dict[str, Any], Contents]:
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
        meta, records = body["meta"], body["records"]
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise SnapshotFormatError(f"{path} is corrupt: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(records, dict):
        raise SnapshotFormatError(f"{path} is corrupt: unexpected payload structure")
    decoded: dict[Kind, list[Record]] = {}
    for kind in ORDER:
        out = decoded.setdefault(kind, [])
        for item in records.get(kind.value, []):
            try:
                out.append(decode_record(kind, item))
            except TkgError as exc:
                raise SnapshotFormatError(f"{path} holds an invalid {kind} record: {exc}") from None
            except Exception as exc:
                raise SnapshotFormatError(f"{path} holds a malformed {kind} record: {exc!r}") from None
    return meta, Contents(records=decoded, version=1)


def write_v1(store: Store, path: str | os.PathLike[str], meta: Mapping[str, Any]) -> int:
    """Write a format-1 snapshot (records only). Kept so tests can check that old files still load."""
    records = {kind.value: [encode_record(r) for r in store.scan(kind)] for kind in Kind}
    payload = _pack({"meta": dict(meta), "records": records})
    header = MAGIC + _HEADER.pack(1, len(payload), hashlib.sha256(payload).digest())
    Path(path).write_bytes(header + payload)
    return len(header) + len(payload)


# --------------------------------------------------------------------------------------------------------------
def restore(store: Store, contents: Contents) -> dict[str, Any]:
    """Put what :func:`read` found into an empty ``store``: through its ``restore_snapshot`` hook when it has one
    (which reuses the saved indexes), else its bulk ``load``, else one write. Returns the hook's report (which
    indexes were loaded and which rebuilt), or an empty map. Deletes the temporary index files."""
    try:
        hook = getattr(store, "restore_snapshot", None)
        if hook is not None:
            with _no_gc(settle=True):
                return hook(contents)  # type: ignore[no-any-return]
        records = list(contents)
        loader = getattr(store, "load", None)
        if loader is not None:
            loader(records)
        else:
            store.write(WriteBatch(puts=records))
        return {}
    finally:
        contents.close()


__all__ = ["FORMAT_VERSION", "MAGIC", "Contents", "read", "restore", "save"]
