"""Searches of a PostgreSQL store: cosine k-NN over pgvector's HNSW index (exact when the index walk comes back
short) and BM25 over the postings tables of :mod:`.terms`, scored and ranked as every backend does."""

from __future__ import annotations

import math
from typing import Any

import psycopg

from tkg.embedders.base import check_vectors
from tkg.errors import BackendError
from tkg.models import VECTOR_FIELD, Kind, Vector
from tkg.storage import Hit
from tkg.timeline import Scope
from tkg.tokens import K1, B, idf, rank_score, tokenize

from .records import TEXT_KINDS
from .schema import TABLES
from .scope import scope_where
from .session import Session
from .terms import postings_table

# A term held by more than this share of a kind's documents (and more than _COMMON_MIN of them) is common: a
# query that also has rarer terms first scores only the documents holding one of those (see text_search).
_COMMON_SHARE = 0.01
_COMMON_MIN = 100

#: The documents of a kind, their total length in tokens, and each query term's document frequency.
CORPUS_STATISTICS = (
    "SELECT (SELECT coalesce(sum(n), 0) FROM {s}.counts WHERE kind = %(kind)s), "
    "(SELECT coalesce(sum(tokens), 0) FROM {s}.counts WHERE kind = %(kind)s), "
    "array(SELECT coalesce(d.df, 0) FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS u(term, i) "
    "LEFT JOIN {s}.text_df d ON d.kind = %(kind)s AND d.term = u.term ORDER BY u.i)"
)


def bm25_statements(kind: Kind, where: str) -> tuple[str, str]:
    """The top-k BM25 query over every posting of the query's terms, and the same over the documents holding
    one of the ``rare`` terms only. Each term's part is computed as :mod:`tkg.tokens` writes it (the same float64
    operations in the same order); the sum is ranked as its float4 (``rank_score``), equal scores by ``seq``."""
    postings, table = postings_table(kind), TABLES[kind].name
    part = "u.w * p.tf / (%(k1)s * (1 - %(b)s + %(b)s * p.dl / %(average)s) + p.tf)"
    terms = "unnest(%(terms)s::text[], %(weights)s::float8[]) AS u(term, w)"
    # Documents are scored and sorted first, then looked up by seq in that order until k pass the scope: the
    # scope's filter is read for the best documents only, not for the whole table.
    ranked = (
        f" ORDER BY score DESC, seq) s CROSS JOIN LATERAL (SELECT r.id FROM {{s}}.{table} r "
        f"WHERE r.seq = s.seq AND {where}) r ORDER BY s.score DESC, s.seq LIMIT %(k)s"
    )
    scored = (
        f"SELECT r.id, s.score FROM (SELECT p.seq, sum({part})::float4 AS score FROM {terms} "
        f"JOIN {{s}}.{postings} p ON p.term = u.term GROUP BY p.seq{ranked}"
    )
    pruned = (
        f"SELECT r.id, s.score FROM (SELECT c.seq, sum({part})::float4 AS score FROM "
        f"(SELECT DISTINCT seq FROM {{s}}.{postings} WHERE term = ANY(%(rare)s::text[])) c CROSS JOIN {terms} "
        f"JOIN {{s}}.{postings} p ON p.term = u.term AND p.seq = c.seq GROUP BY c.seq{ranked}"
    )
    return scored, pruned


class Search(Session):
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
        if kind not in TEXT_KINDS:
            raise BackendError(f"{kind} records have no text to search")
        terms = list(dict.fromkeys(tokenize(query)))
        if k <= 0 or not terms:
            return []  # nothing asked, or stop words only
        params: dict[str, Any] = {"kind": kind.value, "terms": terms, "k": int(k), "k1": K1, "b": B}
        where = scope_where(kind, scope, params)
        scored, pruned = bm25_statements(kind, where)

        def run(cur: psycopg.Cursor[Any]) -> list[Any]:
            row = cur.execute(self._q(CORPUS_STATISTICS), params).fetchone()
            documents, tokens, dfs = int(row[0]), int(row[1]), list(row[2])
            weighed = [(t, idf(documents, df), df) for t, df in zip(terms, dfs, strict=True) if df]
            if not weighed:
                return []
            params.update(
                terms=[t for t, _, _ in weighed],
                weights=[w for _, w, _ in weighed],
                average=max(1e-9, tokens / documents),
            )
            # A document's score is below the sum of its terms' idf (each term's part is idf * tf / (norm + tf)).
            # So when the documents holding a rare term fill the top k with scores above what the common terms
            # alone could give, no other document can enter it: score those few instead of every posting.
            common = [(t, w) for t, w, df in weighed if df > max(_COMMON_MIN, documents * _COMMON_SHARE)]
            if common and len(common) < len(weighed):
                rare = [t for t, _, _ in weighed if t not in dict(common)]
                rows = cur.execute(self._q(pruned), {**params, "rare": rare}).fetchall()
                if len(rows) == k and rows[-1][1] > rank_score(sum(w for _, w in common)):
                    return rows
            return cur.execute(self._q(scored), params).fetchall()

        return [Hit(rid, float(score)) for rid, score in self._read(run)]
