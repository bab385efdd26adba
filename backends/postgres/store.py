"""The PostgreSQL backend: pgvector HNSW for cosine, tsvector + GIN for full text, recursive SQL for the graph.

One :class:`PostgresStore` holds one connection (calls from several threads take turns on it). Every
:meth:`~PostgresStore.write` is one transaction: a failure, a refused record or a dropped connection leaves
nothing of the batch behind. Several processes may share a database; :meth:`PostgresStore.group_lock` is the
cross-process lock on one group that keeps two writers' read-modify-write cycles from interleaving.

Reads are one statement each (a text search may run two or three); a read whose connection dropped is retried
once on a new connection. Every value travels as a query parameter; only the schema name, checked against a
strict pattern and quoted, is spliced into statement text.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar, TypeVar

import psycopg
from psycopg import sql
from psycopg.types.json import Json

from tkg.codec import decode_value, encode_value
from tkg.embedders.base import check_vectors
from tkg.errors import BackendError, ConfigurationError, EmbeddingError, ValidationError
from tkg.integrity import check_write
from tkg.models import (
    RECORD_TYPES,
    VECTOR_FIELD,
    Entity,
    Episode,
    Fact,
    Kind,
    Membership,
    Mention,
    Record,
    Vector,
    search_text,
)
from tkg.names import normalize_name
from tkg.storage import Hit, Store, WriteBatch
from tkg.timeline import Scope

from .connection import ITERATIVE_SCAN_PGVECTOR, connect, describe, ensure_vector_extension
from .schema import SEARCH_INDEXES, TABLES, ensure_schema, quote_ident, render
from .scope import scope_where
from .vectors import register_vector

T = TypeVar("T")

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_TEXT_KINDS = (Kind.EPISODE, Kind.ENTITY, Kind.FACT, Kind.COMMUNITY)
_PAGE = 2000


def _columns(kind: Kind) -> list[str]:
    return [f.name for f in dataclasses.fields(TABLES[kind].record)]  # type: ignore[arg-type]


COLUMNS: dict[Kind, list[str]] = {kind: _columns(kind) for kind in Kind}
#: Columns holding a map, stored as JSON (tkg.codec's tags for what JSON lacks).
JSON_COLUMNS = frozenset({"attributes", "verdicts"})


def _json(record: Record, attributes: Mapping[str, Any]) -> Json:
    try:
        text = json.dumps(encode_value(attributes, json=True), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"{record.kind} {record.id}: attributes must be JSON-like values (strings, numbers, booleans, None, "
            f"bytes, datetimes, lists, maps) to be stored in PostgreSQL: {exc}"
        ) from None
    return Json(None, dumps=lambda _: text)


def _tsquery(lexemes: Sequence[str], operator: str) -> str:
    """Lexemes joined by ``|`` or ``&`` in tsquery syntax, each quoted (so no lexeme is parsed again)."""
    quoted = ("'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'" for lexeme in lexemes)
    return f" {operator} ".join(quoted)


class _Prepared:
    """One record as the parameters of its upsert."""

    __slots__ = ("key", "record", "values")

    def __init__(self, record: Record, values: list[Any]) -> None:
        self.record = record
        self.values = values
        self.key: tuple[str, ...] = tuple(str(getattr(record, c)) for c in TABLES[record.kind].key)


class PostgresStore(Store):
    """A tkg store in a PostgreSQL database (>= 15, with pgvector >= 0.5).

    ``dsn`` is a libpq connection string or URI (``"postgresql://user:pass@host:5432/db"``). The tables live in
    ``schema`` (created, or upgraded, on open). ``dim`` must match the database's vectors once it holds a memory.

    >>> from tkg.backends.postgres import EmbeddedPostgres  # doctest: +SKIP
    >>> server = EmbeddedPostgres()  # doctest: +SKIP
    >>> store = PostgresStore(server.dsn, dim=384)  # doctest: +SKIP
    >>> store.count(Kind.FACT)  # doctest: +SKIP
    0
    """

    shared: ClassVar[bool] = True

    def __init__(
        self,
        dsn: str,
        dim: int,
        *,
        schema: str = "tkg",
        text_config: str = "english",
        ef_search: int = 64,
        connect_timeout: int = 10,
    ) -> None:
        if not isinstance(dim, int) or dim < 1 or dim > 16000:
            raise ValidationError("dim must be a positive integer (pgvector indexes up to 2000 dimensions)")
        if not _SCHEMA_RE.match(schema):
            raise ValidationError(f"schema {schema!r} is invalid: use 1-63 lower-case letters, digits and _")
        self.dim = dim
        self.schema = schema
        self._dsn = dsn
        self._ef_search = int(ef_search)
        self._connect_timeout = connect_timeout
        self._lock = threading.RLock()
        self._sql: dict[str, sql.Composed] = {}
        self._group_locks: dict[str, threading.Lock] = {}
        self._lock_conn: psycopg.Connection[Any] | None = None
        self._lock_conn_guard = threading.Lock()
        self._common: dict[Kind, tuple[float, frozenset[str]]] = {}
        conn = connect(dsn, connect_timeout=connect_timeout)
        try:
            self._ext_schema, self._pgvector = ensure_vector_extension(conn)
            settings = ensure_schema(conn, schema, dim, text_config)
        except psycopg.Error as exc:
            conn.close()
            raise BackendError(f"cannot open the tkg schema {schema!r} at {describe(dsn)}: {exc}") from None
        except BaseException:
            conn.close()
            raise
        if int(settings["dim"]) != dim:
            conn.close()
            raise ConfigurationError(
                f"the tkg schema {schema!r} at {describe(dsn)} holds {settings['dim']}-d vectors; this store was "
                f"opened with dim={dim}. Use the same embedder, or another schema"
            )
        self.text_config = settings["text_config"]
        self._conn: psycopg.Connection[Any] | None = None
        try:
            self._setup(conn)
        except psycopg.Error as exc:
            conn.close()
            raise BackendError(f"cannot set up the connection to PostgreSQL at {describe(dsn)}: {exc}") from None
        self._conn = conn

    # ------------------------------------------------------------------------------------------------------
    # connections
    def _setup(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "SELECT set_config('search_path', %s, false)",
            [f"{quote_ident(self.schema)}, {quote_ident(self._ext_schema)}"],
        )
        register_vector(conn)
        conn.execute("SELECT set_config('hnsw.ef_search', %s, false)", [str(max(1, min(1000, self._ef_search)))])
        if self._pgvector >= ITERATIVE_SCAN_PGVECTOR:
            # Filtered k-NN keeps walking the graph until k admitted rows are found (pgvector >= 0.8).
            conn.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', false)")

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None and not conn.closed:
                conn.close()
            self._conn = None
            conn = connect(self._dsn, connect_timeout=self._connect_timeout)
            try:
                self._setup(conn)
            except psycopg.Error as exc:
                conn.close()
                raise BackendError(f"cannot set up a new connection to PostgreSQL: {exc}") from None
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return conn

    def _read(self, fn: Callable[[psycopg.Cursor[Any]], T]) -> T:
        """Run a read on the connection; once more on a new connection if the old one dropped."""
        with self._lock:
            for attempt in (0, 1):
                conn = self._connection()
                try:
                    with conn.cursor(binary=True) as cur:
                        return fn(cur)
                except psycopg.OperationalError as exc:
                    if conn.broken and attempt == 0:
                        continue
                    raise BackendError(f"PostgreSQL read failed: {exc}") from None
                except psycopg.Error as exc:
                    raise BackendError(f"PostgreSQL read failed: {exc}") from None
        raise AssertionError("unreachable")

    def _q(self, text: str) -> sql.Composed:
        """A statement with ``{s}`` standing for this store's schema (rendered once, then cached)."""
        found = self._sql.get(text)
        if found is None:
            found = self._sql[text] = render(text, self.schema)
        return found

    def close(self) -> None:
        """Close the connections (the data stays in the database)."""
        with self._lock:
            for conn in (self._conn, self._lock_conn):
                if conn is not None and not conn.closed:
                    conn.close()
            self._conn = self._lock_conn = None

    def __del__(self) -> None:
        # A store dropped without close() gives its connections back at once (servers limit connections).
        for conn in (getattr(self, "_conn", None), getattr(self, "_lock_conn", None)):
            if conn is not None and not conn.closed:
                conn.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------------
    # cross-process coordination
    @contextmanager
    def group_lock(self, group_id: str, *, poll: float = 0.01) -> Iterator[None]:
        """Hold the lock of ``group_id`` across processes (a PostgreSQL advisory lock) and threads.

        Hold it around a read-modify-write cycle of one group, such as ingesting one episode, so that two
        processes never plan from the same state and overwrite each other's changes.
        """
        with self._lock:
            local = self._group_locks.setdefault(group_id, threading.Lock())
        with local:
            key = f"tkg-group:{self.schema}:{group_id}"
            delay = poll
            while not self._lock_call("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", key):
                time.sleep(delay)  # polling keeps one waiting group from blocking the lock connection
                delay = min(delay * 2, 0.2)
            try:
                yield
            finally:
                self._lock_call("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", key)

    def _lock_call(self, statement: str, key: str) -> bool:
        with self._lock_conn_guard:
            conn = self._lock_conn
            if conn is None or conn.closed or conn.broken:
                self._lock_conn = conn = connect(self._dsn, connect_timeout=self._connect_timeout)
            try:
                row = conn.execute(statement, [key]).fetchone()  # type: ignore[arg-type]
            except psycopg.Error as exc:
                raise BackendError(f"PostgreSQL group lock failed: {exc}") from None
            return bool(row and row[0])

    # ------------------------------------------------------------------------------------------------------
    # writes
    def write(self, batch: WriteBatch) -> None:
        prepared = self._prepare(batch.puts)
        deletes = [(Kind(kind), str(rid)) for kind, rid in batch.deletes]
        self._transaction(lambda cur: self._apply(cur, prepared, deletes))

    def _transaction(self, body: Callable[[psycopg.Cursor[Any]], None]) -> None:
        with self._lock:
            conn = self._connection()
            try:
                with conn.transaction(), conn.cursor(binary=True) as cur:
                    body(cur)
            except psycopg.OperationalError as exc:
                if conn.broken or conn.closed:
                    raise BackendError(
                        f"the connection to PostgreSQL was lost during a write ({str(exc).strip()}); the server "
                        "rolls back the unfinished transaction, so nothing of this batch was written. tkg reconnects "
                        "on the next call"
                    ) from None
                raise BackendError(f"PostgreSQL refused the write, nothing was written: {exc}") from None
            except psycopg.Error as exc:
                raise BackendError(f"PostgreSQL refused the write, nothing was written: {exc}") from None

    def _prepare(self, puts: Sequence[Record]) -> dict[Kind, dict[tuple[str, ...], _Prepared]]:
        """Validate every record in Python (types, vectors, what PostgreSQL cannot hold) before touching the
        database; the last put of a key wins, as in the in-memory store."""
        out: dict[Kind, dict[tuple[str, ...], _Prepared]] = {}
        types = tuple(RECORD_TYPES.values())
        for record in puts:
            if not isinstance(record, types):
                raise ValidationError(f"cannot store {type(record).__name__}; expected a tkg record")
            item = _Prepared(record, self._values(record))
            out.setdefault(record.kind, {})[item.key] = item
        return out

    def _values(self, record: Record) -> list[Any]:
        values: list[Any] = []
        vector_field = VECTOR_FIELD.get(record.kind)
        for column in COLUMNS[record.kind]:
            value = getattr(record, column)
            if column == vector_field:
                if value is not None:
                    try:
                        check_vectors(value, self.dim)
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
            values.append(sorted({normalize_name(n) for n in (record.name, *record.aliases)}))
        if record.kind in _TEXT_KINDS:
            values += [self.text_config, search_text(record)]
        return values

    def _upsert_sql(self, kind: Kind) -> sql.Composed:
        table = TABLES[kind]
        columns = list(COLUMNS[kind])
        placeholders = ["%s"] * len(columns)
        if kind is Kind.ENTITY:
            columns.append("names")
            placeholders.append("%s")
        if kind in _TEXT_KINDS:
            columns.append("tsv")
            placeholders.append("to_tsvector(%s::regconfig, %s)")
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in table.key)
        return self._q(
            f"INSERT INTO {{s}}.{table.name} ({', '.join(columns)}) VALUES ({', '.join(placeholders)}) "
            f"ON CONFLICT ({', '.join(table.key)}) DO UPDATE SET {updates}"
        )

    def _apply(
        self,
        cur: psycopg.Cursor[Any],
        prepared: dict[Kind, dict[tuple[str, ...], _Prepared]],
        deletes: list[tuple[Kind, str]],
    ) -> None:
        """Reference checks (tkg.integrity, against what the transaction sees), then puts, deletes, counts."""
        check_write([p.record for items in prepared.values() for p in items.values()], deletes, self._held(cur))
        delta: Counter[tuple[str, str]] = Counter()
        for kind in Kind:
            items = prepared.get(kind)
            if items:
                # Rows that exist are locked first, in one order for every writer (no deadlocks); then the puts go
                # in batch order, so that new records get their insertion order (seq) as the batch gives it.
                for _, group in self._existing(cur, kind, sorted(items)):
                    delta[(kind.value, group)] -= 1
                for item in items.values():
                    delta[(kind.value, item.record.group_id)] += 1
                self._upsert(cur, kind, list(items.values()))
        deleted = self._split_deletes(deletes, prepared)
        for kind, keys in deleted.items():
            for (group,) in self._delete(cur, kind, keys):
                delta[(kind.value, group)] -= 1
        self._count(cur, delta)

    def _upsert(self, cur: psycopg.Cursor[Any], kind: Kind, items: list[_Prepared]) -> None:
        cur.executemany(self._upsert_sql(kind), [p.values for p in items])

    def _key_filter(self, kind: Kind, alias: str = "") -> str:
        table = TABLES[kind]
        if len(table.key) == 1:
            return f"{alias}{table.key[0]} = ANY(%(a)s::text[])"
        a, b = table.key
        return f"({alias}{a}, {alias}{b}) IN (SELECT * FROM unnest(%(a)s::text[], %(b)s::text[]))"

    @staticmethod
    def _key_params(keys: Sequence[tuple[str, ...]]) -> dict[str, list[str]]:
        params = {"a": [k[0] for k in keys]}
        if keys and len(keys[0]) == 2:
            params["b"] = [k[1] for k in keys]
        return params

    def _existing(self, cur: psycopg.Cursor[Any], kind: Kind, keys: list[tuple[str, ...]]) -> list[tuple[Any, str]]:
        table = TABLES[kind]
        statement = self._q(
            f"SELECT seq, group_id FROM {{s}}.{table.name} WHERE {self._key_filter(kind)} ORDER BY seq FOR UPDATE"
        )
        return cur.execute(statement, self._key_params(keys)).fetchall()

    def _delete(self, cur: psycopg.Cursor[Any], kind: Kind, keys: list[tuple[str, ...]]) -> list[tuple[str]]:
        table = TABLES[kind]
        statement = self._q(f"DELETE FROM {{s}}.{table.name} WHERE {self._key_filter(kind)} RETURNING group_id")
        return cur.execute(statement, self._key_params(sorted(keys))).fetchall()

    @staticmethod
    def _split_deletes(
        deletes: list[tuple[Kind, str]], prepared: dict[Kind, dict[tuple[str, ...], _Prepared]]
    ) -> dict[Kind, list[tuple[str, ...]]]:
        out: dict[Kind, list[tuple[str, ...]]] = {}
        for kind, rid in deletes:
            key = tuple(rid.split(">", 1)) if len(TABLES[kind].key) == 2 else (rid,)
            if len(key) == len(TABLES[kind].key):
                out.setdefault(kind, []).append(key)
        return out

    def _held(self, cur: psycopg.Cursor[Any]) -> Callable[[Kind, Collection[str]], Mapping[str, str]]:
        """The lookup :func:`tkg.integrity.check_write` asks: which of these ids the database holds (in this
        transaction), with their groups."""

        def lookup(kind: Kind, ids: Collection[str]) -> Mapping[str, str]:
            rows = cur.execute(
                self._q(f"SELECT id, group_id FROM {{s}}.{TABLES[kind].name} WHERE id = ANY(%s::text[])"),
                [sorted(ids)],
            ).fetchall()
            return {str(i): str(g) for i, g in rows}

        return lookup

    def _count(self, cur: psycopg.Cursor[Any], delta: Counter[tuple[str, str]]) -> None:
        changes = sorted((k, g, n) for (k, g), n in delta.items() if n)
        if not changes:
            return
        kinds, groups, ns = [c[0] for c in changes], [c[1] for c in changes], [c[2] for c in changes]
        cur.execute(
            self._q(
                "INSERT INTO {s}.counts (kind, group_id, n) SELECT * FROM unnest(%s::text[], %s::text[], %s::int8[]) "
                "ON CONFLICT (kind, group_id) DO UPDATE SET n = counts.n + excluded.n"
            ),
            [kinds, groups, ns],
        )
        cur.execute(
            self._q(
                "DELETE FROM {s}.counts c USING unnest(%s::text[], %s::text[]) AS d(kind, group_id) "
                "WHERE c.kind = d.kind AND c.group_id = d.group_id AND c.n <= 0"
            ),
            [kinds, groups],
        )

    def load(self, records: Iterable[Record]) -> None:
        """Bulk-load records into an empty store (snapshot import): one transaction, search indexes built once at
        the end instead of row by row."""
        prepared = self._prepare(list(records))

        def body(cur: psycopg.Cursor[Any]) -> None:
            if cur.execute(self._q("SELECT 1 FROM {s}.counts LIMIT 1")).fetchone() is not None:
                raise BackendError(f"load() needs an empty store; schema {self.schema!r} already holds records")
            cur.execute("SET LOCAL maintenance_work_mem = '1GB'")
            for name in SEARCH_INDEXES:
                cur.execute(self._q(f"DROP INDEX IF EXISTS {{s}}.{name}"))
            self._apply(cur, prepared, [])
            for statement in SEARCH_INDEXES.values():
                cur.execute(self._q(statement))
            cur.execute(self._q("ANALYZE {s}.facts, {s}.entities, {s}.episodes, {s}.communities"))

        self._transaction(body)

    # ------------------------------------------------------------------------------------------------------
    # reads
    def _select(self, kind: Kind) -> str:
        table = TABLES[kind]
        return f"SELECT seq, {', '.join(COLUMNS[kind])} FROM {{s}}.{table.name}"

    def _record(self, kind: Kind, row: Sequence[Any]) -> Record:
        fields = dict(zip(COLUMNS[kind], row[1:], strict=True))
        for name in JSON_COLUMNS.intersection(fields):
            fields[name] = decode_value(fields[name], json=True)
        for name in ("labels", "aliases", "episodes"):
            if name in fields:
                fields[name] = tuple(fields[name])
        return RECORD_TYPES[kind](**fields)

    def _records(self, kind: Kind, rows: Iterable[Sequence[Any]]) -> list[Any]:
        return [self._record(kind, row) for row in rows]

    def get(self, kind: Kind, ids: Sequence[str]) -> list[Record | None]:
        kind = Kind(kind)
        if not ids:
            return []
        keys = self._split_deletes([(kind, str(i)) for i in ids], {}).get(kind, [])
        if not keys:
            return [None] * len(ids)
        statement = self._q(f"{self._select(kind)} WHERE {self._key_filter(kind)}")
        found = self._read(lambda cur: cur.execute(statement, self._key_params(keys)).fetchall())
        by_id = {r.id: r for r in self._records(kind, found)}
        return [by_id.get(str(i)) for i in ids]

    def scan(self, kind: Kind, group_ids: frozenset[str] | None = None) -> Iterator[Record]:
        kind = Kind(kind)
        where = "TRUE" if group_ids is None else "group_id = ANY(%(groups)s::text[])"
        statement = self._q(f"{self._select(kind)} WHERE seq > %(after)s AND {where} ORDER BY seq LIMIT {_PAGE}")
        params: dict[str, Any] = {"after": 0, "groups": sorted(group_ids or ())}
        while True:  # keyset pages: the connection is free between pages for other calls
            rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
            yield from self._records(kind, rows)
            if len(rows) < _PAGE:
                return
            params["after"] = rows[-1][0]

    def count(self, kind: Kind, group_ids: frozenset[str] | None = None) -> int:
        where = "" if group_ids is None else " AND group_id = ANY(%(groups)s::text[])"
        statement = self._q(f"SELECT coalesce(sum(n), 0) FROM {{s}}.counts WHERE kind = %(kind)s{where}")
        params = {"kind": Kind(kind).value, "groups": sorted(group_ids or ())}
        row = self._read(lambda cur: cur.execute(statement, params).fetchone())
        return int(row[0]) if row else 0

    def groups(self) -> set[str]:
        rows = self._read(lambda cur: cur.execute(self._q("SELECT DISTINCT group_id FROM {s}.counts")).fetchall())
        return {r[0] for r in rows}

    def vector_search(self, kind: Kind, vector: Vector, k: int, scope: Scope) -> list[Hit]:
        kind = Kind(kind)
        column = VECTOR_FIELD.get(kind)
        if column is None:
            raise BackendError(f"{kind} records have no vectors to search")
        query = check_vectors(vector, self.dim)[0]
        if k <= 0:
            return []
        params: dict[str, Any] = {"q": query, "k": int(k)}
        where = scope_where(kind, scope, params)
        table = TABLES[kind].name
        # The first form can use the HNSW index; the second (distance + 0 is no index key) is an exact scan,
        # run only when the index walk came back short (fewer admitted rows than k, or a very selective filter).
        indexed = self._q(
            f"SELECT id, seq, {column} <=> %(q)s FROM {{s}}.{table} WHERE {column} IS NOT NULL AND {where} "
            f"ORDER BY {column} <=> %(q)s LIMIT %(k)s"
        )
        exact = self._q(
            f"SELECT id, seq, {column} <=> %(q)s FROM {{s}}.{table} WHERE {column} IS NOT NULL AND {where} "
            f"ORDER BY ({column} <=> %(q)s) + 0, seq LIMIT %(k)s"
        )

        def run(cur: psycopg.Cursor[Any]) -> list[Any]:
            rows = cur.execute(indexed, params).fetchall()
            if len(rows) < k:
                rows = cur.execute(exact, params).fetchall()
            return rows

        rows = self._read(run)
        hits = [(1.0 - d if d is not None and not math.isnan(d) else 0.0, seq, rid) for rid, seq, d in rows]
        hits.sort(key=lambda h: (-h[0], h[1]))
        return [Hit(rid, score) for score, _, rid in hits]

    def text_search(self, kind: Kind, query: str, k: int, scope: Scope) -> list[Hit]:
        kind = Kind(kind)
        if kind not in _TEXT_KINDS:
            raise BackendError(f"{kind} records have no text to search")
        if k <= 0 or not query.strip():
            return []
        lexemes = self._lexemes(query)
        if not lexemes:
            return []  # stop words only
        params: dict[str, Any] = {"any": _tsquery(lexemes, "|"), "all": _tsquery(lexemes, "&"), "k": int(k)}
        where = scope_where(kind, scope, params)
        # Any query term matches (OR); a document holding all of them gets +1, so it ranks above every document
        # holding only some. ts_rank with length normalisation orders documents within each tier.
        statement = self._q(
            "SELECT id, ts_rank(tsv, %(any)s::tsquery, 1) + CASE WHEN tsv @@ %(all)s::tsquery THEN 1 ELSE 0 END "
            f"AS score FROM {{s}}.{TABLES[kind].name} WHERE tsv @@ %(pool)s::tsquery AND {where} "
            "ORDER BY score DESC, seq LIMIT %(k)s"
        )
        # Ranking reads every candidate row, and a common word matches a large share of a big table. When the
        # query also has rarer terms, rank first the documents holding one of those (BM25 would put them first
        # anyway: rare terms weigh most); only if they are fewer than k are all documents sharing a term ranked.
        common = self._common_lexemes(kind)
        rare = [lexeme for lexeme in lexemes if lexeme not in common]

        def run(cur: psycopg.Cursor[Any]) -> list[Any]:
            if rare and len(rare) < len(lexemes):
                rows = cur.execute(statement, {**params, "pool": _tsquery(rare, "|")}).fetchall()
                if len(rows) >= k:
                    return rows
            return cur.execute(statement, {**params, "pool": params["any"]}).fetchall()

        return [Hit(rid, float(score)) for rid, score in self._read(run)]

    def _lexemes(self, text: str) -> list[str]:
        statement = "SELECT tsvector_to_array(to_tsvector(%s::regconfig, %s))"
        row = self._read(lambda cur: cur.execute(statement, [self.text_config, text.replace("\x00", " ")]).fetchone())
        return list(row[0]) if row and row[0] else []

    def _common_lexemes(self, kind: Kind) -> frozenset[str]:
        """Lexemes in at least 0.5% of a table's documents, from the planner's statistics (ANALYZE, which
        autovacuum keeps current); cached for a minute."""
        now = time.monotonic()
        cached = self._common.get(kind)
        if cached is not None and now - cached[0] < 60:
            return cached[1]
        statement = (
            "SELECT most_common_elems::text::text[], most_common_elem_freqs FROM pg_stats "
            "WHERE schemaname = %s AND tablename = %s AND attname = 'tsv'"
        )
        row = self._read(lambda cur: cur.execute(statement, [self.schema, TABLES[kind].name]).fetchone())
        common: frozenset[str] = frozenset()
        if row and row[0]:
            common = frozenset(lex for lex, freq in zip(row[0], row[1], strict=False) if freq >= 0.005)
        self._common[kind] = (now, common)
        return common

    def entities_by_name(self, group_id: str, names: Sequence[str]) -> dict[str, list[Entity]]:
        keys = sorted({normalize_name(n) for n in names})
        if not keys:
            return {}
        statement = self._q(
            f"SELECT seq, {', '.join(COLUMNS[Kind.ENTITY])}, names FROM {{s}}.entities "
            "WHERE group_id = %s AND names && %s::text[] ORDER BY seq"
        )
        rows = self._read(lambda cur: cur.execute(statement, [group_id, keys]).fetchall())
        wanted = set(keys)
        out: dict[str, list[Entity]] = {}
        for row in rows:
            entity = self._record(Kind.ENTITY, row[:-1])
            assert isinstance(entity, Entity)
            for key in row[-1]:
                if key in wanted:
                    out.setdefault(key, []).append(entity)
        return out

    def facts_of(self, entity_ids: Sequence[str], scope: Scope | None = None) -> list[Fact]:
        if not entity_ids:
            return []
        params: dict[str, Any] = {"ids": list(entity_ids)}
        where = scope_where(Kind.FACT, scope, params)
        select = self._select(Kind.FACT)
        statement = self._q(
            f"{select} WHERE seq IN (SELECT seq FROM {{s}}.facts WHERE source_id = ANY(%(ids)s::text[]) UNION "
            f"SELECT seq FROM {{s}}.facts WHERE target_id = ANY(%(ids)s::text[])) AND {where} ORDER BY seq"
        )
        rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
        return self._records(Kind.FACT, rows)

    def bfs(self, seeds: Sequence[str], depth: int, scope: Scope, limit: int | None = None) -> dict[str, int]:
        if not seeds:
            return {}
        params: dict[str, Any] = {"seeds": list(dict.fromkeys(seeds)), "depth": int(depth)}
        entity_where = scope_where(Kind.ENTITY, scope, params)
        fact_where = scope_where(Kind.FACT, scope, params)
        params["limit"] = limit if limit is not None else 2**62
        # Level by level: each step carries the frontier and every entity seen so far, so an entity is expanded
        # once (a plain recursive join would revisit it along every path).
        statement = self._q(
            "WITH RECURSIVE walk(frontier, seen, hop) AS ("
            f" SELECT array_agg(id), array_agg(id), 0 FROM {{s}}.entities WHERE id = ANY(%(seeds)s::text[]) "
            f" AND {entity_where}"
            " UNION ALL"
            " SELECT step.found, walk.seen || step.found, walk.hop + 1 FROM walk CROSS JOIN LATERAL ("
            "  SELECT array_agg(DISTINCT n.other) AS found FROM ("
            "   SELECT f.target_id AS other FROM unnest(walk.frontier) AS c(id) "
            f"   JOIN {{s}}.facts f ON f.source_id = c.id WHERE {fact_where}"
            "   UNION ALL"
            "   SELECT f.source_id FROM unnest(walk.frontier) AS c(id) "
            f"   JOIN {{s}}.facts f ON f.target_id = c.id WHERE {fact_where}"
            "  ) n WHERE NOT n.other = ANY(walk.seen)"
            " ) step"
            " WHERE walk.hop < %(depth)s AND step.found IS NOT NULL AND cardinality(walk.seen) < %(limit)s"
            ") SELECT unnest(frontier), hop FROM walk WHERE frontier IS NOT NULL"
        )
        rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
        hops: dict[str, int] = {}
        for entity_id, hop in sorted(rows, key=lambda r: (r[1], r[0])):
            if limit is not None and hop > 0 and len(hops) >= limit:
                break
            hops.setdefault(entity_id, hop)
        return hops

    def mentions(
        self, episode_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Mention]:
        return self._links(Kind.MENTION, "episode_id", episode_ids, entity_ids)

    def memberships(
        self, community_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Membership]:
        return self._links(Kind.MEMBERSHIP, "community_id", community_ids, entity_ids)

    def _links(self, kind: Kind, first: str, firsts: Sequence[str] | None, entities: Sequence[str] | None) -> list[Any]:
        parts = ["TRUE"]
        params: dict[str, Any] = {}
        if firsts is not None:
            parts.append(f"{first} = ANY(%(firsts)s::text[])")
            params["firsts"] = list(firsts)
        if entities is not None:
            parts.append("entity_id = ANY(%(entities)s::text[])")
            params["entities"] = list(entities)
        statement = self._q(f"{self._select(kind)} WHERE {' AND '.join(parts)} ORDER BY seq")
        rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
        return self._records(kind, rows)

    def episode_facts(self, episode_id: str) -> list[Fact]:
        statement = self._q(f"{self._select(Kind.FACT)} WHERE episodes @> ARRAY[%s::text] ORDER BY seq")
        rows = self._read(lambda cur: cur.execute(statement, [episode_id]).fetchall())
        return self._records(Kind.FACT, rows)

    def recent_episodes(self, group_id: str, before: datetime, n: int) -> list[Episode]:
        if n <= 0:
            return []
        statement = self._q(
            f"{self._select(Kind.EPISODE)} WHERE group_id = %s AND reference_time <= %s "
            "ORDER BY reference_time DESC, seq DESC LIMIT %s"
        )
        rows = self._read(lambda cur: cur.execute(statement, [group_id, before, n]).fetchall())
        return self._records(Kind.EPISODE, reversed(rows))

    def episode_window(self, episode_id: str, before: int, after: int) -> list[Episode]:
        select = self._select(Kind.EPISODE)
        statement = self._q(
            "WITH me AS (SELECT group_id, reference_time, seq FROM {s}.episodes WHERE id = %(id)s) "
            f"(SELECT * FROM ({select} e WHERE e.group_id = (SELECT group_id FROM me) AND (e.reference_time, e.seq) < "
            "(SELECT reference_time, seq FROM me) ORDER BY e.reference_time DESC, e.seq DESC LIMIT %(before)s) b) "
            f"UNION ALL ({select} WHERE id = %(id)s) "
            f"UNION ALL (SELECT * FROM ({select} e WHERE e.group_id = (SELECT group_id FROM me) AND "
            "(e.reference_time, e.seq) > (SELECT reference_time, seq FROM me) ORDER BY e.reference_time, e.seq "
            "LIMIT %(after)s) a)"
        )
        params = {"id": episode_id, "before": max(0, before), "after": max(0, after)}
        rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
        ordered = sorted(rows, key=lambda r: (r[1 + COLUMNS[Kind.EPISODE].index("reference_time")], r[0]))
        return self._records(Kind.EPISODE, ordered)

    def stats(self) -> dict[str, Any]:
        rows = self._read(
            lambda cur: cur.execute(self._q("SELECT kind, sum(n) FROM {s}.counts GROUP BY kind")).fetchall()
        )
        counts = {str(k): int(n) for k, n in rows}
        return {
            "records": {kind.value: counts.get(kind.value, 0) for kind in Kind},
            "groups": len(self.groups()),
            "backend": f"postgres ({describe(self._dsn)}, schema {self.schema})",
        }
