"""The reference store: the storage contract written as plainly as it can be, slow on purpose.

Every record lives in one dict per kind, in insertion order (a record put again after a delete is new: it goes to
the end). Every query is answered by looking at every record: exact cosine, BM25 computed from its definition over
the kind's live documents, a textbook breadth-first search. It is the specification the real backends are tested
against (``tests/test_store_conformance.py``), the way rdflib keeps a simple memory store beside its others. Use it
in tests, never for data that matters.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime

import numpy as np

from tkg.cosines import cosines, inverse_norms
from tkg.embedders.base import check_vectors
from tkg.errors import BackendError, EmbeddingError, ValidationError
from tkg.integrity import check_write
from tkg.models import (
    TEXT_KINDS,
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
    vector_of,
)
from tkg.names import normalize_name
from tkg.storage import Hit, Store, WriteBatch
from tkg.timeline import Scope
from tkg.tokens import K1, B, idf, rank_score, tokenize


class ReferenceStore(Store):
    """A brute-force :class:`~tkg.storage.Store` (see the module docstring).

    >>> ReferenceStore(dim=8).count(Kind.FACT)
    0
    """

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise ValidationError("dim must be positive")
        self.dim = dim
        self._records: dict[Kind, dict[str, Record]] = {kind: {} for kind in Kind}

    # -- writes --------------------------------------------------------------------------------------------------
    def write(self, batch: WriteBatch) -> None:
        check_write(batch.puts, batch.deletes, self._held)
        for record in batch.puts:
            vector = vector_of(record)
            if vector is not None:
                try:
                    check_vectors(vector, self.dim)
                except EmbeddingError as exc:
                    raise EmbeddingError(f"{record.kind} {record.id}: {exc}") from None
        for record in batch.puts:  # everything checked: now apply all of it
            self._records[record.kind][record.id] = record
        for kind, record_id in batch.deletes:
            self._records[Kind(kind)].pop(record_id, None)

    def _held(self, kind: Kind, ids: Collection[str]) -> Mapping[str, str]:
        table = self._records[kind]
        return {i: table[i].group_id for i in ids if i in table}

    # -- reads ---------------------------------------------------------------------------------------------------
    def get(self, kind: Kind, ids: Sequence[str]) -> list[Record | None]:
        return [self._records[Kind(kind)].get(i) for i in ids]

    def scan(self, kind: Kind, group_ids: frozenset[str] | None = None) -> Iterator[Record]:
        records = list(self._records[Kind(kind)].values())
        return iter([r for r in records if group_ids is None or r.group_id in group_ids])

    def count(self, kind: Kind, group_ids: frozenset[str] | None = None) -> int:
        return sum(1 for _ in self.scan(kind, group_ids))

    def groups(self) -> set[str]:
        return {r.group_id for table in self._records.values() for r in table.values()}

    def vector_search(self, kind: Kind, vector: Vector, k: int, scope: Scope) -> list[Hit]:
        if Kind(kind) not in VECTOR_FIELD:
            raise BackendError(f"{kind} records have no vectors to search")
        query = check_vectors(vector, self.dim)[0]
        found = []
        for position, record in enumerate(self._records[Kind(kind)].values()):
            stored = vector_of(record)
            if stored is not None and scope.admits(record):
                found.append((np.asarray(stored, dtype=np.float32), position, record.id))
        if not found:
            return []
        rows = np.array([row for row, _, _ in found], dtype=np.float32)
        scores = cosines(rows, query, inverse_norms(rows)).tolist()  # as every store scores (tkg.cosines)
        return _best([(score, p, i) for score, (_, p, i) in zip(scores, found, strict=True)], k)

    def text_search(self, kind: Kind, query: str, k: int, scope: Scope) -> list[Hit]:
        """BM25 (Lucene variant, :mod:`tkg.tokens`) over every live document of the kind, all groups: N, df and
        the average length are corpus-wide; each score is a float64 sum in query-term order, ranked and returned as
        :func:`~tkg.tokens.rank_score`."""
        if Kind(kind) not in TEXT_KINDS:
            raise BackendError(f"{kind} records have no text to search")
        records = list(self._records[Kind(kind)].values())
        documents = [Counter(tokenize(search_text(r))) for r in records]
        n = len(documents)
        average = sum(sum(d.values()) for d in documents) / n if n else 0.0
        terms = list(dict.fromkeys(tokenize(query)))
        hits = []
        for position, (record, document) in enumerate(zip(records, documents, strict=True)):
            if not scope.admits(record):
                continue
            score = 0.0
            length = sum(document.values())
            for term in terms:
                tf = document.get(term, 0)
                if tf:
                    df = sum(1 for d in documents if term in d)
                    score += idf(n, df) * tf / (K1 * (1 - B + B * length / max(average, 1e-9)) + tf)
            if score > 0:
                hits.append((rank_score(score), position, record.id))
        return _best(hits, k)

    def entities_by_name(self, group_id: str, names: Sequence[str]) -> dict[str, list[Entity]]:
        out: dict[str, list[Entity]] = {}
        for name in names:
            key = normalize_name(name)
            found = [
                e
                for e in self._records[Kind.ENTITY].values()
                if isinstance(e, Entity)
                and e.group_id == group_id
                and key in {normalize_name(n) for n in (e.name, *e.aliases)}
            ]
            if found:
                out[key] = found
        return out

    def facts_of(self, entity_ids: Sequence[str], scope: Scope | None = None) -> list[Fact]:
        wanted = set(entity_ids)
        return [
            f
            for f in self._records[Kind.FACT].values()
            if isinstance(f, Fact) and {f.source_id, f.target_id} & wanted and (scope is None or scope.admits(f))
        ]

    def bfs(self, seeds: Sequence[str], depth: int, scope: Scope, limit: int | None = None) -> dict[str, int]:
        entities = self._records[Kind.ENTITY]
        hops: dict[str, int] = {}
        queue: deque[str] = deque()
        for seed in seeds:
            if seed in entities and seed not in hops and scope.admits(entities[seed]):
                hops[seed] = 0
                queue.append(seed)
        while queue:
            current = queue.popleft()
            if hops[current] >= depth:
                continue
            for fact in self.facts_of([current], scope):
                other = fact.target_id if fact.source_id == current else fact.source_id
                if other not in hops:
                    if limit is not None and len(hops) >= limit:
                        return hops
                    hops[other] = hops[current] + 1
                    queue.append(other)
        return hops

    def mentions(
        self, episode_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Mention]:
        return [
            m
            for m in self._records[Kind.MENTION].values()
            if isinstance(m, Mention)
            and (episode_ids is None or m.episode_id in episode_ids)
            and (entity_ids is None or m.entity_id in entity_ids)
        ]

    def memberships(
        self, community_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Membership]:
        return [
            m
            for m in self._records[Kind.MEMBERSHIP].values()
            if isinstance(m, Membership)
            and (community_ids is None or m.community_id in community_ids)
            and (entity_ids is None or m.entity_id in entity_ids)
        ]

    def episode_facts(self, episode_id: str) -> list[Fact]:
        return [f for f in self._records[Kind.FACT].values() if isinstance(f, Fact) and episode_id in f.episodes]

    def _timeline(self, group_id: str) -> list[Episode]:
        """A group's episodes by reference time, then insertion."""
        episodes = [e for e in self._records[Kind.EPISODE].values() if isinstance(e, Episode)]
        return sorted((e for e in episodes if e.group_id == group_id), key=lambda e: e.reference_time)

    def recent_episodes(self, group_id: str, before: datetime, n: int) -> list[Episode]:
        earlier = [e for e in self._timeline(group_id) if e.reference_time <= before]
        return earlier[max(0, len(earlier) - n) :] if n > 0 else []

    def episode_window(self, episode_id: str, before: int, after: int) -> list[Episode]:
        episode = self._records[Kind.EPISODE].get(episode_id)
        if not isinstance(episode, Episode):
            return []
        timeline = self._timeline(episode.group_id)
        at = [e.id for e in timeline].index(episode_id)
        return timeline[max(0, at - before) : at + after + 1]


def _best(hits: list[tuple[float, int, str]], k: int) -> list[Hit]:
    """The ``k`` best (score, insertion position, id), best first; equal scores in insertion order."""
    hits.sort(key=lambda h: (-h[0], h[1]))
    return [Hit(record_id, score) for score, _, record_id in hits[: max(k, 0)]]
