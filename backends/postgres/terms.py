"""Full text in PostgreSQL as BM25: an inverted index of tkg's own tokens, kept in the write's transaction.

Each text table (episodes, entities, facts, communities) has a postings table ``<table>_terms`` -- one row per
(term, record) with the term's frequency in the record and the record's length in tokens -- whose primary key
(term, seq) covers the frequency and length, so a query reads its terms' postings from the index alone. The
corpus statistics BM25 needs are kept beside it in the same transaction: ``text_df`` (the number of documents of
a kind holding each term) and the ``tokens`` column of ``counts`` (the documents' total length, per group, as
``n`` counts them). A query scores with the formula of :mod:`tkg.tokens` over the statistics of the moment, so
PostgreSQL returns the scores and ranking of the in-memory backend and the reference store (float64 sums,
compared as :func:`~tkg.tokens.rank_score`, equal scores in insertion order).

Pure SQL text and Python bookkeeping; :mod:`.writes`, :mod:`.search` and the schema migration run it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from tkg.models import Kind, Record, search_text
from tkg.tokens import tokenize

from .records import TEXT_KINDS, from_rows, select
from .schema import TABLES, render

Render = Callable[[str], sql.Composed]


class Delta:
    """What a write changes in the corpus statistics: documents per term (by kind), tokens per group, and each
    term's peaks -- the highest frequency and the shortest document among its new postings -- from which a query
    bounds what the term can add to any document's score (``text_df.max_tf`` / ``min_dl`` only ever widen: a
    bound that a removal leaves loose is still a bound)."""

    def __init__(self) -> None:
        self.df: Counter[tuple[str, str]] = Counter()
        self.tokens: Counter[tuple[str, str]] = Counter()
        self.dropped: dict[tuple[str, str, str], tuple[int, int]] = {}  # (kind, id, term) -> its removed (tf, dl)
        self.peaks: dict[tuple[str, str], tuple[int, int]] = {}  # (kind, term) -> (max tf, min dl) added


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
            key = (kind.value, term)
            delta.df[key] += 1
            if delta.dropped.get((kind.value, record.id, term)) != (
                tf,
                dl,
            ):  # a posting put back as it was widens nothing
                peak = delta.peaks.get(key)
                delta.peaks[key] = (tf, dl) if peak is None else (max(peak[0], tf), min(peak[1], dl))
        delta.tokens[(kind.value, record.group_id)] += dl
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
    """Remove the postings of the records ``ids`` (before their rows change) and count them out of ``delta``."""
    if not ids:
        return
    rows = cur.execute(
        q(
            f"DELETE FROM {{s}}.{postings_table(kind)} p USING {{s}}.{TABLES[kind].name} r "
            "WHERE r.id = ANY(%s::text[]) AND p.seq = r.seq RETURNING r.id, r.group_id, p.term, p.tf, p.dl"
        ),
        [list(ids)],
    ).fetchall()
    for rid, group, term, tf, dl in rows:
        delta.df[(kind.value, term)] -= 1
        delta.tokens[(kind.value, group)] -= tf
        delta.dropped[(kind.value, rid, term)] = (tf, dl)


_NO_PEAK = (0, 2**31 - 1)  # leaves a row's max_tf / min_dl as they are


def apply_df(cur: psycopg.Cursor[Any], q: Render, delta: Delta) -> None:
    """Add ``delta``'s document frequencies and peaks to ``text_df`` (in one order for every writer: no
    deadlocks); a replaced record whose text did not change changes nothing, so no row is locked for it."""
    keys = sorted({key for key, n in delta.df.items() if n} | delta.peaks.keys())
    if not keys:
        return
    kinds, terms = [k for k, _ in keys], [t for _, t in keys]
    peaks = [delta.peaks.get(key, _NO_PEAK) for key in keys]
    cur.execute(
        q(
            "INSERT INTO {s}.text_df (kind, term, df, max_tf, min_dl) "
            "SELECT * FROM unnest(%s::text[], %s::text[], %s::int8[], %s::int4[], %s::int4[]) "
            "ON CONFLICT (kind, term) DO UPDATE SET df = text_df.df + excluded.df, "
            "max_tf = greatest(text_df.max_tf, excluded.max_tf), min_dl = least(text_df.min_dl, excluded.min_dl)"
        ),
        [kinds, terms, [delta.df[key] for key in keys], [p[0] for p in peaks], [p[1] for p in peaks]],
    )
    cur.execute(
        q(
            "DELETE FROM {s}.text_df d USING unnest(%s::text[], %s::text[]) AS x(kind, term) "
            "WHERE d.kind = x.kind AND d.term = x.term AND d.df <= 0"
        ),
        [kinds, terms],
    )


def index_stored(conn: psycopg.Connection[Any], q: Render, kind: Kind, page: int = 5000) -> None:
    """Write the postings and statistics of every ``kind`` record already stored (the migration to schema 3)."""
    # select() names the columns of today's records; should a later migration add a column to a text table,
    # this must read only the columns of version 3 (it runs before that migration).
    delta = Delta()
    after = 0
    statement = q(f"{select(kind)} WHERE seq > %s ORDER BY seq LIMIT {page}")
    with conn.cursor() as cur:
        while rows := cur.execute(statement, [after]).fetchall():
            after = rows[-1][0]
            add_postings(cur, q, kind, from_rows(kind, rows), delta)
        apply_df(cur, q, delta)
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
