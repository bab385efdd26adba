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
    """What a write changes in the corpus statistics: the documents' length in tokens, by (kind, group)."""

    def __init__(self) -> None:
        self.tokens: Counter[tuple[str, str]] = Counter()


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
            "WHERE r.id = ANY(%s::text[]) AND p.seq = r.seq RETURNING r.group_id, p.tf"
        ),
        [list(ids)],
    ).fetchall()
    for group, tf in rows:
        delta.tokens[(kind.value, group)] -= tf


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
