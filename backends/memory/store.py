"""The in-memory backend: records in slot tables, numpy columns for filtering, hnswlib, bm25s and igraph.

Every kind of record lives in a :class:`_Table` of slots. Filtering by group and by the two timelines is done on
numpy columns (one boolean mask per query), and that mask is handed to the vector and text indexes, so search
never visits a Python object per record. Graph neighbourhoods use adjacency lists that grow with each write;
igraph builds a graph view only for whole-graph algorithms (igraph's edge insertion is O(|E|) per call, so it is
not kept up to date on every write).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import igraph
import numpy as np

from tkg.embedders.base import check_vectors
from tkg.errors import BackendError, EmbeddingError, ValidationError
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
from tkg.storage import Hit, WriteBatch
from tkg.timeline import Scope
from tkg.timeutil import to_micros

from .arrays import Column
from .text import TextIndex
from .vectors import Mask, VectorIndex

_MIN = np.iinfo(np.int64).min
_MAX = np.iinfo(np.int64).max
_TEXT_KINDS = (Kind.EPISODE, Kind.ENTITY, Kind.FACT, Kind.COMMUNITY)


def _us(value: datetime | None, missing: int) -> int:
    return missing if value is None else to_micros(value)


class _Table:
    """Slots of one kind: the records, their ids, and the numpy columns that filters run on."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.records: list[Record | None] = []
        self.slot_of: dict[str, int] = {}
        self.alive = Column(np.bool_, False)
        self.group = Column(np.int32, -1)
        self.created = Column(np.int64, _MAX)
        # Facts: event interval and expiry. Episodes: reference time in `valid`.
        self.valid = Column(np.int64, _MIN)
        self.invalid = Column(np.int64, _MAX)
        self.expired = Column(np.int64, _MAX)
        self.live = 0

    def slot_for(self, record_id: str) -> int:
        slot = self.slot_of.get(record_id)
        if slot is not None:
            return slot
        slot = len(self.records)
        self.records.append(None)
        self.slot_of[record_id] = slot
        for column in (self.alive, self.group, self.created, self.valid, self.invalid, self.expired):
            column.ensure(slot + 1)
        return slot

    def get(self, record_id: str) -> Record | None:
        slot = self.slot_of.get(record_id)
        return None if slot is None else self.records[slot]

    def mask(self, scope: Scope | None, group_codes: dict[str, int]) -> Mask:
        mask = self.alive.view().copy()
        if scope is None:
            return mask
        if scope.group_ids is not None:
            codes = [group_codes[g] for g in scope.group_ids if g in group_codes]
            groups = self.group.view()
            mask &= groups == codes[0] if len(codes) == 1 else np.isin(groups, codes)
        tx = to_micros(scope.known_at)
        mask &= self.created.view() <= tx
        if self.kind is Kind.FACT and scope.as_of is not None:
            at = to_micros(scope.as_of)
            expired = self.expired.view()
            # An invalidation learnt after known_at is not yet known then (expired_at None is stored as _MAX).
            invalid = np.where((expired > tx) & (expired != _MAX), _MAX, self.invalid.view())
            mask &= (self.valid.view() <= at) & (at < invalid)
        elif self.kind is Kind.EPISODE and scope.explicit_as_of and scope.as_of is not None:
            mask &= self.valid.view() <= to_micros(scope.as_of)
        return mask


class InMemoryStore:
    """A complete tkg store in process memory.

    >>> store = InMemoryStore(dim=384)
    >>> store.count(Kind.FACT)
    0
    """

    def __init__(
        self,
        dim: int,
        *,
        hnsw_m: int = 16,
        ef_construction: int = 100,
        ef_search: int = 64,
        vector_tail: int = 512,
        threads: int = 1,
    ) -> None:
        if dim < 1:
            raise ValidationError("dim must be positive")
        self.dim = dim
        self._tables = {kind: _Table(kind) for kind in Kind}
        self._vectors = {
            kind: VectorIndex(
                dim,
                m=hnsw_m,
                ef_construction=ef_construction,
                ef_search=ef_search,
                tail_limit=vector_tail,
                threads=threads,
            )
            for kind in VECTOR_FIELD
        }
        self._texts = {kind: TextIndex() for kind in _TEXT_KINDS}
        self._group_codes: dict[str, int] = {}
        self._group_counts: dict[str, int] = {}
        self._names: dict[tuple[str, str], set[str]] = {}
        self._adjacent: dict[str, set[str]] = {}  # entity id -> ids of facts touching it
        self._episode_facts: dict[str, set[str]] = {}
        self._mentions_by_episode: dict[str, set[str]] = {}
        self._mentions_by_entity: dict[str, set[str]] = {}
        self._timeline: dict[str, list[tuple[int, int]]] = {}  # group -> sorted (reference us, episode slot)

    # ------------------------------------------------------------------------------------------------------
    # writes
    def write(self, batch: WriteBatch) -> None:
        prepared = self._validate(batch)
        for record, vector in prepared:
            self._put(record, vector)
        for kind, record_id in batch.deletes:
            self._delete(kind, record_id)

    def _validate(self, batch: WriteBatch) -> list[tuple[Record, Vector | None]]:
        incoming: dict[tuple[Kind, str], Record] = {}
        for record in batch.puts:
            if not isinstance(record, tuple(RECORD_TYPES.values())):
                raise ValidationError(f"cannot store {type(record).__name__}; expected a tkg record")
            incoming[(record.kind, record.id)] = record
        deleting = {(Kind(kind), rid) for kind, rid in batch.deletes}

        def exists(kind: Kind, record_id: str) -> bool:
            if (kind, record_id) in incoming:
                return True
            return (kind, record_id) not in deleting and self._tables[kind].get(record_id) is not None

        prepared: list[tuple[Record, Vector | None]] = []
        for record in batch.puts:
            vector = None
            field = VECTOR_FIELD.get(record.kind)
            if field is not None and getattr(record, field) is not None:
                try:
                    vector = check_vectors(getattr(record, field), self.dim)[0]
                except EmbeddingError as exc:
                    raise EmbeddingError(f"{record.kind} {record.id}: {exc}") from None
            if isinstance(record, Fact):
                for end in (record.source_id, record.target_id):
                    if not exists(Kind.ENTITY, end):
                        raise BackendError(f"fact {record.id} points to entity {end!r}, which does not exist")
                    self._same_group(record, Kind.ENTITY, end, incoming)
            elif isinstance(record, Mention):
                if not exists(Kind.EPISODE, record.episode_id) or not exists(Kind.ENTITY, record.entity_id):
                    raise BackendError(f"mention {record.id} points to a missing episode or entity")
            elif isinstance(record, Membership) and not (
                exists(Kind.COMMUNITY, record.community_id) and exists(Kind.ENTITY, record.entity_id)
            ):
                raise BackendError(f"membership {record.id} points to a missing community or entity")
            prepared.append((record, vector))
        return prepared

    def _same_group(self, record: Fact, kind: Kind, record_id: str, incoming: dict[tuple[Kind, str], Record]) -> None:
        other = incoming.get((kind, record_id)) or self._tables[kind].get(record_id)
        if other is not None and other.group_id != record.group_id:
            raise BackendError(
                f"fact {record.id} in group {record.group_id!r} points to entity {record_id!r} of group "
                f"{other.group_id!r}; facts never cross groups"
            )

    def _put(self, record: Record, vector: Vector | None) -> None:
        table = self._tables[record.kind]
        slot = table.slot_for(record.id)
        old = table.records[slot]
        if old is not None:
            self._unindex(old, slot, keep_search=True)
        else:
            table.live += 1
            self._group_counts[record.group_id] = self._group_counts.get(record.group_id, 0) + 1
        table.records[slot] = record
        table.alive[slot] = True
        table.group[slot] = self._group_codes.setdefault(record.group_id, len(self._group_codes))
        table.created[slot] = to_micros(record.created_at)
        if isinstance(record, Fact):
            table.valid[slot] = _us(record.valid_at, _MIN)
            table.invalid[slot] = _us(record.invalid_at, _MAX)
            table.expired[slot] = _us(record.expired_at, _MAX)
            for end in (record.source_id, record.target_id):
                self._adjacent.setdefault(end, set()).add(record.id)
            for episode_id in record.episodes:
                self._episode_facts.setdefault(episode_id, set()).add(record.id)
        elif isinstance(record, Episode):
            ref = to_micros(record.reference_time)
            table.valid[slot] = ref
            bisect.insort(self._timeline.setdefault(record.group_id, []), (ref, slot))
        elif isinstance(record, Entity):
            for name in (record.name, *record.aliases):
                self._names.setdefault((record.group_id, normalize_name(name)), set()).add(record.id)
        elif isinstance(record, Mention):
            self._mentions_by_episode.setdefault(record.episode_id, set()).add(record.entity_id)
            self._mentions_by_entity.setdefault(record.entity_id, set()).add(record.episode_id)
        index = self._vectors.get(record.kind)
        if index is not None:
            if vector is None:
                index.remove(slot)
            else:
                index.set(slot, vector)
        text = self._texts.get(record.kind)
        if text is not None:
            text.set(slot, search_text(record))

    def _delete(self, kind: Kind, record_id: str) -> None:
        table = self._tables[kind]
        slot = table.slot_of.get(record_id)
        if slot is None or table.records[slot] is None:
            return
        record = table.records[slot]
        assert record is not None
        self._unindex(record, slot, keep_search=False)
        table.records[slot] = None
        table.alive[slot] = False
        table.live -= 1
        self._group_counts[record.group_id] -= 1
        if not self._group_counts[record.group_id]:
            del self._group_counts[record.group_id]

    def _unindex(self, record: Record, slot: int, *, keep_search: bool) -> None:
        """Remove a record from the secondary indexes (before replacing or deleting it)."""
        if isinstance(record, Fact):
            for end in (record.source_id, record.target_id):
                self._discard(self._adjacent, end, record.id)
            for episode_id in record.episodes:
                self._discard(self._episode_facts, episode_id, record.id)
        elif isinstance(record, Episode):
            timeline = self._timeline[record.group_id]
            timeline.pop(bisect.bisect_left(timeline, (to_micros(record.reference_time), slot)))
        elif isinstance(record, Entity):
            for name in (record.name, *record.aliases):
                self._discard(self._names, (record.group_id, normalize_name(name)), record.id)
        elif isinstance(record, Mention):
            self._discard(self._mentions_by_episode, record.episode_id, record.entity_id)
            self._discard(self._mentions_by_entity, record.entity_id, record.episode_id)
        if not keep_search:
            if record.kind in self._vectors:
                self._vectors[record.kind].remove(slot)
            if record.kind in self._texts:
                self._texts[record.kind].remove(slot)

    @staticmethod
    def _discard(index: dict[Any, set[str]], key: Any, value: str) -> None:
        values = index.get(key)
        if values is not None:
            values.discard(value)
            if not values:
                del index[key]

    # ------------------------------------------------------------------------------------------------------
    # reads
    def get(self, kind: Kind, ids: Sequence[str]) -> list[Record | None]:
        table = self._tables[Kind(kind)]
        return [table.get(i) for i in ids]

    def scan(self, kind: Kind, group_ids: frozenset[str] | None = None) -> Iterator[Record]:
        for record in list(self._tables[Kind(kind)].records):
            if record is not None and (group_ids is None or record.group_id in group_ids):
                yield record

    def count(self, kind: Kind, group_ids: frozenset[str] | None = None) -> int:
        table = self._tables[Kind(kind)]
        if group_ids is None:
            return table.live
        return int(np.count_nonzero(table.mask(Scope(group_ids, _FAR_FUTURE, None), self._group_codes)))

    def groups(self) -> set[str]:
        return set(self._group_counts)

    def vector_search(self, kind: Kind, vector: Vector, k: int, scope: Scope) -> list[Hit]:
        kind = Kind(kind)
        index = self._vectors.get(kind)
        if index is None:
            raise BackendError(f"{kind} records have no vectors to search")
        query = check_vectors(vector, self.dim)[0]
        mask = self._tables[kind].mask(scope, self._group_codes)
        return self._hits(kind, index.search(query, k, mask))

    def text_search(self, kind: Kind, query: str, k: int, scope: Scope) -> list[Hit]:
        kind = Kind(kind)
        index = self._texts.get(kind)
        if index is None:
            raise BackendError(f"{kind} records have no text to search")
        mask = self._tables[kind].mask(scope, self._group_codes)
        return self._hits(kind, index.search(query, k, mask))

    def _hits(self, kind: Kind, found: list[tuple[int, float]]) -> list[Hit]:
        records = self._tables[kind].records
        return [Hit(records[slot].id, score) for slot, score in found]  # type: ignore[union-attr]

    def entities_by_name(self, group_id: str, names: Sequence[str]) -> dict[str, list[Entity]]:
        table = self._tables[Kind.ENTITY]
        out: dict[str, list[Entity]] = {}
        for name in names:
            key = normalize_name(name)
            ids = self._names.get((group_id, key))
            if ids:
                out[key] = sorted((table.get(i) for i in ids), key=lambda e: table.slot_of[e.id])  # type: ignore
        return out

    def facts_of(self, entity_ids: Sequence[str], scope: Scope | None = None) -> list[Fact]:
        table = self._tables[Kind.FACT]
        ids = set().union(*(self._adjacent.get(e, ()) for e in entity_ids)) if entity_ids else set()
        slots = sorted(table.slot_of[i] for i in ids)
        facts = [table.records[s] for s in slots]
        return [f for f in facts if scope is None or scope.admits(f)]  # type: ignore[misc]

    def bfs(self, seeds: Sequence[str], depth: int, scope: Scope) -> dict[str, int]:
        entities = self._tables[Kind.ENTITY]
        facts = self._tables[Kind.FACT]
        hops: dict[str, int] = {}
        queue: deque[str] = deque()
        for seed in seeds:
            record = entities.get(seed)
            if record is not None and seed not in hops and scope.admits(record):
                hops[seed] = 0
                queue.append(seed)
        while queue:
            current = queue.popleft()
            if hops[current] >= depth:
                continue
            for fact_id in self._adjacent.get(current, ()):
                fact = facts.get(fact_id)
                if not isinstance(fact, Fact) or not scope.admits(fact):
                    continue
                other = fact.target_id if fact.source_id == current else fact.source_id
                if other not in hops:
                    hops[other] = hops[current] + 1
                    queue.append(other)
        return hops

    def mentions(
        self, episode_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Mention]:
        table = self._tables[Kind.MENTION]
        pairs: set[tuple[str, str]] = set()
        if episode_ids is not None:
            pairs = {(ep, en) for ep in episode_ids for en in self._mentions_by_episode.get(ep, ())}
            if entity_ids is not None:
                wanted = set(entity_ids)
                pairs = {p for p in pairs if p[1] in wanted}
        elif entity_ids is not None:
            pairs = {(ep, en) for en in entity_ids for ep in self._mentions_by_entity.get(en, ())}
        else:
            return [m for m in table.records if isinstance(m, Mention)]
        found = [table.get(f"{ep}>{en}") for ep, en in pairs]
        return sorted((m for m in found if isinstance(m, Mention)), key=lambda m: table.slot_of[m.id])

    def episode_facts(self, episode_id: str) -> list[Fact]:
        table = self._tables[Kind.FACT]
        ids = self._episode_facts.get(episode_id, ())
        return [table.records[s] for s in sorted(table.slot_of[i] for i in ids)]  # type: ignore[misc]

    def recent_episodes(self, group_id: str, before: datetime, n: int) -> list[Episode]:
        timeline = self._timeline.get(group_id, [])
        end = bisect.bisect_right(timeline, (to_micros(before), _MAX))
        records = self._tables[Kind.EPISODE].records
        return [records[slot] for _, slot in timeline[max(0, end - n) : end]]  # type: ignore[misc]

    # ------------------------------------------------------------------------------------------------------
    # graph algorithms and maintenance
    def entity_graph(self, group_id: str, scope: Scope) -> tuple[igraph.Graph, list[str]]:
        """An undirected igraph view of a group's entities, weighted by the number of admitted facts between
        each pair; returns the graph and the entity id of each vertex."""
        entities = [e for e in self.scan(Kind.ENTITY, frozenset({group_id})) if scope.admits(e)]
        index = {e.id: i for i, e in enumerate(entities)}
        weights: dict[tuple[int, int], int] = {}
        for fact in self.scan(Kind.FACT, frozenset({group_id})):
            assert isinstance(fact, Fact)
            a, b = index.get(fact.source_id), index.get(fact.target_id)
            if a is None or b is None or not scope.admits(fact):
                continue
            key = (min(a, b), max(a, b))
            weights[key] = weights.get(key, 0) + 1
        graph = igraph.Graph(n=len(entities), edges=list(weights), directed=False)
        graph.es["weight"] = list(weights.values())
        return graph, [e.id for e in entities]

    def flush(self) -> None:
        """Fold fresh items into the bulk indexes now (normally this happens in batches on its own)."""
        for vectors in self._vectors.values():
            vectors.flush()
        for text in self._texts.values():
            text.rebuild()

    def stats(self) -> dict[str, Any]:
        return {
            "records": {kind.value: table.live for kind, table in self._tables.items()},
            "groups": len(self._group_counts),
            "text_index": {kind.value: index.stats() for kind, index in self._texts.items()},
        }

    def load(self, records: Iterable[Record]) -> None:
        """Bulk-load records into an empty store (snapshots): one batched index build instead of many adds."""
        if any(t.live for t in self._tables.values()):
            raise BackendError("load() needs an empty store")
        batch = WriteBatch(puts=list(records))
        prepared = self._validate(batch)
        for text in self._texts.values():
            text.auto_rebuild = False
        try:
            for record, vector in prepared:
                self._put(record, vector)
        finally:
            for text in self._texts.values():
                text.auto_rebuild = True
        self.flush()


_FAR_FUTURE = datetime(9999, 12, 31, tzinfo=UTC)
