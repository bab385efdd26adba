"""Full text in PostgreSQL as BM25: an inverted index of tkg's own tokens, kept in the write's transaction.

Each text table (episodes, entities, facts, communities) has a postings table ``<table>_terms`` -- one row per
(term, record) with the term's frequency in the record and the record's length in tokens -- whose primary key
(term, seq) covers the frequency and length, so a query reads its terms' postings from the index alone. The
corpus statistics BM25 needs are the number of postings of a term (its document frequency) and, kept beside them
in the same transaction, the documents' total length (the ``tokens`` column of ``counts``, per group, as ``n``
counts them). A query (:mod:`.search`) scores the postings with the formula of :mod:`tkg.tokens` over the
statistics of the moment, so PostgreSQL returns the scores and ranking of the in-memory backend and the reference
store (float64 sums, compared as :func:`~tkg.tokens.rank_score`, equal scores in insertion order).

Pure SQL text and Python bookkeeping; :mod:`.writes`, :mod:`.search` and the schema migration run it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Sequence
from typing import Any

import psycopg
from psycopg import sql

from tkg.models import TEXT_KINDS, Kind, Record, search_text
from tkg.tokens import tokenize

from .records import from_rows, select
from .schema import TABLES, render

Render = Callable[[str], sql.Composed]


class Delta:
    """What a write changes in the corpus statistics (the documents' length in tokens, by (kind, group)) and how
    many postings it wrote and records it dropped, by kind (what :func:`behind` checks after enough of them)."""

    def __init__(self) -> None:
        self.tokens: Counter[tuple[str, str]] = Counter()
        self.postings: Counter[Kind] = Counter()


def postings_table(kind: Kind) -> str:
    return f"{TABLES[kind].name}_terms"


def add_postings(cur: psycopg.Cursor[Any], q: Render, kind: Kind, records: Sequence[Record], delta: Delta) -> None:
    """Index ``records`` (already written, so their rows carry their ``seq``) and count them into ``delta``."""
    ids: list[str] = []
    terms: list[str] = []
    tfs: list[int] = []
    lengths: list[int] = []
    for record in records:
        tokens = tokenize(search_text(record))
        counts = Counter(tokens)
        dl = len(tokens)
        for term, tf in counts.items():
            ids.append(record.id)
            terms.append(term)
            tfs.append(tf)
            lengths.append(dl)
        delta.tokens[(kind.value, record.group_id)] += dl
    delta.postings[kind] += len(ids)
    if not ids:
        return
    table = TABLES[kind].name
    cur.execute(
        q(
            f"INSERT INTO {{s}}.{postings_table(kind)} (term, seq, tf, dl) SELECT u.term, r.seq, u.tf, u.dl "
            "FROM unnest(%s::text[], %s::text[], %s::int4[], %s::int4[]) AS u(id, term, tf, dl) "
            f"JOIN {{s}}.{table} r ON r.id = u.id"
        ),
        [ids, terms, tfs, lengths],
    )


def drop_postings(cur: psycopg.Cursor[Any], q: Render, kind: Kind, ids: Sequence[str], delta: Delta) -> None:
    """Remove the postings of the records ``ids`` (before their rows change or go), mark those of them that are
    packed as stale, and count them out of ``delta``."""
    if not ids:
        return
    table = TABLES[kind].name
    rows = cur.execute(
        q(
            f"WITH gone AS (DELETE FROM {{s}}.{postings_table(kind)} p USING {{s}}.{table} r "
            "WHERE r.id = ANY(%(ids)s::text[]) AND p.seq = r.seq RETURNING r.group_id, p.tf), "
            f"stale AS (INSERT INTO {{s}}.{table}_stale (seq, mark) SELECT r.seq, {MARK} FROM {{s}}.{table} r "
            f"WHERE r.id = ANY(%(ids)s::text[]) AND r.seq <= ({MARKED_UPTO}) "
            "ON CONFLICT (seq) DO UPDATE SET mark = excluded.mark) "
            "SELECT group_id, tf FROM gone"
        ),
        {"ids": list(ids), "kind": kind.value},
    ).fetchall()
    for group, tf in rows:
        delta.tokens[(kind.value, group)] -= tf
    delta.postings[kind] += len(ids)


# -- packed postings ----------------------------------------------------------------------------------------------
# A kind's postings are also kept packed per term in <table>_packs: every posting of seq <= the kind's upto
# (table packed) as POSTING bytes, sorted by seq, so a query reads a common term's postings as one value rather
# than an index entry each (~0.2 us a posting through the index). What changed since is read beside it: the
# postings of seq > upto (from the postings table's index), and the current postings of the records of seq <=
# upto that were rewritten or deleted since (<table>_stale), whose packed postings are ignored.
#
# A repack (repack_steps) packs everything again without making the writers wait while it packs (0.4 s for the
# facts at 100,000, 6.6 s at a million):
# 1. the cut: under the advisory lock every write transaction takes shared as its first statement, taken
#    exclusively for one statement, so that no write is in flight: upto-to-be S = the kind's highest seq, stored as
#    packed.pending. Every later write gets higher seqs, and marks a record it rewrites or deletes stale up to S.
# 2. the build, in a snapshot taken after the cut: the postings of seq <= S packed as the next generation, beside
#    the current one (readers take packed.gen's); the stale marks the snapshot sees are read.
# 3. the swap, one short transaction: gen, upto = S, pending cleared; the stale marks read in 2 removed, unless a
#    write has marked the record again since (a mark is the marking transaction's id), so exactly the records
#    rewritten or deleted after the snapshot stay stale.
# A repack that stops half-way leaves the current generation in use and a pending upto (writes mark a little more
# as stale until the next repack); the next repack drops the half-built generation.

#: One posting as bytes: big-endian seq (int8), tf (int4), dl (int4); 16 bytes.
POSTING = "int8send(seq) || int4send(tf) || int4send(dl)"

#: The kind's upto (0: nothing packed), a scalar subquery over %(kind)s.
UPTO = "SELECT coalesce(max(upto), 0) FROM {s}.packed WHERE kind = %(kind)s"
#: The kind's packed generation, the one readers take (a scalar subquery over %(kind)s).
GEN = "SELECT coalesce(max(gen), 0) FROM {s}.packed WHERE kind = %(kind)s"
#: Up to which seq a write marks a record it rewrites or deletes stale: upto, or a repack's pending upto.
MARKED_UPTO = "SELECT coalesce(max(greatest(upto, pending)), 0) FROM {s}.packed WHERE kind = %(kind)s"
#: A stale mark: the id of the transaction that marks.
MARK = "pg_current_xact_id()::text::int8"

#: A write checks how far the packs are behind once it and the writes before it in this store have written or
#: dropped this many postings of a kind. A repack runs when the records written since the last one reach
#: REPACK_SHARE of the kind's records (and at least REPACK_MIN), or the stale ones STALE_SHARE (at least
#: STALE_MIN, at most STALE_MAX): a stale record costs every query more, as its current postings are looked up by
#: (term, record) -- at a million facts, 300 stale facts cost a fact search ~3.5 ms, 3,000 ~15 ms -- so it waits
#: for fewer. (A rewrite that keeps the search text, as most rewrites of a fact do, marks nothing stale.)
CHECK_EVERY = 4096
REPACK_MIN = 2048
REPACK_SHARE = 0.25
STALE_MIN = 512
STALE_SHARE = 1 / 32
STALE_MAX = 2048


def postings_lock(schema: str) -> str:
    """The advisory lock's name for the packs of ``schema`` (hashed with hashtextextended)."""
    return f"tkg-postings:{schema}"


def repack_lock(schema: str, kind: Kind) -> str:
    """The advisory lock a repack of ``kind`` in ``schema`` holds from start to end: one at a time."""
    return f"tkg-repack:{schema}:{kind.value}"


def behind(cur: psycopg.Cursor[Any], q: Render, kind: Kind) -> bool:
    """Whether the packs of ``kind`` are behind enough to be repacked."""
    table = TABLES[kind].name
    row = cur.execute(
        q(
            f"SELECT (SELECT count(*) FROM {{s}}.{table} WHERE seq > ({UPTO})), "
            f"(SELECT count(*) FROM {{s}}.{table}_stale), "
            "(SELECT coalesce(max(records), 0) FROM {s}.packed WHERE kind = %(kind)s)"
        ),
        {"kind": kind.value},
    ).fetchone()
    assert row is not None  # scalar subqueries always give one row
    since, stale, records = (int(v) for v in row)
    stale_limit = min(STALE_MAX, max(STALE_MIN, STALE_SHARE * records))
    return since >= max(REPACK_MIN, REPACK_SHARE * records) or stale >= stale_limit


def _pack(cur: psycopg.Cursor[Any], q: Render, kind: Kind, gen: int, upto: int | None) -> None:
    """Write the packs of generation ``gen``: every posting of ``kind`` (of seq <= ``upto``, if given)."""
    table, postings = TABLES[kind].name, postings_table(kind)
    cur.execute(
        q(
            f"INSERT INTO {{s}}.{table}_packs (term, gen, postings) "
            f"SELECT term, %(gen)s, string_agg({POSTING}, '' ORDER BY seq) FROM {{s}}.{postings} "
            "WHERE seq <= %(upto)s GROUP BY term"
        ),
        {"gen": gen, "upto": upto if upto is not None else 2**63 - 1},
    )


def _scalar(on: psycopg.Connection[Any] | psycopg.Cursor[Any], statement: sql.Composed, params: Any = None) -> int:
    row = on.execute(statement, params).fetchone()
    assert row is not None  # an aggregate always gives one row
    return int(row[0])


def _records(cur: psycopg.Cursor[Any], q: Render, kind: Kind) -> int:
    return _scalar(cur, q("SELECT coalesce(sum(n), 0) FROM {s}.counts WHERE kind = %(kind)s"), {"kind": kind.value})


def repack(cur: psycopg.Cursor[Any], q: Render, kind: Kind, schema: str) -> None:
    """Pack every posting of ``kind`` in the caller's transaction, holding :func:`postings_lock` exclusively so
    that writers wait (a bulk load and the packs' backfill; a live store repacks with :func:`repack_steps`). It
    first waits for a repack of :func:`repack_steps` under way (:func:`repack_lock`; take it before the packs' lock,
    as repack_steps does)."""
    for lock in (repack_lock(schema, kind), postings_lock(schema)):
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [lock])
    table, postings = TABLES[kind].name, postings_table(kind)
    gen = _scalar(cur, q(GEN), {"kind": kind.value}) + 1  # a new generation: readers may hold the old one's packs
    cur.execute(q(f"DELETE FROM {{s}}.{table}_packs"))
    _pack(cur, q, kind, gen, None)
    cur.execute(q(f"DELETE FROM {{s}}.{table}_stale"))
    cur.execute(
        q(
            "INSERT INTO {s}.packed (kind, upto, records, gen) "
            f"SELECT %(kind)s, (SELECT coalesce(max(seq), 0) FROM {{s}}.{postings}), %(records)s, %(gen)s "
            "ON CONFLICT (kind) DO UPDATE SET upto = excluded.upto, records = excluded.records, gen = excluded.gen, "
            "pending = NULL"
        ),
        {"kind": kind.value, "records": _records(cur, q, kind), "gen": gen},
    )


Steps = Generator[str, None, None]


def repack_steps(conn: psycopg.Connection[Any], q: Render, kind: Kind, schema: str) -> Steps:
    """Repack ``kind`` on ``conn`` (autocommit, this repack's alone) while writers go on (the steps in the comment
    above), yielding after each step: "cut", "snapshot" and "built" (inside the build's transaction), "swapped".
    Yields nothing when another repack of ``kind`` holds the schema's repack lock (that one does the work)."""
    mine = repack_lock(schema, kind)
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", [mine]).fetchone()
    if row is None or not row[0]:
        return
    try:
        yield from _repack_steps(conn, q, kind, postings_lock(schema))
    finally:
        if not conn.closed and not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [mine])


def _repack_steps(conn: psycopg.Connection[Any], q: Render, kind: Kind, lock: str) -> Steps:
    table = TABLES[kind].name
    params: dict[str, Any] = {"kind": kind.value}
    with conn.transaction():  # 1. the cut: no write in flight
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [lock])
        upto = _scalar(conn, q(f"SELECT coalesce(max(seq), 0) FROM {{s}}.{table}"))
        conn.execute(
            q(
                "INSERT INTO {s}.packed (kind, upto, records, pending) VALUES (%(kind)s, 0, 0, %(upto)s) "
                "ON CONFLICT (kind) DO UPDATE SET pending = excluded.pending"
            ),
            {**params, "upto": upto},
        )
    yield "cut"
    with conn.transaction(), conn.cursor() as cur:  # 2. the build, in one snapshot taken after the cut
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        gen = _scalar(cur, q(GEN), params)
        yield "snapshot"
        cur.execute(q(f"DELETE FROM {{s}}.{table}_packs WHERE gen <> %(gen)s"), {"gen": gen})  # a half-built one
        _pack(cur, q, kind, gen + 1, upto)
        yield "built"
        marks = cur.execute(
            q(f"SELECT seq, mark FROM {{s}}.{table}_stale WHERE seq <= %(upto)s"), {"upto": upto}
        ).fetchall()
        records = _records(cur, q, kind)
    with conn.transaction():  # 3. the swap
        swapped = conn.execute(
            q(
                "UPDATE {s}.packed SET gen = %(gen)s + 1, upto = %(upto)s, records = %(records)s, pending = NULL "
                "WHERE kind = %(kind)s AND gen = %(gen)s"
            ),
            {**params, "gen": gen, "upto": upto, "records": records},
        ).rowcount
        if swapped != 1:
            raise psycopg.errors.SerializationFailure(f"the {kind.value} packs changed generation during a repack")
        conn.execute(
            q(
                f"DELETE FROM {{s}}.{table}_stale s USING unnest(%(seqs)s::int8[], %(marks)s::int8[]) AS d(seq, mark) "
                "WHERE s.seq = d.seq AND s.mark = d.mark"
            ),
            {"seqs": [m[0] for m in marks], "marks": [m[1] for m in marks]},
        )
    yield "swapped"
    conn.execute(q(f"DELETE FROM {{s}}.{table}_packs WHERE gen <> %(gen)s"), {"gen": gen + 1})


def index_stored(conn: psycopg.Connection[Any], q: Render, kind: Kind, page: int = 5000) -> None:
    """Write the postings and statistics of every ``kind`` record already stored (the migration to schema 3)."""
    # Only the columns of version 3 are read (it runs right after that migration, before the later ones).
    delta = Delta()
    after = 0
    statement = q(f"{select(kind, version=3)} WHERE seq > %s ORDER BY seq LIMIT {page}")
    with conn.cursor() as cur:
        while rows := cur.execute(statement, [after]).fetchall():
            after = rows[-1][0]
            add_postings(cur, q, kind, from_rows(kind, rows), delta)
        changes = sorted((group, n) for (_, group), n in delta.tokens.items() if n)
        if changes:
            cur.execute(
                q(
                    "UPDATE {s}.counts c SET tokens = c.tokens + d.n FROM unnest(%s::text[], %s::int8[]) AS d(g, n) "
                    "WHERE c.kind = %s AND c.group_id = d.g"
                ),
                [[c[0] for c in changes], [c[1] for c in changes], kind.value],
            )


def index_all(conn: psycopg.Connection[Any], schema: str) -> None:
    """The schema 3 backfill (:func:`.schema.ensure_schema`): postings and statistics of every stored record."""
    for kind in TEXT_KINDS:
        index_stored(conn, lambda text: render(text, schema), kind)


def pack_all(conn: psycopg.Connection[Any], schema: str) -> None:
    """The backfill of the packs (:func:`.schema.ensure_schema`, after the migration to schema 9, whose columns
    :func:`repack` writes): the packs of every text kind not packed yet (a schema older than 8)."""

    def q(text: str) -> sql.Composed:
        return render(text, schema)

    with conn.cursor() as cur:
        for kind in TEXT_KINDS:
            if not cur.execute(q("SELECT 1 FROM {s}.packed WHERE kind = %(kind)s"), {"kind": kind.value}).fetchone():
                repack(cur, q, kind, schema)
