"""The record codec: tkg records and their attribute values as plain data, for every persistence format.

One set of rules, used by snapshots (msgpack), the write-ahead journal and PostgreSQL (JSON):

* values: a datetime is ``{"__dt__": microseconds since the epoch, UTC}``; in JSON, bytes are
  ``{"__bytes__": base64}`` and a non-finite float ``{"__float__": "nan"}`` (msgpack holds both natively); a
  user's map whose one key is one of these tags is wrapped as ``{"__map__": ...}``, so it never reads back as a
  tagged value (:func:`encode_value`, :func:`decode_value`);
* rows: a record as a map of its fields (:func:`encode_record`, :func:`decode_record`), vectors as little-endian
  float32 bytes;
* columns: the records of one kind column by column (:func:`encode_columns`, :func:`decode_columns`), the
  snapshot's compact form: times as little-endian int64 microseconds (an absent optional time is int64 min),
  repeated strings dictionary-encoded, vectors left out (the snapshot stores them as one matrix).
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from tkg import models
from tkg.models import RECORD_TYPES, VECTOR_FIELD, Kind, Record
from tkg.timeutil import from_micros, to_micros

DT_TAG = "__dt__"
BYTES_TAG = "__bytes__"
FLOAT_TAG = "__float__"
MAP_TAG = "__map__"
TAGS = frozenset({DT_TAG, BYTES_TAG, FLOAT_TAG, MAP_TAG})
#: An absent optional datetime in an int64 time column.
NO_TIME = int(np.iinfo(np.int64).min)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # as in tkg.timeutil.from_micros
_VECTOR_FIELDS = frozenset(VECTOR_FIELD.values())
_TUPLE_FIELDS = frozenset({"labels", "aliases", "episodes"})
#: Fields holding another record's id: decoded to the very string object of that id (memory is shared).
_REF_FIELDS = frozenset({"source_id", "target_id", "episode_id", "entity_id", "community_id", "invalidated_by"})


# -- values -----------------------------------------------------------------------------------------------------
def encode_value(value: Any, *, json: bool = False) -> Any:
    """``value`` as plain data (see the module docstring); ``json`` also tags bytes and non-finite floats."""
    if isinstance(value, datetime):
        return {DT_TAG: to_micros(value)}
    if isinstance(value, np.ndarray):
        value = value.astype("<f4").tobytes()
    if isinstance(value, bytes | bytearray):
        return {BYTES_TAG: base64.b64encode(value).decode()} if json else bytes(value)
    if json and isinstance(value, float) and not math.isfinite(value):
        return {FLOAT_TAG: repr(value)}
    if isinstance(value, Mapping):
        encoded = {str(k): encode_value(v, json=json) for k, v in value.items()}
        return {MAP_TAG: encoded} if len(encoded) == 1 and next(iter(encoded)) in TAGS else encoded
    if isinstance(value, list | tuple):
        return [encode_value(v, json=json) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def decode_value(value: Any, *, json: bool = False) -> Any:
    """The inverse of :func:`encode_value` (with the same ``json``)."""
    if isinstance(value, dict):
        if all(type(v) is str for v in value.values()) and not (len(value) == 1 and next(iter(value)) in TAGS):
            return value  # a flat map of strings (a fact's verdicts, most attributes): nothing to decode
        if len(value) == 1:
            tag, inner = next(iter(value.items()))
            if tag == DT_TAG:
                return from_micros(inner)
            if tag == MAP_TAG:
                return {k: decode_value(v, json=json) for k, v in inner.items()}
            if json and tag == FLOAT_TAG:
                return float(inner)
            if json and tag == BYTES_TAG:
                return base64.b64decode(inner)
        return {k: decode_value(v, json=json) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_value(v, json=json) for v in value]
    return value


# -- rows -------------------------------------------------------------------------------------------------------
def encode_record(record: Record, *, json: bool = False) -> dict[str, Any]:
    """A record as a map of its fields (vectors as float32 bytes; ``json``: as in :func:`encode_value`)."""
    return {f.name: encode_value(getattr(record, f.name), json=json) for f in dataclasses.fields(record)}


def decode_record(kind: Kind, data: Mapping[str, Any], *, json: bool = False) -> Record:
    """The record of :func:`encode_record`'s map (validated, as any new record)."""
    fields: dict[str, Any] = {}
    for name, value in data.items():
        if name in _VECTOR_FIELDS and value is not None:
            raw = decode_value(value, json=True) if json else value
            fields[name] = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        elif name in _TUPLE_FIELDS:
            fields[name] = tuple(value)
        else:
            fields[name] = decode_value(value, json=json)
    return RECORD_TYPES[Kind(kind)](**fields)


# -- columns ----------------------------------------------------------------------------------------------------
def field_codes(cls: type) -> list[tuple[str, str]]:
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


def _annotation(cls: type, name: str) -> str:
    return str(next(f.type for f in dataclasses.fields(cls) if f.name == name)).replace(" ", "")


def _model_enum(name: str) -> type[enum.Enum] | None:
    found = getattr(models, name, None)
    return found if isinstance(found, type) and issubclass(found, enum.Enum) else None


def _enum_of(cls: type, name: str) -> type[enum.Enum] | None:
    return _model_enum(_annotation(cls, name))


def enum_fields(cls: type) -> dict[str, tuple[str, dict[str, enum.Enum]]]:
    """The fields of a record type that hold members of a model enum -- as their value (``val``) or as the values
    of a map (``map``) -- with the members by value."""
    out: dict[str, tuple[str, dict[str, enum.Enum]]] = {}
    for name, code in field_codes(cls):
        if code == "val" and (found := _enum_of(cls, name)) is not None:
            out[name] = (code, {m.value: m for m in found})
        elif code == "map" and (members := _map_members(cls, name)) is not None:
            out[name] = (code, members)
    return out


def _map_members(cls: type, name: str) -> dict[str, enum.Enum] | None:
    """For a map field whose values are an enum of the models (a fact's verdicts), the members by value."""
    found = _model_enum(_annotation(cls, name).rstrip("]").rpartition(",")[2])
    return None if found is None else {m.value: m for m in found}


def enum_map(value: Any, members: Mapping[str, enum.Enum], name: str) -> dict[str, enum.Enum]:
    """A stored map of enum values (as :func:`encode_value` wrote it) as the record holds it: the members
    themselves (the fast record constructor skips the model's own conversion, and code compares verdicts by
    identity)."""
    if isinstance(value, dict) and len(value) == 1 and MAP_TAG in value:
        value = value[MAP_TAG]  # one key that is itself a tag (a fact id may be "__map__"): wrapped when written
    try:
        return {str(k): members[v] for k, v in value.items()}
    except (KeyError, TypeError, AttributeError):
        raise ValueError(f"column {name} holds a value that is not one of {', '.join(members)}") from None


def encode_time_column(code: str, values: Sequence[datetime | None]) -> bytes:
    if code == "dt":
        return np.fromiter(map(to_micros, values), dtype="<i8", count=len(values)).tobytes()  # type: ignore[arg-type]
    return np.fromiter((NO_TIME if v is None else to_micros(v) for v in values), "<i8", len(values)).tobytes()


def _encode_column(code: str, values: list[Any]) -> Any:
    if code in ("dt", "dt?"):
        return encode_time_column(code, values)
    if code == "tuple":
        return values  # msgpack writes tuples as arrays
    if code == "map":
        at = [i for i, v in enumerate(values) if v]
        return {"at": at, "values": [encode_value(values[i]) for i in at]}
    if values and isinstance(values[0], enum.Enum):
        values = [v.value for v in values]
    unique = dict.fromkeys(values)
    if len(unique) <= max(1, len(values) // 2):  # repeated values (groups, relations, labels): codes + table
        codes = {v: i for i, v in enumerate(unique)}
        return {"u": list(unique), "c": np.fromiter(map(codes.__getitem__, values), "<i4", len(values)).tobytes()}
    return {"v": values}


def encode_columns(
    kind: Kind,
    records: Sequence[Record] | Callable[[str], list[Any]],
    times: Mapping[str, npt.NDArray[np.int64]] | None = None,
) -> tuple[dict[str, Any], npt.NDArray[np.int64], list[npt.NDArray[np.float32]]]:
    """One kind's records as columns: the payload map (``n``, ``columns``, ``vec_at``), the positions of the
    records that have a vector, and those vectors. ``records`` are the records, or a function from a field name to
    its values in record order (a store's own columns). ``times`` are time columns the caller already holds (int64
    microseconds in record order, absent as :data:`NO_TIME`), used instead of converting record by record."""
    if callable(records):
        field_values = records
    else:
        held = records
        field_values = lambda name: list(map(attrgetter(name), held))  # noqa: E731
    columns: dict[str, Any] = {}
    vec_at = np.zeros(0, dtype="<i8")
    vectors: list[npt.NDArray[np.float32]] = []
    n = 0
    for name, code in field_codes(RECORD_TYPES[kind]):
        values = field_values(name)
        n = len(values)
        if code == "vec":
            at = [i for i, v in enumerate(values) if v is not None]
            vec_at = np.asarray(at, dtype="<i8")
            vectors = [values[i] for i in at]
        elif code in ("dt", "dt?") and times is not None and len(times.get(name, ())) == len(values):
            columns[name] = np.ascontiguousarray(times[name], dtype="<i8").tobytes()
        else:
            columns[name] = _encode_column(code, values)
    return {"n": n, "columns": columns, "vec_at": vec_at.tobytes()}, vec_at, vectors


class TimeCache:
    """Microseconds -> datetime, sharing one object per distinct value (many records share a timestamp)."""

    def __init__(self) -> None:
        self._cache: dict[int, datetime] = {}

    def many(self, values: list[int]) -> list[datetime | None]:
        """The datetime of each value (``None`` for :data:`NO_TIME`), with the loops at C speed: new values become
        ``EPOCH + timedelta(0, 0, micros)`` through ``map``, exactly what :func:`tkg.timeutil.from_micros` does."""
        cache = self._cache
        new = [m for m in values if m not in cache and m != NO_TIME]
        if new:
            deltas = map(timedelta, repeat(0, len(new)), repeat(0, len(new)), new)
            cache.update(zip(new, map(_EPOCH.__add__, deltas), strict=True))
        cache.setdefault(NO_TIME, None)  # type: ignore[arg-type]
        return list(map(cache.__getitem__, values))

    def column(self, raw: bytes, n: int, optional: bool) -> tuple[list[datetime | None], npt.NDArray[np.int64]]:
        array = np.frombuffer(raw, dtype="<i8")
        if len(array) != n:
            raise ValueError("a time column has the wrong length")
        if n == 0:
            return [], array
        # One datetime per distinct value, then a C-level gather: far fewer Python calls than one per record.
        unique, inverse = np.unique(array, return_inverse=True)
        if not optional and len(unique) and int(unique[0]) == NO_TIME:
            raise ValueError("a required time is missing")
        table = self.many(unique.tolist())
        picked = itemgetter(*inverse.reshape(-1).tolist())(table)
        return ([picked] if n == 1 else list(picked)), array


def record_maker(cls: type, wrap: Mapping[str, Callable[[Any], Any]] | None = None) -> Callable[..., Record]:
    """A constructor of ``cls`` taking every field positionally, in field order, that sets the slots without
    re-running validation (for records validated when they were stored). ``wrap`` converts the values of some
    fields first (field name -> function)."""
    names = [f.name for f in dataclasses.fields(cls)]
    wrap = wrap or {}
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    body = []
    for i, name in enumerate(names):
        scope[f"s{i}"] = cls.__dict__[name].__set__  # the slot's own setter: a frozen record refuses setattr
        value = f"a{i}"
        if name in wrap:
            scope[f"w{i}"] = wrap[name]
            value = f"w{i}({value})"
        body.append(f"    s{i}(o, {value})\n")
    args = ", ".join(f"a{i}" for i in range(len(names)))
    source = f"def make({args}):\n    o = new(cls)\n{''.join(body)}    return o\n"
    exec(source, scope)  # generated from the dataclass's own field names, nothing from a file
    return scope["make"]  # type: ignore[no-any-return]


def decode_columns(
    kind: Kind,
    payload: Mapping[str, Any],
    matrix: npt.NDArray[np.float32] | None,
    times: TimeCache,
    refs: dict[str, str],
) -> tuple[list[Record], dict[str, npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
    """The records of :func:`encode_columns`'s payload, with their vectors as rows of ``matrix``; also each time
    column as int64 and the positions that have a vector. ``refs`` maps ids already decoded to themselves, so
    references share the id strings (and is extended with this kind's ids)."""
    cls = RECORD_TYPES[kind]
    n = int(payload["n"])
    raw = payload["columns"]
    columns: list[list[Any]] = []
    time_columns: dict[str, npt.NDArray[np.int64]] = {}
    vec_at = np.frombuffer(payload["vec_at"], dtype="<i8")
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    for name, code in field_codes(cls):
        if name not in raw and code != "vec":  # a field added after the file was written: its default
            field = defaults[name]
            if field.default is not dataclasses.MISSING:
                columns.append([field.default] * n)
            elif field.default_factory is not dataclasses.MISSING:
                columns.append([field.default_factory() for _ in range(n)])
            else:
                raise ValueError(f"column {name} is missing")
            continue
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
            members = _map_members(cls, name)
            for i, value in zip(raw[name]["at"], raw[name]["values"], strict=True):
                values[i] = decode_value(value) if members is None else enum_map(value, members, name)
        else:
            values = _decode_plain(cls, name, raw[name], refs)
        if len(values) != n:
            raise ValueError(f"column {name} has {len(values)} values for {n} records")
        columns.append(values)
    records = list(map(record_maker(cls), *columns)) if n else []
    if kind in (Kind.EPISODE, Kind.ENTITY, Kind.COMMUNITY):
        for record in records:
            refs[record.id] = record.id  # later kinds point here: share the id strings
    return records, time_columns, vec_at


def _decode_plain(cls: type, name: str, column: Mapping[str, Any], refs: dict[str, str]) -> list[Any]:
    enum_type = _enum_of(cls, name)
    if "u" in column:
        table = column["u"]
        if enum_type is not None:
            table = [enum_type(v) for v in table]
        if name in _REF_FIELDS:  # the same string object as the record's id (mapped once per value)
            table = list(map(refs.get, table, table))
        return list(map(table.__getitem__, np.frombuffer(column["c"], dtype="<i4").tolist()))
    values = list(column["v"])
    if enum_type is not None:
        values = [enum_type(v) for v in values]
    if name in _REF_FIELDS:
        values = list(map(refs.get, values, values))
    return values
