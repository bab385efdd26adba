"""Snapshots: a whole memory in one file, written atomically, read defensively.

Format 2 (written now) is a sequence of checksummed sections followed by a table of contents::

    magic (8 bytes) | format version (u16, big-endian) | section ... | table (msgpack) | trailer

The trailer (big-endian u64 table offset, u64 table length, sha256 of the table) is the file's last 48 bytes; the
table holds the caller's ``meta`` and, for each section, its name, offset, length and sha256. Sections:

* ``records/<kind>`` -- every record of a kind, column by column (msgpack): datetimes as little-endian int64
  microseconds since the epoch (UTC), repeated strings dictionary-encoded, vectors left out;
* ``vectors/<kind>`` -- the vectors of those records that have one, as one little-endian float32 matrix;
* optional index sections, written by a store that offers ``export_snapshot`` (the in-memory backend):
  ``slots/<kind>`` (each record's slot), ``hnsw/<kind>`` (hnswlib's own index file) and ``bm25/<kind>``, so that a
  load restores the indexes instead of rebuilding them. A store without that hook, or a snapshot without those
  sections, rebuilds them; an index section that does not fit the records is dropped and rebuilt, never used.

Format 1 (one msgpack payload of row records after a fixed header) is still read; its indexes are rebuilt.

A save goes to a temporary file in the same directory, is fsynced, then renamed over the target, so a crash
leaves the previous snapshot intact. A load checks magic, version, table and every section's checksum before
decoding anything, and builds a new store; nothing existing is touched if any check fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import os
import struct
import tempfile
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from operator import attrgetter
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
FORMAT_VERSION = 2
_HEADER = struct.Struct(">HQ32s")  # format 1: version, payload length, sha256 of the payload
_VERSION = struct.Struct(">H")
_TRAILER = struct.Struct(">QQ32s")  # format 2: table offset, table length, sha256 of the table
_DT = "__dt__"
_NONE = np.iinfo(np.int64).min  # an absent optional datetime in an int64 column
_CHUNK = 16 << 20  # bytes copied / hashed at a time
_VECTOR_ROWS = 16384  # vectors stacked at a time while writing
#: Dependency order: endpoints before the edges that point to them.
ORDER = (Kind.EPISODE, Kind.ENTITY, Kind.COMMUNITY, Kind.FACT, Kind.MENTION, Kind.MEMBERSHIP)
_REF_FIELDS = frozenset({"source_id", "target_id", "episode_id", "entity_id", "community_id", "invalidated_by"})


# --------------------------------------------------------------------------------------------------------------
# format 1 rows (still read; also the codec of nested attribute values)
def _encode_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return {_DT: to_micros(value)}
    if isinstance(value, np.ndarray):
        return value.astype("<f4").tobytes()
    if isinstance(value, tuple):
        return [_encode_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _encode_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encode_value(v) for v in value]
    if hasattr(value, "value") and isinstance(getattr(value, "value", None), str):  # StrEnum
        return value.value
    return value


def encode_record(record: Record) -> dict[str, Any]:
    return {f.name: _encode_value(getattr(record, f.name)) for f in dataclasses.fields(record)}


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and _DT in value:
            return from_micros(value[_DT])
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
        return [list(v) for v in values]
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

    def column(self, raw: bytes, n: int, optional: bool) -> tuple[list[datetime | None], npt.NDArray[np.int64]]:
        array = np.frombuffer(raw, dtype="<i8")
        if len(array) != n:
            raise ValueError("a time column has the wrong length")
        get = self.get
        if optional:
            return [None if m == _NONE else get(m) for m in array.tolist()], array
        return [get(m) for m in array.tolist()], array


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
                for position, row in zip(vec_at.tolist(), matrix, strict=True):
                    values[position] = row
        elif code in ("dt", "dt?"):
            values, time_columns[name] = times.column(raw[name], n, code == "dt?")
        elif code == "tuple":
            values = (
                [tuple(refs.get(x, x) for x in v) for v in raw[name]]
                if name == "episodes"
                else [tuple(v) for v in raw[name]]
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
                values = [table[c] for c in np.frombuffer(column["c"], dtype="<i4").tolist()]
            else:
                values = list(column["v"])
                enum_type = _enum_of(cls, name)
                if enum_type is not None:
                    values = [enum_type(v) for v in values]
            if name in _REF_FIELDS:
                values = [refs.get(v, v) if v is not None else None for v in values]
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
    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.offset = 0
        self.sections: list[dict[str, Any]] = []

    def raw(self, data: bytes) -> None:
        self.out.write(data)
        self.offset += len(data)

    def section(self, name: str, chunks: Iterator[bytes | memoryview]) -> None:
        start, digest = self.offset, hashlib.sha256()
        for chunk in chunks:
            digest.update(chunk)
            self.raw(bytes(chunk) if not isinstance(chunk, bytes) else chunk)
        self.sections.append({"name": name, "offset": start, "length": self.offset - start, "sha256": digest.digest()})


def _file_chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def _vector_chunks(vectors: list[npt.NDArray[np.float32]]) -> Iterator[bytes]:
    for start in range(0, len(vectors), _VECTOR_ROWS):
        yield np.stack(vectors[start : start + _VECTOR_ROWS]).astype("<f4", copy=False).tobytes()


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


def save(store: Store, path: str | os.PathLike[str], meta: Mapping[str, Any]) -> int:
    """Write every record of ``store`` (and its indexes, if it can export them) to ``path`` atomically; returns
    the file size in bytes."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise SnapshotError(f"cannot save to {target}: directory {directory} does not exist")
    # Encode every record section before the file is created, so that an unserialisable value changes nothing.
    encoded: dict[Kind, tuple[bytes, list[npt.NDArray[np.float32]]]] = {}
    for kind in ORDER:
        records = list(store.scan(kind))
        cls = RECORD_TYPES[kind]
        columns: dict[str, Any] = {}
        vectors: list[npt.NDArray[np.float32]] = []
        vec_at = np.zeros(0, dtype="<i8")
        for name, code in _field_codes(cls):
            values = list(map(attrgetter(name), records))
            if code == "vec":
                at = [i for i, v in enumerate(values) if v is not None]
                vectors = [values[i] for i in at]
                vec_at = np.asarray(at, dtype="<i8")
            else:
                columns[name] = _encode_column(code, values)
        encoded[kind] = (_pack({"n": len(records), "columns": columns, "vec_at": vec_at.tobytes()}), vectors)
        del records
    export: Callable[[Path], dict[str, Any]] | None = getattr(store, "export_snapshot", None)
    with tempfile.TemporaryDirectory(prefix=f".{target.name}.", dir=directory) as scratch:
        indexes = export(Path(scratch)) if export is not None else None
        extra: dict[str, bytes] = {}
        if indexes is not None:
            for kind, slots in indexes.get("slots", {}).items():
                extra[f"slots/{Kind(kind).value}"] = np.asarray(slots, dtype="<i8").tobytes()
            for kind, state in indexes.get("text", {}).items():
                packed = {k: (_array(v) if isinstance(v, np.ndarray) else v) for k, v in state.items()}
                extra[f"bm25/{Kind(kind).value}"] = _pack(packed)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as out:
                writer = _Writer(out)
                writer.raw(MAGIC + _VERSION.pack(FORMAT_VERSION))
                for kind, (payload, vectors) in encoded.items():
                    writer.section(f"records/{kind.value}", iter([payload]))
                    writer.section(f"vectors/{kind.value}", _vector_chunks(vectors))
                for name, data in extra.items():
                    writer.section(name, iter([data]))
                for kind, graph in (indexes or {}).get("graphs", {}).items():
                    writer.section(f"hnsw/{Kind(kind).value}", _file_chunks(graph))
                table = _pack({"meta": dict(meta), "dim": store.dim, "sections": writer.sections})
                table_offset = writer.offset
                writer.raw(table)
                writer.raw(_TRAILER.pack(table_offset, len(table), hashlib.sha256(table).digest()))
                out.flush()
                os.fsync(out.fileno())
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


# --------------------------------------------------------------------------------------------------------------
# reading
def read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Contents]:
    """Check and decode a snapshot file: its meta map, and its contents (iterable as records in dependency
    order). Every checksum is verified before anything is decoded."""
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
            if version != FORMAT_VERSION:
                raise SnapshotFormatError(f"{path} has an unknown snapshot format {version}")
            return _read_v2(path, f)
        except OSError as exc:
            raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None


def _read_v2(path: str | os.PathLike[str], f: IO[bytes]) -> tuple[dict[str, Any], Contents]:
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

    def load(name: str, into: npt.NDArray[Any] | None = None) -> bytes | npt.NDArray[Any]:
        offset, length, expected = places[name]
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
        if hashlib.sha256(view).digest() != expected:
            raise SnapshotFormatError(f"{path} is corrupt (checksum mismatch in section {name})")
        return data

    contents = Contents(records={})
    times = _Times()
    refs: dict[str, str] = {}
    try:
        for kind in ORDER:
            name = f"records/{kind.value}"
            if name not in places:
                continue
            payload = msgpack.unpackb(load(name), raw=False, strict_map_key=False)
            matrix = None
            vec_name = f"vectors/{kind.value}"
            if vec_name in places and places[vec_name][1]:
                rows = places[vec_name][1] // (4 * dim)
                if rows * 4 * dim != places[vec_name][1]:
                    raise SnapshotFormatError(f"{path} is corrupt: section {vec_name} is not whole vectors")
                matrix = load(vec_name, np.empty((rows, dim), dtype="<f4"))
                matrix.setflags(write=False)  # type: ignore[union-attr]
            records, time_columns, vec_at = _decode_kind(kind, payload, matrix, times, refs)  # type: ignore[arg-type]
            contents.records[kind] = records
            contents.times[kind] = time_columns
            if matrix is not None:
                contents.vectors[kind] = (vec_at, matrix)  # type: ignore[assignment]
        contents.indexes = _read_indexes(path, places, load, table_offset)
    except SnapshotError:
        contents.close()
        raise
    except TkgError as exc:
        contents.close()
        raise SnapshotFormatError(f"{path} holds an invalid record: {exc}") from None
    except Exception as exc:  # malformed columns: wrong types, lengths, codes
        contents.close()
        raise SnapshotFormatError(f"{path} is corrupt: {exc!r}") from None
    return meta, contents


def _read_indexes(
    path: str | os.PathLike[str],
    places: dict[str, tuple[int, int, bytes]],
    load: Callable[..., Any],
    table_offset: int,
) -> dict[str, Any] | None:
    names = [n for n in places if n.split("/", 1)[0] in ("slots", "hnsw", "bm25")]
    if not names:
        return None
    indexes: dict[str, Any] = {"slots": {}, "graphs": {}, "text": {}, "_tmp": None}
    for name in names:
        part, kind_name = name.split("/", 1)
        kind = Kind(kind_name)
        if part == "slots":
            indexes["slots"][kind] = np.frombuffer(load(name), dtype="<i8")
        elif part == "bm25":
            state = msgpack.unpackb(load(name), raw=False, strict_map_key=False)
            indexes["text"][kind] = {
                k: (_unarray(v) if isinstance(v, dict) and "dtype" in v else v) for k, v in state.items()
            }
    graphs = [n for n in names if n.startswith("hnsw/")]
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
