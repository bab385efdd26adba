"""Searches of a PostgreSQL store: cosine k-NN over pgvector's HNSW index (exact when the index walk comes back
short), the closest facts around entities by their bit sketches, and BM25 over the postings tables of
:mod:`.terms`, scored and ranked as every backend does."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import psycopg

from tkg.embedders.base import check_vectors
from tkg.errors import BackendError
from tkg.models import VECTOR_FIELD, Fact, Kind, Vector
from tkg.storage import Hit
from tkg.timeline import Scope
from tkg.tokens import K1, B, idf, rank_score, tokenize
from tkg.vector_sketches import BITS, EXACT_UP_TO, candidate_count, sketch_text

from .records import TEXT_KINDS, from_rows, select
from .schema import TABLES
from .scope import scope_where
from .session import Session
from .terms import postings_table

# A query first scores only the documents holding one of its rarest terms when their postings are at most this
# share of all its postings (and the others hold at least _PRUNE_MIN postings): see text_search.
_RARE_SHARE = 1 / 3
_PRUNE_MIN = 200


def split_rare(weighed: Sequence[tuple[str, int, float]]) -> tuple[list[str], float]:
    """The rarest terms of ``(term, df, most it can add to a score)`` whose postings are at most ``_RARE_SHARE``
    of the query's, and what the other terms can add at most together (the bound on a document holding none of
    the rare ones); ``([], 0)`` when scoring every posting is as cheap."""
    total = sum(df for _, df, _ in weighed)
    rare: list[str] = []
    seen = 0
    for term, df, _ in sorted(weighed, key=lambda t: (t[1], t[0])):
        if seen + df > total * _RARE_SHARE:
            break
        rare.append(term)
        seen += df
    if not rare or total - seen < _PRUNE_MIN:
        return [], 0.0
    return rare, sum(most for term, _, most in weighed if term not in rare)


#: The documents of a kind, their total length in tokens, and each query term's document frequency.
CORPUS_STATISTICS = (
    "SELECT (SELECT coalesce(sum(n), 0) FROM {s}.counts WHERE kind = %(kind)s), "
    "(SELECT coalesce(sum(tokens), 0) FROM {s}.counts WHERE kind = %(kind)s), "
    "array(SELECT array[coalesce(d.df, 0), coalesce(d.max_tf, 0), coalesce(d.min_dl, 0)] "
    "FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS u(term, i) "
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
    # MaxScore over the rare terms: their postings alone give each document a partial score and the k-th best
    # admitted one (a floor: full scores are higher); a document can reach the top k only if its partial score
    # plus what the other terms can add at most (%(bound)s) reaches the floor, and only those few
    # are completed by index lookups. No row comes back when fewer than k admitted documents hold a rare term.
    pruned = (
        f"WITH partial AS MATERIALIZED (SELECT p.seq, sum({part}) AS score "
        "FROM unnest(%(rare)s::text[], %(rare_weights)s::float8[]) AS u(term, w) "
        f"JOIN {{s}}.{postings} p ON p.term = u.term GROUP BY p.seq), "
        "floor AS (SELECT min(t.score) AS score, count(*) AS n FROM (SELECT s.score FROM "
        f"(SELECT seq, score FROM partial ORDER BY score DESC) s CROSS JOIN LATERAL (SELECT 1 FROM {{s}}.{table} r "
        f"WHERE r.seq = s.seq AND {where}) r LIMIT %(k)s) t), "
        "candidates AS (SELECT s.seq FROM partial s, floor f "
        "WHERE f.n = %(k)s AND s.score + %(bound)s >= f.score * (1 - 1e-9)) "
        f"SELECT r.id, s.score FROM (SELECT c.seq, sum({part})::float4 AS score FROM candidates c CROSS JOIN {terms} "
        f"JOIN {{s}}.{postings} p ON p.term = u.term AND p.seq = c.seq GROUP BY c.seq{ranked}"
    )
    return scored, pruned


def _index_walk_or_exact(
    indexed: Any, exact: Any, params: dict[str, Any], k: int
) -> Callable[[psycopg.Cursor[Any]], list[Any]]:
    """A read that runs ``indexed`` (a form that can walk the HNSW index) and, when the walk comes back with fewer
    than ``k`` rows, ``exact`` (a scan that scores every admitted row)."""

    def run(cur: psycopg.Cursor[Any]) -> list[Any]:
        rows = cur.execute(indexed, params).fetchall()
        return rows if len(rows) >= k else cur.execute(exact, params).fetchall()

    return run


def _similarity(distance: float | None) -> float:
    """pgvector's cosine distance as a similarity (a zero vector's NaN distance, or none, scores 0)."""
    return 1.0 - distance if distance is not None and not math.isnan(distance) else 0.0


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

        rows = self._read(_index_walk_or_exact(indexed, exact, params, k))
        hits = [(_similarity(d), seq, rid) for rid, seq, d in rows]
        hits.sort(key=lambda h: (-h[0], h[1]))
        return [Hit(rid, score) for score, _, rid in hits]

    def closest_facts(
        self, entity_ids: Sequence[str], vector: Vector, k: int, relation: str, *, same: bool = True
    ) -> list[tuple[Fact, float]]:
        query = check_vectors(vector, self.dim)[0]
        if k <= 0 or not entity_ids:
            return []
        params: dict[str, Any] = {
            "ids": list(entity_ids),
            "relation": relation,
            "q": query,
            "k": int(k),
            "mine": sketch_text(query[None, :])[0],
            "want": candidate_count(int(k)),
            "exact": EXACT_UP_TO,
        }
        # The neighbourhood's sketches come from an index-only scan of the (entity, relation) indexes, which carry
        # them (schema 6); the closest by sketch (all of them up to EXACT_UP_TO) are read from the table and scored
        # exactly, as the in-memory store does (tkg.vector_sketches). Not the HNSW index: its walk under this filter
        # is crowded out by the facts the filter refuses, those of the other relations or of other entities.
        columns = select(Kind.FACT).removesuffix(" FROM {s}.facts")
        op = "=" if same else "<>"
        statement = self._q(
            "WITH around AS MATERIALIZED ("
            "SELECT seq, sketch FROM {s}.facts WHERE source_id = ANY(%(ids)s::text[]) "
            f"AND relation {op} %(relation)s AND sketch IS NOT NULL UNION ALL "
            "SELECT seq, sketch FROM {s}.facts WHERE target_id = ANY(%(ids)s::text[]) "
            f"AND relation {op} %(relation)s AND NOT source_id = ANY(%(ids)s::text[]) AND sketch IS NOT NULL), "
            f"closest AS (SELECT seq FROM around ORDER BY bit_count(sketch # %(mine)s::bit({BITS})), seq "
            "LIMIT (SELECT CASE WHEN count(*) > %(exact)s THEN %(want)s END FROM around)), "
            "best AS (SELECT seq, embedding <=> %(q)s AS distance FROM {s}.facts "
            "WHERE seq IN (SELECT seq FROM closest) ORDER BY distance, seq LIMIT %(k)s) "
            f"{columns}, best.distance FROM best JOIN {{s}}.facts USING (seq) ORDER BY best.distance, seq"
        )
        rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
        facts = from_rows(Kind.FACT, [row[:-1] for row in rows])
        return [(f, float(np.float32(_similarity(row[-1])))) for f, row in zip(facts, rows, strict=True)]

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
            assert row is not None  # an aggregate always gives one row
            documents, tokens, found = int(row[0]), int(row[1]), list(row[2])
            average = max(1e-9, tokens / documents) if documents else 1.0
            weighed = []  # (term, idf, df, the most it adds to any document's score: its highest tf part)
            for term, (df, max_tf, min_dl) in zip(terms, found, strict=True):
                if df:
                    w = idf(documents, df)
                    weighed.append((term, w, df, w * max_tf / (K1 * (1 - B + B * min_dl / average) + max_tf)))
            if not weighed:
                return []
            params.update(terms=[t[0] for t in weighed], weights=[t[1] for t in weighed], average=average)
            # A document holding none of the rare terms scores at most what the others can add. So when the
            # documents holding a rare term fill the top k above that, no other document can enter it: score
            # those instead of every posting (MaxScore).
            rare, bound = split_rare([(t[0], t[2], t[3]) for t in weighed])
            if rare:
                weight = {t[0]: t[1] for t in weighed}
                rows = cur.execute(
                    self._q(pruned), {**params, "rare": rare, "rare_weights": [weight[t] for t in rare], "bound": bound}
                ).fetchall()
                if len(rows) == k and rows[-1][1] > rank_score(bound * (1 + 1e-9)):
                    return rows
            return cur.execute(self._q(scored), params).fetchall()

        return [Hit(rid, float(score)) for rid, score in self._read(run)]
