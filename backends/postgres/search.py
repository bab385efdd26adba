"""Searches of a PostgreSQL store: cosine k-NN over pgvector's HNSW index (exact when the index walk comes back
short), the closest facts around entities by their bit sketches, and BM25 over the postings tables of
:mod:`.terms`, scored and ranked as every backend does."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg

from tkg.cosines import cosines, inverse_norms
from tkg.embedders.base import check_vectors
from tkg.errors import BackendError
from tkg.models import TEXT_KINDS, VECTOR_FIELD, Fact, Kind, Record, Vector
from tkg.selection import top_k
from tkg.storage import Candidates, Closest, Hit, Store, check_candidates
from tkg.timeline import Scope
from tkg.tokens import bm25_sums, idf, term_part, tokenize
from tkg.vector_sketches import BITS, EXACT_UP_TO, candidate_count, sketch_text

from .pack_cache import Held
from .records import from_rows, select
from .schema import TABLES
from .scope import index_bounds, scope_where
from .session import Session
from .terms import GEN, POSTING, UPTO, postings_table


def postings_statement(kind: Kind) -> str:
    """Rows of (part, term, a, b, bytes) from one snapshot: part 0 (one row) holds the documents of ``kind`` and
    their total length in tokens, the seqs of its stale records (packed postings to ignore) as int8 bytes, and in
    place of a term the generation of the packs in use; part 1, a query term's packed postings of that generation,
    unless the caller holds them (%(held)s, of generation %(held_gen)s: :mod:`.pack_cache`); part 2, a query term's
    postings written since (seq above upto, or of a stale record: one of seq <= upto; a repack under way marks
    records above it). Postings as :data:`.terms.POSTING` bytes."""
    table, postings = TABLES[kind].name, postings_table(kind)
    return (
        f"SELECT 0, ({GEN})::text, (SELECT coalesce(sum(n), 0) FROM {{s}}.counts WHERE kind = %(kind)s)::int8, "
        "(SELECT coalesce(sum(tokens), 0) FROM {s}.counts WHERE kind = %(kind)s)::int8, "
        f"(SELECT string_agg(int8send(seq), '') FROM {{s}}.{table}_stale WHERE seq <= ({UPTO})) UNION ALL "
        f"SELECT 1, term, NULL, NULL, postings FROM {{s}}.{table}_packs WHERE term = ANY(%(terms)s::text[]) "
        f"AND gen = ({GEN}) AND NOT (gen = %(held_gen)s AND term = ANY(%(held)s::text[])) UNION ALL "
        f"SELECT 2, term, NULL, NULL, string_agg({POSTING}, '') FROM {{s}}.{postings} "
        f"WHERE term = ANY(%(terms)s::text[]) AND seq > ({UPTO}) GROUP BY term UNION ALL "
        f"SELECT 2, term, NULL, NULL, string_agg({POSTING}, '') FROM {{s}}.{postings} "
        f"WHERE term = ANY(%(terms)s::text[]) AND seq = ANY(ARRAY(SELECT seq FROM {{s}}.{table}_stale "
        f"WHERE seq <= ({UPTO}))) GROUP BY term"
    )


_POSTING = np.dtype([("seq", ">i8"), ("tf", ">i4"), ("dl", ">i4")])  # the layout of .terms.POSTING

#: The best documents are checked against the scope in batches, this many times k first (then the next ones, until
#: four times as many are checked, each time fewer than k of them passed).
_FIRST_BATCH = 2

#: Where an index finds what a scope admits (:func:`.scope.index_bounds`), up to this many admitted records are
#: read at once instead of checking the best documents in batches.
_ADMITTED_SET = 1024
# Rows a cosine read takes past the k it wants: scored again exactly (tkg.cosines), a row pgvector put just past
# the cut may tie with, or beat, the last one before it. A read whose rows are all within _DISTANCE_SLACK of the
# k-th reads again, four times as many.
_PAST_THE_CUT = 16
_DISTANCE_SLACK = 1e-6


def best_first(
    seqs: npt.NDArray[np.int64], scores: npt.NDArray[np.float32], first: int
) -> Iterator[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]]:
    """Documents and their scores best first, equal scores in seq order (``seqs`` ascending, as
    :func:`bm25_ranked` gives them), in batches: the best ``first`` (by :func:`~tkg.selection.top_k`, without
    ranking them all), then, ranked once, the next ones until four times as many are given, and so on."""
    best = top_k(seqs, scores, first)
    yield (
        np.fromiter((seq for seq, _ in best), np.int64, len(best)),
        np.fromiter((score for _, score in best), np.float32, len(best)),
    )
    if len(seqs) <= first:
        return
    order = np.argsort(-scores, kind="stable")  # a stable sort keeps equal scores in seq order, as top_k does
    start = first
    while start < len(order):
        part = order[start : 4 * start]
        yield seqs[part], scores[part]
        start *= 4


def _among(seqs: npt.NDArray[np.int64], ids: dict[int, str]) -> npt.NDArray[np.int64]:
    """The positions in ``seqs`` of the seqs that are keys of ``ids``, in order."""
    return np.flatnonzero(np.isin(seqs, np.fromiter(ids, np.int64, len(ids)))) if ids else np.zeros(0, np.int64)


def int8_array(values: npt.NDArray[np.int64]) -> str:
    """``values`` as the text of a PostgreSQL int8[] (psycopg adapts a list element by element: ~0.7 us each, 10 ms
    for the 14k documents of a search whose scope admits few; the text form costs ~0.1 us each)."""
    return "{" + ",".join(map(str, values.tolist())) + "}"


@dataclass(frozen=True)
class TermPostings:
    """A term's postings as native arrays: record seqs, term frequencies and document lengths (the two as float64,
    as :func:`~tkg.tokens.term_part` takes them). A pack's are sorted by seq (:func:`.terms._pack`)."""

    seq: npt.NDArray[np.int64]
    tf: npt.NDArray[np.float64]
    dl: npt.NDArray[np.float64]

    @staticmethod
    def decode(data: bytes) -> TermPostings:
        """From :data:`.terms.POSTING` bytes."""
        raw = np.frombuffer(data, dtype=_POSTING)
        return TermPostings(raw["seq"].astype(np.int64), raw["tf"].astype(np.float64), raw["dl"].astype(np.float64))

    def __len__(self) -> int:
        return len(self.seq)

    @property
    def nbytes(self) -> int:
        return int(self.seq.nbytes + self.tf.nbytes + self.dl.nbytes)

    def without(self, stale: npt.NDArray[np.int64]) -> TermPostings:
        """These postings (sorted by seq, each seq once: a pack's) but those of the ``stale`` seqs, found by binary
        search."""
        if not len(stale) or not len(self.seq):
            return self
        at = np.searchsorted(self.seq, stale)
        inside = at < len(self.seq)
        at, wanted = at[inside], stale[inside]
        at = at[self.seq[at] == wanted]
        if not len(at):
            return self
        keep = np.ones(len(self.seq), dtype=bool)
        keep[at] = False
        return TermPostings(self.seq[keep], self.tf[keep], self.dl[keep])


_EMPTY = TermPostings(np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0))


@dataclass(frozen=True)
class Postings:
    """What one read of :func:`postings_statement` found for a query's terms: the corpus statistics, the packs'
    generation and stale seqs (sorted), each term's packed postings of that generation (read or held; empty when
    it has none) and its postings written since."""

    documents: int
    tokens: int
    gen: int
    stale: npt.NDArray[np.int64]
    packs: dict[str, TermPostings]
    fresh: dict[str, list[TermPostings]]

    @property
    def average(self) -> float:
        return max(1e-9, self.tokens / self.documents) if self.documents else 1.0

    def columns(self, terms: Sequence[str]) -> list[tuple[float, list[TermPostings]]]:
        """Each query term holding postings, in query order: its idf (its document frequency is the number of its
        postings, the packed ones of stale records left out) and its postings, packed then written since."""
        columns = []
        for term in terms:
            parts = [p for p in (self.packs[term].without(self.stale), *self.fresh.get(term, ())) if len(p)]
            df = sum(map(len, parts))
            if df:
                columns.append((idf(self.documents, df), parts))
        return columns


def read_postings(terms: Sequence[str], rows: Sequence[tuple[Any, ...]], held: Held) -> Postings:
    """The :class:`Postings` of ``rows`` (of :func:`postings_statement`, asked with ``held``): the held packs
    stand for those the server left out, when of its generation."""
    documents = tokens = 0
    gen = -1
    stale = np.zeros(0, dtype=np.int64)
    packs: dict[str, TermPostings] = {}
    fresh: dict[str, list[TermPostings]] = {}
    for part, term, n, length, data in rows:  # UNION ALL keeps no order
        if part == 0:
            gen, documents, tokens = int(term), int(n), int(length)
            if data:
                stale = np.sort(np.frombuffer(data, dtype=">i8").astype(np.int64))
        elif part == 1:
            packs[term] = TermPostings.decode(data)
        elif data:
            fresh.setdefault(term, []).append(TermPostings.decode(data))
    for term in terms:
        if term not in packs:
            packs[term] = held.packs.get(term, _EMPTY) if held.gen == gen else _EMPTY
    return Postings(documents, tokens, gen, stale, packs, fresh)


def bm25_ranked(terms: Sequence[str], read: Postings) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """The documents (seqs) holding a query term and their BM25 scores as every backend ranks them
    (:func:`~tkg.tokens.rank_score`): each term's part computed and the parts summed in query-term order
    (:mod:`tkg.tokens`), with the statistics of the same snapshot."""
    average = read.average
    columns = [(p.seq, term_part(weight, p.tf, p.dl, average)) for weight, parts in read.columns(terms) for p in parts]
    if not columns:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    seqs, sums = bm25_sums(columns)
    return seqs, sums.astype(np.float32)


def _index_walk_or_exact(
    indexed: Any, exact: Any, params: dict[str, Any], k: int
) -> Callable[[psycopg.Cursor[Any]], list[Any]]:
    """A read that runs ``indexed`` (a form that can walk the HNSW index, the walk's rows flagged true in their
    last column) and, when the walk comes back with fewer than ``k`` rows, ``exact`` (a scan that scores every
    admitted row)."""

    def run(cur: psycopg.Cursor[Any]) -> list[Any]:
        rows = cur.execute(indexed, params).fetchall()
        return rows if sum(row[-1] for row in rows) >= k else cur.execute(exact, params).fetchall()

    return run


def _read_past_the_cut(read: Callable[[int], list[Any]], distance: Callable[[Any], float | None], k: int) -> list[Any]:
    """The rows of ``read(limit)`` (closest first by pgvector's distance) for the best ``k`` by exact score:
    _PAST_THE_CUT past k, and four times as many while the rows read end among near ties of the k-th."""
    limit = int(k) + _PAST_THE_CUT
    while True:
        rows = read(limit)
        if not _tied_past_the_cut([distance(row) for row in rows], k, limit):
            return rows
        limit *= 4  # more rows nearly as close as the k-th than were read


def _tied_past_the_cut(distances: Sequence[float | None], k: int, read: int) -> bool:
    """Did a read of ``read`` rows stop among rows nearly as close as its ``k``-th (pgvector's distances, an ulp or
    so off the exact ones), so that one it left out may tie with those it kept?"""
    known = sorted(d for d in distances if d is not None and not math.isnan(d))
    # rows of exactly the k-th's distance (one text stored many times) come in insertion order: no need to read on
    return len(distances) >= read and len(known) > k and known[k - 1] < known[-1] <= known[k - 1] + _DISTANCE_SLACK


def _exact_scores(vectors: Sequence[Any], query: npt.NDArray[np.float32]) -> list[float]:
    """The cosine of each stored vector with the unit ``query``, as every store scores it (:mod:`tkg.cosines`)."""
    if not vectors:
        return []
    rows = np.asarray(vectors, dtype=np.float32)
    return cosines(rows, query, inverse_norms(rows)).tolist()


class Search(Session):
    def get_together(self, asks: Sequence[tuple[Kind, Sequence[str]]]) -> list[list[Record | None]]:
        # The records a search shows, of each target: on search_connections connections at once, as candidates.
        return self._together([partial(self.get, kind, ids) for kind, ids in asks])

    def closest_facts_together(self, asks: Sequence[Closest]) -> list[list[tuple[Fact, float]]]:
        # A new fact's first reads around its ends (its relation, the others): on search_connections at once.
        return self._together(
            [
                partial(self.closest_facts, a.entity_ids, a.vector, a.k, a.relation, same=a.same, holding=a.holding)
                for a in asks
            ]
        )

    def candidates(self, asks: Sequence[Candidates], query: str, vector: Vector, scope: Scope) -> list[list[Hit]]:
        # Each list is one or two reads that wait on the server: they run on search_connections connections at once.
        check_candidates(asks)
        lists = self._together([partial(Store.candidates, self, [ask], query, vector, scope) for ask in asks])
        return [hits for (hits,) in lists]

    def vector_search(self, kind: Kind, vector: Vector, k: int, scope: Scope) -> list[Hit]:
        kind = Kind(kind)
        column = VECTOR_FIELD.get(kind)
        if column is None:
            raise BackendError(f"{kind} records have no vectors to search")
        query = check_vectors(vector, self.dim)[0]
        if k <= 0:
            return []
        params: dict[str, Any] = {"q": query}
        where = scope_where(kind, scope, params)
        table = TABLES[kind].name
        # The first form walks the HNSW index over the rows in it (marked indexed) and scores the rows not in it yet
        # exactly (distance + 0 is no index key; .worker indexes them after their write); the second is an exact
        # scan of every row, run only when the index walk came back short (fewer admitted rows than k, or a very
        # selective filter). The last column tells the walk's rows.
        # Each form reads _PAST_THE_CUT rows past k, with their vectors: they are scored again as every store
        # scores (tkg.cosines), and equal scores go in insertion order, where pgvector's own distance is an ulp off.
        walk = self._q(
            f"(SELECT id, seq, {column}, {column} <=> %(q)s, true FROM {{s}}.{table} WHERE indexed AND {column} IS "
            f"NOT NULL AND {where} ORDER BY {column} <=> %(q)s LIMIT %(k)s) UNION ALL "
            f"(SELECT id, seq, {column}, {column} <=> %(q)s, false FROM {{s}}.{table} WHERE NOT indexed AND "
            f"{column} IS NOT NULL AND {where} ORDER BY ({column} <=> %(q)s) + 0, seq LIMIT %(k)s)"
        )
        exact = self._q(
            f"SELECT id, seq, {column}, {column} <=> %(q)s, false FROM {{s}}.{table} WHERE {column} IS NOT NULL AND "
            f"{where} ORDER BY ({column} <=> %(q)s) + 0, seq LIMIT %(k)s"
        )

        def read(limit: int) -> list[Any]:
            return self._read(_index_walk_or_exact(walk, exact, {**params, "k": limit}, limit))

        rows = _read_past_the_cut(read, lambda row: row[3], k)
        scores = _exact_scores([row[2] for row in rows], query)
        hits = sorted(
            zip(scores, (row[1] for row in rows), (row[0] for row in rows), strict=True), key=lambda h: (-h[0], h[1])
        )
        return [Hit(rid, score) for score, _, rid in hits[:k]]

    def closest_facts(
        self,
        entity_ids: Sequence[str],
        vector: Vector,
        k: int,
        relation: str,
        *,
        same: bool = True,
        holding: bool = False,
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
        # them (schema 6). Up to EXACT_UP_TO facts, every one is scored exactly, read through the same indexes
        # straight from the table; above, the closest by sketch are read by seq and scored exactly, as the
        # in-memory store does (tkg.vector_sketches). Not the HNSW index: its walk under this filter is crowded
        # out by the facts the filter refuses, those of the other relations or of other entities. The facts still
        # holding (``holding``) have partial indexes of their own, which carry the same columns (schema 13).
        columns = select(Kind.FACT).removesuffix(" FROM {s}.facts")
        op = "=" if same else "<>"
        kept = " AND expired_at IS NULL" if holding else ""
        around = (  # the neighbourhood's facts, as the {picked} columns, on the {when} condition too
            "SELECT {picked} FROM {{s}}.facts WHERE source_id = ANY(%(ids)s::text[]) "
            f"AND relation {op} %(relation)s AND sketch IS NOT NULL{kept}{{when}} UNION ALL "
            "SELECT {picked} FROM {{s}}.facts WHERE target_id = ANY(%(ids)s::text[]) "
            f"AND relation {op} %(relation)s AND NOT source_id = ANY(%(ids)s::text[]) AND sketch IS NOT NULL{kept}"
            "{when}"
        )
        statement = self._q(
            "WITH around AS MATERIALIZED ("
            + around.format(picked="seq, sketch", when="")
            + "), many AS MATERIALIZED (SELECT count(*) > %(exact)s AS many FROM around), "
            "closest AS (SELECT seq FROM around WHERE (SELECT many FROM many) "
            f"ORDER BY bit_count(sketch # %(mine)s::bit({BITS})), seq LIMIT %(want)s), "
            "scored AS (SELECT seq, embedding <=> %(q)s AS distance FROM {s}.facts "
            "WHERE seq IN (SELECT seq FROM closest) UNION ALL "
            + around.format(picked="seq, embedding <=> %(q)s", when=" AND NOT (SELECT many FROM many)")
            + "), best AS (SELECT seq, distance FROM scored ORDER BY distance, seq LIMIT %(read)s) "
            f"{columns}, best.distance FROM best JOIN {{s}}.facts USING (seq) ORDER BY best.distance, seq"
        )
        # read past k and scored again exactly, as in vector_search
        rows = _read_past_the_cut(
            lambda limit: self._read(lambda cur: cur.execute(statement, {**params, "read": limit}).fetchall()),
            lambda row: row[-1],
            k,
        )
        facts = from_rows(Kind.FACT, [row[:-1] for row in rows])
        scores = _exact_scores([f.embedding for f in facts], query)
        found = sorted(zip(scores, (row[0] for row in rows), facts, strict=True), key=lambda h: (-h[0], h[1]))
        return [(f, score) for score, _, f in found[:k]]

    def text_search(self, kind: Kind, query: str, k: int, scope: Scope) -> list[Hit]:
        kind = Kind(kind)
        if kind not in TEXT_KINDS:
            raise BackendError(f"{kind} records have no text to search")
        terms = list(dict.fromkeys(tokenize(query)))
        if k <= 0 or not terms:
            return []  # nothing asked, or stop words only
        params: dict[str, Any] = {"kind": kind.value, "terms": terms}
        where = scope_where(kind, scope, params)
        postings = self._q(postings_statement(kind))
        table = TABLES[kind].name
        admitted = self._q(f"SELECT seq, id FROM {{s}}.{table} WHERE seq = ANY(%(seqs)s::int8[]) AND {where}")
        # Where an index reads only what the scope admits, the records it admits, when few (fewer than
        # _ADMITTED_SET): read once the best batch came back short, they settle the search in one statement.
        admitted_set = (
            self._q(f"SELECT seq, id FROM {{s}}.{table} WHERE {where} LIMIT {_ADMITTED_SET}")
            if index_bounds(kind, scope)
            else None
        )

        def run(cur: psycopg.Cursor[Any]) -> list[tuple[str, float]]:
            # Every posting of the query's terms is scored here, not in SQL (PostgreSQL's executor costs ~1 us per
            # posting it scores; a term's packed postings come as one value, or from the store's cache): the best
            # documents are then checked against the scope, best first, until k pass.
            held = self._pack_cache.held(kind, terms)
            rows = cur.execute(postings, {**params, "held": list(held.packs), "held_gen": held.gen}).fetchall()
            read = read_postings(terms, rows, held)
            self._pack_cache.keep(kind, read.gen, read.packs)
            seqs, scores = bm25_ranked(terms, read)
            if not len(seqs):
                return []
            found: list[tuple[str, float]] = []
            narrow = admitted_set
            for batch, batch_scores in best_first(seqs, scores, _FIRST_BATCH * k):
                ids = dict(cur.execute(admitted, {**params, "seqs": int8_array(batch)}).fetchall())
                found += [(ids[int(batch[i])], float(batch_scores[i])) for i in _among(batch, ids)[: k - len(found)]]
                if len(found) >= k or len(batch) == len(seqs):
                    break
                if narrow is not None:
                    rows = cur.execute(narrow, params).fetchall()
                    if len(rows) < _ADMITTED_SET:  # every record the scope admits: the best of them
                        ids = dict(rows)
                        inside = _among(seqs, ids)
                        return [(ids[seq], score) for seq, score in top_k(seqs[inside], scores[inside], k)]
                    narrow = None
            return found

        return [Hit(rid, score) for rid, score in self._read(run)]
