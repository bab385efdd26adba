"""Writes of a PostgreSQL store: a batch is one transaction (reference checks, upserts, deletes, counts), and a
bulk load builds the search indexes once at the end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence, Set
from typing import Any

import psycopg

from tkg.errors import BackendError
from tkg.integrity import check_write, references
from tkg.models import SEARCH_FIELDS, TEXT_KINDS, Fact, Kind, Record
from tkg.storage import WriteBatch

from . import terms
from .records import Prepared, key_filter, key_params, keys_of, prepare, upsert_statement
from .schema import ANALYZE, SEARCH_INDEXES, TABLES, VACUUM_LOADED, VECTOR_TABLES
from .session import Session
from .terms import Delta, add_postings, drop_postings
from .worker import Task

#: A store asks its worker to index a vector kind once its writes put this many rows of it unindexed (a search
#: scores the unindexed rows exactly; the rows a closed store left are indexed at the next store's ask).
INDEX_EVERY = 32

Planned = dict[Kind, dict[tuple[str, ...], Prepared]]

#: Which of some ids a table holds, with their groups (the lookup of :func:`tkg.integrity.check_write`).
_HELD = "SELECT id, group_id FROM {{s}}.{table} WHERE id = ANY(%s::text[])"


class Writes(Session):
    def write(self, batch: WriteBatch) -> None:
        planned = prepare(batch.puts, self.dim)
        deletes = [(Kind(kind), str(rid)) for kind, rid in batch.deletes]
        self._transaction(lambda cur: self._apply(cur, planned, deletes))
        self._maintain_behind(planned, deletes)

    def _maintain_behind(self, planned: Planned, deletes: Sequence[tuple[Kind, str]] = ()) -> None:
        """Hand the worker (.worker, a thread) what this write leaves behind, once it is committed (the write
        returns at once; the worker runs beside the writers):

        - the text kinds whose packs may be far behind, to check and repack (.terms.repack_steps): at this store's
          first write of a kind, then once enough postings changed;
        - the vector kinds of which this store put enough rows unindexed, to index them (.vectors.index_steps);
        - the vector kinds of which it deleted rows, to vacuum once enough of the table is dead (.worker).
        """
        with self._lock:  # the counters are this store's, shared by its threads
            due = [k for k, n in self._postings_since.items() if n >= terms.CHECK_EVERY or k not in self._packs_checked]
            for kind in due:
                self._postings_since[kind] = 0
                self._packs_checked.add(kind)  # the first write of each kind checks: a short-lived process writes few
            self._unindexed_since.update({kind: len(planned[kind]) for kind in VECTOR_TABLES if kind in planned})
            unindexed = [k for k, n in self._unindexed_since.items() if n >= INDEX_EVERY]
            for kind in unindexed:
                self._unindexed_since[kind] = 0
        self._worker.ask([*((Task.REPACK, k) for k in due), *((Task.INDEX, k) for k in unindexed)])
        removed = Counter(kind for kind, _ in deletes if kind in VECTOR_TABLES)
        if removed:
            self._worker.deleted(dict(removed))

    def flush(self) -> None:
        """Check every text kind's packs now and repack those far behind, index every vector kind's unindexed rows,
        and vacuum the vector kinds' tables with many dead rows; returns once done (a store does this on its own,
        after its writes, off their path)."""
        self._worker.ask(
            [
                *((Task.REPACK, k) for k in TEXT_KINDS),
                *((Task.INDEX, k) for k in VECTOR_TABLES),
                *((Task.VACUUM, k) for k in VECTOR_TABLES),
            ]
        )
        self._worker.wait()

    def wait_for_maintenance(self, timeout: float | None = None) -> bool:
        """Wait until the repacks and indexing the writes asked for are done (tests and benchmarks); False on
        timeout."""
        return self._worker.wait(timeout)

    def load(self, records: Iterable[Record]) -> None:
        """Bulk-load records into an empty store (snapshot import): one transaction, search indexes built once at
        the end instead of row by row."""
        planned = prepare(list(records), self.dim)

        def body(cur: psycopg.Cursor[Any]) -> None:
            # The packs' lock, exclusively and first: a writer meanwhile waits holding nothing (taking it shared in
            # _apply and exclusively only to repack could deadlock with one that holds it shared already); before
            # it, the repacks' locks, in the order a repack takes them (.terms.repack_steps).
            for lock in [*(terms.repack_lock(self.schema, kind) for kind in TEXT_KINDS), self._packs_lock]:
                cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [lock])
            if cur.execute(self._q("SELECT 1 FROM {s}.counts LIMIT 1")).fetchone() is not None:
                raise BackendError(f"load() needs an empty store; schema {self.schema!r} already holds records")
            cur.execute("SELECT set_config('maintenance_work_mem', %s, true)", [f"{self._build_memory_mb}MB"])
            for name in SEARCH_INDEXES:
                cur.execute(self._q(f"DROP INDEX IF EXISTS {{s}}.{name}"))
            self._apply(cur, planned, [], indexed=True)  # the HNSW indexes are built below
            for kind in TEXT_KINDS:
                terms.repack(cur, self._q, kind, self.schema)
            for statement in SEARCH_INDEXES.values():
                cur.execute(self._q(statement))
            cur.execute(self._q(ANALYZE))

        self._transaction(body)
        # Mark the loaded pages all-visible, so that searches read the postings and the facts' sketches from their
        # covering indexes alone (VACUUM cannot run inside the load's transaction; autovacuum does the same later
        # for other writes).
        self._read(lambda cur: cur.execute(self._q(VACUUM_LOADED)))

    def _apply(
        self, cur: psycopg.Cursor[Any], planned: Planned, deletes: list[tuple[Kind, str]], *, indexed: bool = False
    ) -> None:
        """Reference checks (tkg.integrity, against what the transaction sees), then puts, deletes, counts. The
        rows put are marked ``indexed`` (else the worker indexes them: .vectors.index_steps)."""
        # First: no repack of the packed postings runs while this transaction may write postings (.terms).
        cur.execute("SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))", [self._packs_lock])
        locks_held = self._send_lock_checks(cur)
        records = [p.record for items in planned.values() for p in items.values()]
        # The reads the writes depend on go to the server together, one round trip (each on a cursor of its own,
        # read once all are sent): the records the batch points to (the integrity check's lookup), and the rows
        # of its puts that exist, locked in one order for every writer, kind by kind and by seq (no deadlocks).
        asked = {
            kind: self._send(cur, _HELD.format(table=TABLES[kind].name), [ids])
            for kind, ids in references(records, deletes).items()
        }
        locking = {kind: self._send_existing(cur, kind, sorted(items)) for kind in Kind if (items := planned.get(kind))}
        held = {kind: {str(i): str(g) for i, g in c.fetchall()} for kind, c in asked.items()}
        locks_held()
        check_write(records, deletes, lambda kind, ids: held[kind])
        delta: Counter[tuple[str, str]] = Counter()
        text = Delta()
        for kind in Kind:
            items = planned.get(kind)
            if items:
                # The puts go in batch order, so that new records get their insertion order (seq) as the batch
                # gives it.
                existing = locking[kind].fetchall()
                for row in existing:
                    delta[(kind.value, row[1])] -= 1
                for item in items.values():
                    delta[(kind.value, item.record.group_id)] += 1
                # A rewrite that leaves the search text as it was (a fact invalidated, or mentioned by one more
                # episode) keeps its postings: nothing marked stale, nothing to index again.
                same = _same_text(kind, existing, items)
                if existing:
                    self._drop_derived(cur, kind, [key[0] for key in items], text, same)
                self._upsert(cur, kind, list(items.values()), indexed)
                self._add_derived(cur, kind, [item.record for item in items.values()], text, same)
        deleted = keys_of(deletes)
        for kind, keys in deleted.items():
            self._existing(cur, kind, sorted(keys))  # locked first, as for puts: a rewrite in flight finishes first
            self._drop_derived(cur, kind, [key[0] for key in keys], text)
            for (group,) in self._delete(cur, kind, keys):
                delta[(kind.value, group)] -= 1
        self._count(cur, delta, text.tokens)
        self._postings_since.update(text.postings)

    # Rows derived from a record and kept beside it in the same transaction: the BM25 postings of a text record
    # (.terms), and a fact's verdicts as (named fact, seq) rows, from which facts_judging reads.
    def _drop_derived(
        self, cur: psycopg.Cursor[Any], kind: Kind, ids: list[str], text: Delta, same: Set[str] = frozenset()
    ) -> None:
        """Remove what was derived from the stored records ``ids`` (before their rows change or go), but the
        postings of those whose search text stays the ``same``."""
        if kind in TEXT_KINDS:
            drop_postings(cur, self._q, kind, [i for i in ids if i not in same], text)
        if kind is Kind.FACT:
            cur.execute(
                self._q(
                    "DELETE FROM {s}.fact_verdicts v USING {s}.facts r WHERE r.id = ANY(%s::text[]) AND v.seq = r.seq"
                ),
                [ids],
            )

    def _add_derived(
        self, cur: psycopg.Cursor[Any], kind: Kind, records: list[Record], text: Delta, same: Set[str] = frozenset()
    ) -> None:
        """Derive the rows of ``records``, already written (their rows carry their seq), but the postings of those
        whose search text stayed the ``same`` (kept)."""
        if kind in TEXT_KINDS:
            add_postings(cur, self._q, kind, [r for r in records if r.id not in same], text)
        if kind is Kind.FACT:
            judged = [(r.id, named) for r in records if isinstance(r, Fact) for named in r.verdicts]
            if judged:
                cur.execute(
                    self._q(
                        "INSERT INTO {s}.fact_verdicts (named, seq) SELECT u.named, r.seq "
                        "FROM unnest(%s::text[], %s::text[]) AS u(id, named) JOIN {s}.facts r ON r.id = u.id"
                    ),
                    [[j[0] for j in judged], [j[1] for j in judged]],
                )

    def _upsert(self, cur: psycopg.Cursor[Any], kind: Kind, items: list[Prepared], indexed: bool) -> None:
        cur.executemany(self._q(upsert_statement(kind, indexed)), [p.values for p in items])

    def _existing(self, cur: psycopg.Cursor[Any], kind: Kind, keys: list[tuple[str, ...]]) -> list[tuple[Any, ...]]:
        """The rows of ``keys`` that exist, locked: (seq, group_id), then for a text kind id and the
        :data:`~tkg.models.SEARCH_FIELDS`."""
        return self._send_existing(cur, kind, keys).fetchall()

    def _send_existing(self, cur: psycopg.Cursor[Any], kind: Kind, keys: list[tuple[str, ...]]) -> psycopg.Cursor[Any]:
        """:meth:`_existing`'s read, sent: its rows are read from the cursor returned."""
        table = TABLES[kind]
        columns = ", ".join(("seq", "group_id", *(("id", *SEARCH_FIELDS[kind]) if kind in TEXT_KINDS else ())))
        statement = f"SELECT {columns} FROM {{s}}.{table.name} WHERE {key_filter(kind)} ORDER BY seq FOR UPDATE"
        return self._send(cur, statement, key_params(keys))

    def _delete(self, cur: psycopg.Cursor[Any], kind: Kind, keys: list[tuple[str, ...]]) -> list[tuple[str]]:
        table = TABLES[kind]
        statement = self._q(f"DELETE FROM {{s}}.{table.name} WHERE {key_filter(kind)} RETURNING group_id")
        return cur.execute(statement, key_params(sorted(keys))).fetchall()

    def _count(
        self, cur: psycopg.Cursor[Any], delta: Counter[tuple[str, str]], tokens: Counter[tuple[str, str]]
    ) -> None:
        """Add the changes of records (``delta``) and of their total length in tokens to ``counts``."""
        changes = sorted((k, g, delta[(k, g)], tokens[(k, g)]) for (k, g) in delta.keys() | tokens.keys())
        changes = [c for c in changes if c[2] or c[3]]
        if not changes:
            return
        kinds, groups = [c[0] for c in changes], [c[1] for c in changes]
        cur.execute(
            self._q(
                "INSERT INTO {s}.counts (kind, group_id, n, tokens) "
                "SELECT * FROM unnest(%s::text[], %s::text[], %s::int8[], %s::int8[]) "
                "ON CONFLICT (kind, group_id) DO UPDATE "
                "SET n = counts.n + excluded.n, tokens = counts.tokens + excluded.tokens"
            ),
            [kinds, groups, [c[2] for c in changes], [c[3] for c in changes]],
        )
        cur.execute(
            self._q(
                "DELETE FROM {s}.counts c USING unnest(%s::text[], %s::text[]) AS d(kind, group_id) "
                "WHERE c.kind = d.kind AND c.group_id = d.group_id AND c.n <= 0"
            ),
            [kinds, groups],
        )


def _same_text(kind: Kind, existing: list[tuple[Any, ...]], items: dict[tuple[str, ...], Prepared]) -> set[str]:
    """The ids among ``items`` (puts of ``kind``) whose stored row (of :meth:`Writes._existing`) has the same group
    and search fields: their search text, and so their postings and the corpus statistics, stay as they are."""
    if kind not in TEXT_KINDS:
        return set()
    fields = SEARCH_FIELDS[kind]

    def values(row: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(tuple(v) if isinstance(v, list | tuple) else v for v in row)

    stored = {row[2]: values((row[1], *row[3:])) for row in existing}
    return {
        rid
        for (rid, *_), item in items.items()
        if stored.get(rid) == values((item.record.group_id, *(getattr(item.record, f) for f in fields)))
    }
