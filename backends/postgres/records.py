"""Records as rows and rows as records: the columns of each table, the values of an upsert, key filters.

Pure functions of the schema in :mod:`.schema`; nothing here talks to the database.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from psycopg.types.json import Json

from tkg.codec import decode_value, encode_value, enum_fields, enum_map, field_codes, record_maker
from tkg.embedders.base import check_vectors
from tkg.errors import EmbeddingError, ValidationError
from tkg.models import RECORD_TYPES, VECTOR_FIELD, Entity, Fact, Kind, Record
from tkg.names import name_keys
from tkg.vector_sketches import sketch_text

from .schema import TABLES, VECTOR_TABLES

#: Columns holding a map, stored as JSON (tkg.codec's tags for what JSON lacks).
JSON_COLUMNS = frozenset({"attributes", "verdicts"})


def _columns(kind: Kind) -> list[str]:
    return [f.name for f in dataclasses.fields(TABLES[kind].record)]  # type: ignore[arg-type]


#: The record fields of each kind, in the order of the tables' columns.
COLUMNS: dict[Kind, list[str]] = {kind: _columns(kind) for kind in Kind}


class Prepared:
    """One record as the parameters of its upsert."""

    __slots__ = ("key", "record", "values")

    def __init__(self, record: Record, values: list[Any]) -> None:
        self.record = record
        self.values = values
        self.key: tuple[str, ...] = tuple(str(getattr(record, c)) for c in TABLES[record.kind].key)


def prepare(puts: Sequence[Record], dim: int) -> dict[Kind, dict[tuple[str, ...], Prepared]]:
    """Validate every record in Python (types, vectors, what PostgreSQL cannot hold) before touching the
    database; the last put of a key wins, as in the in-memory store."""
    out: dict[Kind, dict[tuple[str, ...], Prepared]] = {}
    types = tuple(RECORD_TYPES.values())
    for record in puts:
        if not isinstance(record, types):
            raise ValidationError(f"cannot store {type(record).__name__}; expected a tkg record")
    sketches = _fact_sketches(puts, dim)
    for record in puts:
        item = Prepared(record, row_values(record, dim, sketches.get(id(record))))
        out.setdefault(record.kind, {})[item.key] = item
    return out


def _fact_sketches(puts: Sequence[Record], dim: int) -> dict[int, str]:
    """The sketch of each fact's vector (:mod:`tkg.vector_sketches`), by ``id()`` of the record: computed for all
    at once (one product instead of one per fact); a vector of the wrong shape is left to :func:`row_values`."""
    facts = [(r, r.embedding) for r in puts if isinstance(r, Fact) and r.embedding is not None]
    facts = [(r, v) for r, v in facts if np.shape(v) == (dim,)]
    if not facts:
        return {}
    return dict(zip((id(r) for r, _ in facts), sketch_text(np.stack([v for _, v in facts])), strict=True))


def row_values(record: Record, dim: int, sketch: str | None = None) -> list[Any]:
    """The parameters of ``record``'s upsert (see :func:`upsert_statement`); a fact's ``sketch``, when not given,
    is computed from its vector."""
    values: list[Any] = []
    vector_field = VECTOR_FIELD.get(record.kind)
    for column in COLUMNS[record.kind]:
        value = getattr(record, column)
        if column == vector_field:
            if value is not None:
                try:
                    check_vectors(value, dim)
                except EmbeddingError as exc:
                    raise EmbeddingError(f"{record.kind} {record.id}: {exc}") from None
        elif column in JSON_COLUMNS:
            value = _json(record, value)
        elif isinstance(value, tuple):
            value = list(value)
            if any("\x00" in v for v in value):
                raise ValidationError(f"{record.kind} {record.id}: PostgreSQL cannot store NUL characters")
        elif isinstance(value, str):
            if "\x00" in value:
                raise ValidationError(
                    f"{record.kind} {record.id}: {column} contains a NUL character, which PostgreSQL cannot store"
                )
            value = str(value)  # StrEnum -> its text
        values.append(value)
    if isinstance(record, Entity):
        values.append(name_keys(record.name, record.aliases))
    elif isinstance(record, Fact):
        if sketch is None and record.embedding is not None:
            sketch = sketch_text(np.asarray(record.embedding, dtype=np.float32)[None, :])[0]
        values.append(sketch)
    return values


def _json(record: Record, attributes: Mapping[str, Any]) -> Json:
    try:
        text = json.dumps(encode_value(attributes, json=True), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"{record.kind} {record.id}: attributes must be JSON-like values (strings, numbers, booleans, None, "
            f"bytes, datetimes, lists, maps) to be stored in PostgreSQL: {exc}"
        ) from None
    return Json(None, dumps=lambda _: text)


def upsert_statement(kind: Kind, indexed: bool = False) -> str:
    """The insert-or-update of one row of ``kind`` (``{s}`` stands for the schema); a row of a kind with vectors,
    new or rewritten, is marked ``indexed`` or not (then the store's worker enters it into the HNSW index)."""
    table = TABLES[kind]
    columns = list(COLUMNS[kind])
    placeholders = ["%s"] * len(columns)
    if kind is Kind.ENTITY:
        columns.append("names")
        placeholders.append("%s")
    elif kind is Kind.FACT:
        columns.append("sketch")
        placeholders.append("%s")
    if kind in VECTOR_TABLES:
        columns.append("indexed")
        placeholders.append("true" if indexed else "false")
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in table.key)
    return (
        f"INSERT INTO {{s}}.{table.name} ({', '.join(columns)}) VALUES ({', '.join(placeholders)}) "
        f"ON CONFLICT ({', '.join(table.key)}) DO UPDATE SET {updates}"
    )


#: Record columns added to a table after its first version: (kind, column) -> (the schema version that added it,
#: the SQL of the value its records had before).
ADDED_COLUMNS: dict[tuple[Kind, str], tuple[int, str]] = {(Kind.COMMUNITY, "summarised"): (12, "''")}


def select(kind: Kind, version: int | None = None) -> str:
    """``SELECT seq, <the record's columns> FROM <the table>`` (rows for :func:`from_rows`). JSON columns come as
    their text, which :func:`from_rows` parses for all rows at once (one ``json.loads`` per row and column was a
    third of the time of reading a thousand facts). ``version``: the schema is at that version (a migration's
    backfill reads it): a column added later is read as the value its records had before."""
    columns = []
    for c in COLUMNS[kind]:
        added = ADDED_COLUMNS.get((kind, c))
        if version is not None and added is not None and version < added[0]:
            columns.append(f"{added[1]} AS {c}")
        else:
            columns.append(f"{c}::text" if c in JSON_COLUMNS else c)
    return f"SELECT seq, {', '.join(columns)} FROM {{s}}.{TABLES[kind].name}"


def from_row(kind: Kind, row: Sequence[Any]) -> Record:
    """The record of a row selected by :func:`select` (or with the JSON columns already parsed)."""
    record: Record = from_rows(kind, [row])[0]
    return record


def from_rows(kind: Kind, rows: Iterable[Sequence[Any]]) -> list[Any]:
    """The records of rows selected by :func:`select`."""
    rows = list(rows)
    columns = COLUMNS[kind]
    at = [i + 1 for i, c in enumerate(columns) if c in JSON_COLUMNS]  # +1: seq comes first
    texts = [row[i] for row in rows for i in at if isinstance(row[i], str)]
    parsed = iter(json.loads(f"[{','.join(texts)}]") if texts else ())
    make = _MAKERS[kind]
    out = []
    for row in rows:
        values = list(row[1:])
        for i in at:
            if isinstance(row[i], str):
                values[i - 1] = next(parsed)
        out.append(make(*values))
    return out


def _maker(kind: Kind) -> Callable[..., Record]:
    """A constructor of ``kind``'s records from their columns' values as the driver returns them (JSON columns
    parsed), converted as the record holds them but not validated again: every row was validated in Python before
    it was written (:func:`prepare`), as the in-memory store builds its records from rows (``backends/memory/
    rows.py``). Validating each fact read again (its verdicts, its times) was half the time of reading it. Times
    come in UTC already: every connection's session is (``connection.connect``)."""
    cls = RECORD_TYPES[kind]
    enums = enum_fields(cls)
    wrap: dict[str, Callable[[Any], Any]] = {}
    for name, code in field_codes(cls):
        if name in enums:
            how, members = enums[name]
            wrap[name] = members.__getitem__ if how == "val" else functools.partial(_members, members, name)
        elif code == "tuple":
            wrap[name] = tuple
        elif code == "map":
            wrap[name] = _json_map
        elif code == "vec":
            wrap[name] = _read_only
    return record_maker(cls, wrap)


def _members(members: Mapping[str, enum.Enum], name: str, value: Mapping[str, str]) -> dict[str, enum.Enum]:
    return enum_map(value, members, name)


def _json_map(value: Any) -> dict[str, Any]:
    return dict(decode_value(value, json=True))


def _read_only(value: npt.NDArray[np.float32] | None) -> npt.NDArray[np.float32] | None:
    if value is not None:
        value.flags.writeable = False  # the driver's array is the record's own (vectors.py: a copy as float32)
    return value


_MAKERS = {kind: _maker(kind) for kind in Kind}


def key_filter(kind: Kind, alias: str = "") -> str:
    """A condition matching the rows whose keys :func:`key_params` gives."""
    table = TABLES[kind]
    if len(table.key) == 1:
        return f"{alias}{table.key[0]} = ANY(%(a)s::text[])"
    a, b = table.key
    return f"({alias}{a}, {alias}{b}) IN (SELECT * FROM unnest(%(a)s::text[], %(b)s::text[]))"


def key_params(keys: Sequence[tuple[str, ...]]) -> dict[str, list[str]]:
    params = {"a": [k[0] for k in keys]}
    if keys and len(keys[0]) == 2:
        params["b"] = [k[1] for k in keys]
    return params


def keys_of(pairs: Iterable[tuple[Kind, str]]) -> dict[Kind, list[tuple[str, ...]]]:
    """Record ids as table keys, by kind (a link's id ``"first>entity"`` is a two-column key); an id that
    cannot be a key of its table is left out (no row has it)."""
    out: dict[Kind, list[tuple[str, ...]]] = {}
    for kind, rid in pairs:
        key = tuple(rid.split(">", 1)) if len(TABLES[kind].key) == 2 else (rid,)
        if len(key) == len(TABLES[kind].key):
            out.setdefault(kind, []).append(key)
    return out
