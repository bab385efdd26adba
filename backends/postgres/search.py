"""Searches of a PostgreSQL store: cosine k-NN over pgvector's HNSW index (exact when the index walk comes back
short) and full text over tsvector + GIN, ranked with all-terms matches first."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from tkg.embedders.base import check_vectors
from tkg.errors import BackendError
from tkg.models import VECTOR_FIELD, Kind, Vector
from tkg.storage import Hit
from tkg.timeline import Scope

from .records import TEXT_KINDS
from .schema import TABLES
from .scope import scope_where
from .session import Session


def _tsquery(lexemes: Sequence[str], operator: str) -> str:
    """Lexemes joined by ``|`` or ``&`` in tsquery syntax, each quoted (so no lexeme is parsed again)."""
    quoted = ("'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'" for lexeme in lexemes)
    return f" {operator} ".join(quoted)


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
