"""The in-memory backend: records in slot tables, numpy columns for filtering, hnswlib, bm25s and igraph.

Every kind of record lives in a :class:`_Table` of slots. Filtering by group and by the two timelines is done on
numpy columns (one boolean mask per query), and that mask is handed to the vector and text indexes, so search
never visits a Python object per record. Graph neighbourhoods use adjacency lists that grow with each write;
igraph builds a graph view only for whole-graph algorithms (igraph's edge insertion is O(|E|) per call, so it is
not kept up to date on every write).

Vectors are held once: a stored record's vector array is swapped (in place, values bit-identical) for a read-only
view of the vector index's row, which exact scoring reads too; hnswlib keeps its own copy for its graph walk.
Snapshots (:mod:`tkg.snapshot`) carry the HNSW graphs and BM25 arrays, which :meth:`InMemoryStore.restore_snapshot`
reuses after checking that they fit the records, so a load does not rebuild them.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from itertools import chain
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

import igraph
import numpy as np
import numpy.typing as npt

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
from tkg.timeline import Filters, Scope
from tkg.timeutil import to_micros

from .arrays import Column
from .text import TextIndex, TextMismatch
from .vectors import Mask, VectorIndex

_MIN = np.iinfo(np.int64).min
_MAX = np.iinfo(np.int64).max
_NONE_IN_FILE = np.iinfo(np.int64).min  # how tkg.snapshot writes an absent optional time
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
        # A superseded fact's end before the supersession: what a query known before its expiry believes.
        self.prior = Column(np.int64, _MAX)
        # Filters: a fact's relation code; one boolean column per entity label (labels are few).
        self.relation = Column(np.int32, -1)
        self.labels: dict[str, Column] = {}
        self.live = 0
        self.version = 0  # bumped on every change; cached masks are keyed by it
        # The slot each version bump since _log_base changed (touch()), so a cached mask can be brought up to date
        # by recomputing those slots alone. A bump that did not log (a bulk change) makes the log disagree with the
        # version, and masks are then recomputed whole.
        self._log: list[int] = []
        self._log_base = 0

    def touch(self, slot: int) -> None:
        """Record that ``slot`` changed: a new version."""
        if len(self._log) != self.version - self._log_base or len(self._log) > 4 * len(self.records) + 4096:
            # after a bulk change, or to keep the log bounded: masks of older versions recompute whole
            self._log.clear()
            self._log_base = self.version
        self.version += 1
        self._log.append(slot)

    def changed_since(self, version: int) -> npt.NDArray[np.int64] | None:
        """The slots changed after ``version`` (sorted, unique), or None when the log cannot say."""
        if version < self._log_base or len(self._log) != self.version - self._log_base:
            return None
        return np.unique(np.asarray(self._log[version - self._log_base :], dtype=np.int64))

    def slot_for(self, record_id: str) -> int:
        slot = self.slot_of.get(record_id)
        if slot is not None:
            return slot
        slot = len(self.records)
        self.records.append(None)
        self.slot_of[record_id] = slot
        columns = (self.alive, self.group, self.created, self.valid, self.invalid, self.expired, self.prior)
        for column in (*columns, self.relation):
            column.ensure(slot + 1)
        for column in self.labels.values():
            column.ensure(slot + 1)
        return slot

    def set_labels(self, slot: int, labels: Iterable[str]) -> None:
        wanted = set(labels)
        for label, column in self.labels.items():
            if slot < column.size:
                column[slot] = label in wanted
        for label in wanted - self.labels.keys():
            column = Column(np.bool_, False)
            column.ensure(self.alive.size)
            column[slot] = True
            self.labels[label] = column

    def get(self, record_id: str) -> Record | None:
        slot = self.slot_of.get(record_id)
        return None if slot is None else self.records[slot]

    def mask(
        self,
        scope: Scope | None,
        group_codes: dict[str, int],
        relation_codes: dict[str, int],
        rows: npt.NDArray[np.int64] | None = None,
    ) -> Mask:
        """The scope's mask over all slots, or over the slots ``rows`` only (in that order)."""

        def col(column: Column) -> npt.NDArray:  # type: ignore[type-arg]
            return column.view() if rows is None else column.view()[rows]

        mask = col(self.alive).copy()
        if scope is None:
            return mask
        if scope.group_ids is not None:
            codes = [group_codes[g] for g in scope.group_ids if g in group_codes]
            groups = col(self.group)
            if not codes:
                return np.zeros_like(mask)
            mask &= groups == codes[0] if len(codes) == 1 else np.isin(groups, codes)
        tx = to_micros(scope.known_at)
        mask &= col(self.created) <= tx
        if self.kind is Kind.FACT and scope.as_of is not None:
            at = to_micros(scope.as_of)
            expired = col(self.expired)
            # A supersession learnt after known_at is not yet known then: the fact ends where it ended before
            # (prior_invalid_at; tkg.timeline.believed_invalid_at). expired_at None is stored as _MAX.
            invalid = np.where((expired > tx) & (expired != _MAX), col(self.prior), col(self.invalid))
            mask &= (col(self.valid) <= at) & (at < invalid)
        elif self.kind is Kind.EPISODE and scope.explicit_as_of and scope.as_of is not None:
            mask &= col(self.valid) <= to_micros(scope.as_of)
        if scope.filters:
            self._filter(mask, scope.filters, relation_codes, col)
        return mask

    def stable_interval(self, now: int, event_time: bool, rows: npt.NDArray[np.int64] | None = None) -> tuple[int, int]:
        """``[lo, hi)`` around ``now`` in which no stored timestamp that a "now" mask depends on changes its
        comparison with "now" (creation; for facts judged at "now" also validity and expiry); over the slots
        ``rows`` only when given."""
        columns = [self.created]
        if self.kind is Kind.FACT and event_time:
            columns += [self.valid, self.invalid, self.expired, self.prior]
        lo, hi = _MIN, _MAX
        for column in columns:
            values = column.view() if rows is None else column.view()[rows]
            lo = max(lo, int(values.max(initial=_MIN, where=values <= now)))
            hi = min(hi, int(values.min(initial=_MAX, where=values > now)))
        return lo, hi

    def _filter(
        self,
        mask: Mask,
        filters: Filters,
        relation_codes: dict[str, int],
        col: Callable[[Column], npt.NDArray],  # type: ignore[type-arg]
    ) -> None:
        if filters.labels is not None and self.kind is Kind.ENTITY:
            labelled = np.zeros_like(mask)
            for label in filters.labels:
                column = self.labels.get(label)
                if column is not None:
                    labelled |= col(column)
            mask &= labelled
        if filters.relations is not None and self.kind is Kind.FACT:
            codes = [relation_codes[r] for r in filters.relations if r in relation_codes]
            mask &= np.isin(col(self.relation), codes) if codes else False
        for rng in filters.dates:
            column, missing = self._date_column(rng.field)
            if column is None:
                continue
            values = col(column)
            inside = np.ones_like(mask)
            if rng.start is not None:
                inside &= values >= to_micros(rng.start)  # type: ignore[arg-type]
            if rng.end is not None:
                inside &= values < to_micros(rng.end)  # type: ignore[arg-type]
            if missing is not None:
                absent = values == missing
                inside = (inside & ~absent) | (absent if rng.include_missing else False)
            mask &= inside

    def _date_column(self, name: str) -> tuple[Column | None, int | None]:
        """The column holding a DateRange field for this kind, and the sentinel that stands for ``None``."""
        if name == "created_at":
            return self.created, None
        if self.kind is Kind.FACT:
            return {
                "valid_at": (self.valid, _MIN),
                "invalid_at": (self.invalid, _MAX),
                "expired_at": (self.expired, _MAX),
            }.get(name, (None, None))
        if self.kind is Kind.EPISODE and name == "reference_time":
            return self.valid, None
        return None, None


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
        self._texts = {kind: TextIndex(self._text_source(kind)) for kind in _TEXT_KINDS}
        self._restored: dict[str, Any] = {}  # what the last snapshot restore reused or rebuilt
        self._group_codes: dict[str, int] = {}
        self._relation_codes: dict[str, int] = {}
        self._masks: dict[tuple[Kind, Scope], tuple[int, int, int, Mask]] = {}  # key -> version, lo, hi, mask
        self._group_counts: dict[str, int] = {}
        self._names: dict[tuple[str, str], set[str]] = {}
        self._adjacent: dict[str, set[str]] = {}  # entity id -> ids of facts touching it
        self._episode_facts: dict[str, set[str]] = {}
        self._mentions_by_episode: dict[str, set[str]] = {}
        self._mentions_by_entity: dict[str, set[str]] = {}
        self._members_by_community: dict[str, set[str]] = {}
        self._members_by_entity: dict[str, set[str]] = {}
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
                vector = getattr(record, field)
                try:
                    check_vectors(vector, self.dim)  # validation only: the index keeps the record's own array
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
        table.touch(slot)
        table.alive[slot] = True
        table.group[slot] = self._group_codes.setdefault(record.group_id, len(self._group_codes))
        table.created[slot] = to_micros(record.created_at)
        if isinstance(record, Fact):
            table.valid[slot] = _us(record.valid_at, _MIN)
            table.invalid[slot] = _us(record.invalid_at, _MAX)
            table.expired[slot] = _us(record.expired_at, _MAX)
            table.prior[slot] = _us(record.prior_invalid_at, _MAX)
            table.relation[slot] = self._relation_codes.setdefault(record.relation, len(self._relation_codes))
            for end in (record.source_id, record.target_id):
                self._adjacent.setdefault(end, set()).add(record.id)
            for episode_id in record.episodes:
                self._episode_facts.setdefault(episode_id, set()).add(record.id)
        elif isinstance(record, Episode):
            ref = to_micros(record.reference_time)
            table.valid[slot] = ref
            bisect.insort(self._timeline.setdefault(record.group_id, []), (ref, slot))
        elif isinstance(record, Entity):
            table.set_labels(slot, record.labels)
            for name in (record.name, *record.aliases):
                self._names.setdefault((record.group_id, normalize_name(name)), set()).add(record.id)
        elif isinstance(record, Mention):
            self._mentions_by_episode.setdefault(record.episode_id, set()).add(record.entity_id)
            self._mentions_by_entity.setdefault(record.entity_id, set()).add(record.episode_id)
        elif isinstance(record, Membership):
            self._members_by_community.setdefault(record.community_id, set()).add(record.entity_id)
            self._members_by_entity.setdefault(record.entity_id, set()).add(record.community_id)
        index = self._vectors.get(record.kind)
        if index is not None:
            if vector is None:
                index.remove(slot)
            else:
                view = index.set(slot, vector)
                if view is not vector:
                    # Keep one copy: the record's array is swapped for the equal, read-only view of the index's row
                    # (bit-identical values). In place, so the stored record stays the very object written, which
                    # callers may rely on (the community tier compares identities).
                    object.__setattr__(record, VECTOR_FIELD[record.kind], view)
        text = self._texts.get(record.kind)
        if text is not None:
            text.set(slot, search_text(record), None if old is None else search_text(old))

    def _delete(self, kind: Kind, record_id: str) -> None:
        table = self._tables[kind]
        slot = table.slot_of.get(record_id)
        if slot is None or table.records[slot] is None:
            return
        record = table.records[slot]
        assert record is not None
        self._unindex(record, slot, keep_search=False)
        table.records[slot] = None
        table.touch(slot)
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
        elif isinstance(record, Membership):
            self._discard(self._members_by_community, record.community_id, record.entity_id)
            self._discard(self._members_by_entity, record.entity_id, record.community_id)
        if not keep_search:
            if record.kind in self._vectors:
                self._vectors[record.kind].remove(slot)
            if record.kind in self._texts:
                self._texts[record.kind].remove(slot, search_text(record))

    def _text_source(self, kind: Kind) -> Callable[[], Iterator[tuple[int, str]]]:
        table = self._tables[kind]

        def live_texts() -> Iterator[tuple[int, str]]:
            return ((slot, search_text(r)) for slot, r in enumerate(table.records) if r is not None)

        return live_texts

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
        return int(np.count_nonzero(self._mask(Kind(kind), Scope(group_ids, _FAR_FUTURE, None))))

    def groups(self) -> set[str]:
        return set(self._group_counts)

    def vector_search(self, kind: Kind, vector: Vector, k: int, scope: Scope) -> list[Hit]:
        kind = Kind(kind)
        index = self._vectors.get(kind)
        if index is None:
            raise BackendError(f"{kind} records have no vectors to search")
        query = check_vectors(vector, self.dim)[0]
        mask = self._mask(kind, scope)
        return self._hits(kind, index.search(query, k, mask))

    def text_search(self, kind: Kind, query: str, k: int, scope: Scope) -> list[Hit]:
        kind = Kind(kind)
        index = self._texts.get(kind)
        if index is None:
            raise BackendError(f"{kind} records have no text to search")
        mask = self._mask(kind, scope)
        return self._hits(kind, index.search(query, k, mask))

    def _mask(self, kind: Kind, scope: Scope) -> Mask:
        """The scope's mask over a kind's slots, cached until the table changes: the methods of one search share
        it. A default "now" scope moves with the clock, but its mask only changes when "now" crosses one of the
        stored timestamps, so it is cached with the interval of times over which it holds. Read-only."""
        table = self._tables[kind]
        now = to_micros(scope.known_at)
        moving = not scope.explicit_as_of and (scope.as_of is None or scope.as_of == scope.known_at)
        key = (kind, replace(scope, known_at=_FAR_FUTURE, as_of=scope.as_of and _FAR_FUTURE) if moving else scope)
        cached = self._masks.get(key)
        if cached is not None and cached[1] <= now < cached[2]:
            if cached[0] == table.version:
                return cached[3]
            mask, lo, hi = self._updated_mask(table, scope, cached, now, moving)
        else:
            mask = table.mask(scope, self._group_codes, self._relation_codes)
            lo, hi = table.stable_interval(now, scope.as_of is not None) if moving else (_MIN, _MAX)
        mask.setflags(write=False)
        if len(self._masks) >= 64:  # explicit time points rarely repeat: keep the cache small
            self._masks.clear()
        self._masks[key] = (table.version, lo, hi, mask)
        return mask

    def _updated_mask(
        self, table: _Table, scope: Scope, cached: tuple[int, int, int, Mask], now: int, moving: bool
    ) -> tuple[Mask, int, int]:
        """A cached mask brought up to the table's version: only the slots changed since are recomputed (an
        ingestion changes a handful of slots, and a whole mask costs O(slots) per kind at every search)."""
        version, lo, hi, old = cached
        rows = table.changed_since(version)
        size = table.alive.size
        if rows is None or len(rows) > max(64, size // 16):
            mask = table.mask(scope, self._group_codes, self._relation_codes)
            return mask, *(table.stable_interval(now, scope.as_of is not None) if moving else (_MIN, _MAX))
        mask = np.zeros(size, dtype=np.bool_)
        mask[: len(old)] = old
        mask[rows] = table.mask(scope, self._group_codes, self._relation_codes, rows)
        if moving:  # the unchanged slots kept their timestamps: the changed ones can only narrow the interval
            new_lo, new_hi = table.stable_interval(now, scope.as_of is not None, rows)
            lo, hi = max(lo, new_lo), min(hi, new_hi)
        return mask, lo, hi

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
        if scope is None:
            return [table.records[s] for s in slots]  # type: ignore[misc]
        admitted = self._mask(Kind.FACT, scope)  # the cached scope mask: no per-fact Python time checks
        return [table.records[s] for s in slots if admitted[s]]  # type: ignore[misc]

    def bfs(self, seeds: Sequence[str], depth: int, scope: Scope, limit: int | None = None) -> dict[str, int]:
        entities = self._tables[Kind.ENTITY]
        facts = self._tables[Kind.FACT]
        hops: dict[str, int] = {}
        queue: deque[str] = deque()
        entity_ok = self._mask(Kind.ENTITY, scope)
        fact_ok = self._mask(Kind.FACT, scope)
        for seed in seeds:
            slot = entities.slot_of.get(seed)
            if slot is not None and seed not in hops and entity_ok[slot]:
                hops[seed] = 0
                queue.append(seed)
        while queue:
            current = queue.popleft()
            if hops[current] >= depth:
                continue
            for fact_id in self._adjacent.get(current, ()):
                slot = facts.slot_of[fact_id]
                if not fact_ok[slot]:
                    continue
                fact: Fact = facts.records[slot]  # type: ignore[assignment]
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

    def memberships(
        self, community_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Membership]:
        table = self._tables[Kind.MEMBERSHIP]
        if community_ids is None and entity_ids is None:
            return [m for m in table.records if isinstance(m, Membership)]
        if community_ids is not None:
            pairs = {(c, e) for c in community_ids for e in self._members_by_community.get(c, ())}
            if entity_ids is not None:
                wanted = set(entity_ids)
                pairs = {p for p in pairs if p[1] in wanted}
        else:
            pairs = {(c, e) for e in entity_ids or () for c in self._members_by_entity.get(e, ())}
        found = [table.get(f"{c}>{e}") for c, e in pairs]
        return sorted((m for m in found if isinstance(m, Membership)), key=lambda m: table.slot_of[m.id])

    def episode_facts(self, episode_id: str) -> list[Fact]:
        table = self._tables[Kind.FACT]
        ids = self._episode_facts.get(episode_id, ())
        return [table.records[s] for s in sorted(table.slot_of[i] for i in ids)]  # type: ignore[misc]

    def recent_episodes(self, group_id: str, before: datetime, n: int) -> list[Episode]:
        timeline = self._timeline.get(group_id, [])
        end = bisect.bisect_right(timeline, (to_micros(before), _MAX))
        records = self._tables[Kind.EPISODE].records
        return [records[slot] for _, slot in timeline[max(0, end - n) : end]]  # type: ignore[misc]

    def episode_window(self, episode_id: str, before: int, after: int) -> list[Episode]:
        episode = self._tables[Kind.EPISODE].get(episode_id)
        if not isinstance(episode, Episode):
            return []
        timeline = self._timeline.get(episode.group_id, [])
        table = self._tables[Kind.EPISODE]
        at = bisect.bisect_left(timeline, (to_micros(episode.reference_time), table.slot_of[episode_id]))
        records = table.records
        return [records[slot] for _, slot in timeline[max(0, at - before) : at + after + 1]]  # type: ignore[misc]

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
            "restored": dict(self._restored),
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

    # ------------------------------------------------------------------------------------------------------
    # snapshots (called by tkg.snapshot; the file format lives there)
    def export_snapshot(self, directory: Path | None = None) -> dict[str, Any]:
        """The indexes, for :func:`tkg.snapshot.save`: each kind's slot of every live record (in scan order),
        the HNSW graphs as arrays (:meth:`VectorIndex.export_graph`), the BM25 indexes as arrays, each vector's
        stored ``1 / norm`` and the time columns (int64 microseconds, ``None`` as int64 min), all in scan order,
        and per kind a function from slots to their vectors (a gather, faster than stacking the records' rows).
        ``directory`` is unused (format-2 callers passed one for graph files)."""
        slots = {
            kind: np.fromiter((s for s, r in enumerate(t.records) if r is not None), dtype=np.int64, count=t.live)
            for kind, t in self._tables.items()
        }
        graphs = {}
        scales = {}
        for kind, index in self._vectors.items():
            state = index.export_graph()
            if state is not None:
                graphs[kind] = state
            live = slots[kind]
            scales[kind] = index.scales(live[live < index.has_vec.size]) if len(live) else np.zeros(0, np.float32)
            if len(scales[kind]) != len(live):  # records without vectors beyond the index's columns
                padded = np.ones(len(live), dtype=np.float32)
                padded[: len(scales[kind])] = scales[kind]
                scales[kind] = padded
        times: dict[Kind, dict[str, npt.NDArray[np.int64]]] = {}
        for kind, table in self._tables.items():
            at = slots[kind]
            columns = {"created_at": table.created.view()[at]}
            if kind is Kind.FACT:
                for name, column, missing in (
                    ("valid_at", table.valid, _MIN),
                    ("invalid_at", table.invalid, _MAX),
                    ("expired_at", table.expired, _MAX),
                    ("prior_invalid_at", table.prior, _MAX),
                ):
                    values = column.view()[at]
                    columns[name] = np.where(values == missing, _NONE_IN_FILE, values)
            elif kind is Kind.EPISODE:
                columns["reference_time"] = table.valid.view()[at]
            times[kind] = columns
        return {
            "slots": slots,
            "graphs": graphs,
            "text": {k: t.export() for k, t in self._texts.items()},
            "scales": scales,
            "times": times,
            "rows": {kind: index.rows for kind, index in self._vectors.items()},
        }

    def restore_snapshot(self, contents: Any) -> dict[str, Any]:
        """Bulk-load a :class:`tkg.snapshot.Contents` into this empty store, reusing its index sections where
        they fit the records (each is checked; one that does not fit is rebuilt). Returns, per index, whether it
        was ``loaded`` or ``rebuilt``."""
        if any(t.records for t in self._tables.values()):
            raise BackendError("restore_snapshot() needs an empty store")
        version = getattr(contents, "version", 1)
        if version < 2:
            self.load(list(contents))
            self._restored = {"format": 1, "indexes": "rebuilt"}
            return dict(self._restored)
        records: dict[Kind, list[Record]] = contents.records
        self._check_references(records)
        indexes = contents.indexes or {}
        slot_map = self._restored_slots(records, indexes.get("slots", {}))
        use_indexes = slot_map is not None
        if slot_map is None:
            slot_map = {kind: np.arange(len(records.get(kind, ())), dtype=np.int64) for kind in Kind}
        report: dict[str, Any] = {"format": version, "graphs": {}, "text": {}}

        def restore_vectors(kind: Kind, index: VectorIndex) -> bool:
            recs = records.get(kind, [])
            vec_at, matrix = contents.vectors.get(kind, (np.zeros(0, np.int64), np.zeros((0, self.dim), np.float32)))
            graph = indexes.get("graphs", {}).get(kind) if use_indexes else None
            scales = indexes.get("scales", {}).get(kind)
            if scales is not None:
                scales = scales[vec_at] if len(scales) == len(recs) else None
            return index.restore(slot_map[kind][vec_at], matrix, graph, scales)

        # The vector indexes (big numpy copies, which release the GIL) are restored on a helper thread while the
        # tables (Python objects and maps) are filled here: they share no state.
        with ThreadPoolExecutor(1, thread_name_prefix="tkg-restore-vectors") as pool:
            graphs = {
                kind: pool.submit(restore_vectors, kind, index)
                for kind, index in self._vectors.items()
                if records.get(kind)
            }
            for kind in Kind:
                self._restore_table(kind, records.get(kind, []), slot_map[kind], contents.times.get(kind, {}))
            for kind, restored in graphs.items():
                report["graphs"][kind.value] = "loaded" if restored.result() else "rebuilt"
        for kind, text in self._texts.items():
            table = self._tables[kind]
            state = indexes.get("text", {}).get(kind) if use_indexes else None
            try:
                if state is None:
                    raise TextMismatch("no saved text index")
                text.restore(state, slot_map[kind], lambda slot, t=table: search_text(t.records[slot]))  # type: ignore[misc, arg-type]
                report["text"][kind.value] = "loaded"
            except TextMismatch:
                text.rebuild()
                report["text"][kind.value] = "rebuilt"
        self._restored = report
        return dict(report)

    def _check_references(self, records: dict[Kind, list[Record]]) -> None:
        """What :meth:`write` would check across records, done in bulk before anything is stored (whole columns
        compared at C speed; the loop that names the culprit runs only when something is wrong)."""
        entities = records.get(Kind.ENTITY, [])
        entity_group = dict(zip(map(_ID, entities), map(_GROUP, entities), strict=True))
        facts = records.get(Kind.FACT, [])
        groups = list(map(_GROUP, facts))
        if (
            list(map(entity_group.get, map(_SOURCE, facts))) != groups
            or list(map(entity_group.get, map(_TARGET, facts))) != groups
        ):
            for fact in facts:
                assert isinstance(fact, Fact)
                if {entity_group.get(fact.source_id), entity_group.get(fact.target_id)} != {fact.group_id}:
                    raise BackendError(f"fact {fact.id} points to a missing entity or one of another group")
        episodes = set(map(_ID, records.get(Kind.EPISODE, [])))
        mentions = records.get(Kind.MENTION, [])
        if not episodes.issuperset(map(_EPISODE, mentions)) or not entity_group.keys() >= set(map(_ENTITY, mentions)):
            for mention in mentions:
                assert isinstance(mention, Mention)
                if mention.episode_id not in episodes or mention.entity_id not in entity_group:
                    raise BackendError(f"mention {mention.id} points to a missing episode or entity")
        communities = {c.id for c in records.get(Kind.COMMUNITY, [])}
        for member in records.get(Kind.MEMBERSHIP, []):
            assert isinstance(member, Membership)
            if member.community_id not in communities or member.entity_id not in entity_group:
                raise BackendError(f"membership {member.id} points to a missing community or entity")

    @staticmethod
    def _restored_slots(records: dict[Kind, list[Record]], saved: dict[Kind, Any]) -> dict[Kind, Any] | None:
        """The saved slot of every record, if the snapshot has a plausible set (else None: renumber, rebuild)."""
        out = {}
        for kind in Kind:
            n = len(records.get(kind, ()))
            slots = saved.get(kind)
            if slots is None:
                return None
            slots = np.asarray(slots, dtype=np.int64)
            if len(slots) != n:
                return None
            # Slots are increasing in scan order; the holes left by deletions are bounded by what was written.
            if n and (int(slots[0]) < 0 or not bool(np.all(np.diff(slots) > 0)) or int(slots[-1]) > 4 * n + (1 << 20)):
                return None
            out[kind] = slots
        return out

    def _restore_table(
        self, kind: Kind, recs: list[Record], slots: Any, times: dict[str, npt.NDArray[np.int64]]
    ) -> None:
        table = self._tables[kind]
        n = len(recs)
        size = int(slots[-1]) + 1 if n else 0
        slot_list = slots.tolist()
        if size == n:  # no holes: slots are 0..n-1
            table.records = list(recs)
        else:
            table.records = [None] * size
            for slot, record in zip(slot_list, recs, strict=True):
                table.records[slot] = record
        table.slot_of = dict(zip(map(_ID, recs), slot_list, strict=True))
        for column in (table.alive, table.group, table.created, table.valid, table.invalid, table.expired, table.prior):
            column.ensure(size)
        table.relation.ensure(size)
        table.alive.view()[slots] = True
        table.live = n
        table.version += 1
        group_ids = list(map(_GROUP, recs))
        table.group.view()[slots] = _codes(group_ids, self._group_codes)
        for group, count in Counter(group_ids).items():
            self._group_counts[group] = self._group_counts.get(group, 0) + count

        def micros(name: str, missing: int) -> npt.NDArray[np.int64]:
            column = times.get(name)
            if column is None:  # not a time column of this file: convert from the records
                values = [getattr(r, name) for r in recs]
                return np.fromiter((missing if v is None else to_micros(v) for v in values), np.int64, n)
            return np.where(column == _NONE_IN_FILE, missing, column).astype(np.int64)

        table.created.view()[slots] = micros("created_at", _MAX)
        if kind is Kind.FACT:
            table.valid.view()[slots] = micros("valid_at", _MIN)
            table.invalid.view()[slots] = micros("invalid_at", _MAX)
            table.expired.view()[slots] = micros("expired_at", _MAX)
            table.prior.view()[slots] = micros("prior_invalid_at", _MAX)
            table.relation.view()[slots] = _codes(list(map(_RELATION, recs)), self._relation_codes)
            ids = list(map(_ID, recs))
            _group_into(self._adjacent, list(map(_SOURCE, recs)) + list(map(_TARGET, recs)), ids + ids)
            episodes = list(map(_EPISODES, recs))
            counts = np.fromiter(map(len, episodes), dtype=np.int64, count=n)
            owners = _pick(ids, np.repeat(np.arange(n), counts))
            _group_into(self._episode_facts, list(chain.from_iterable(episodes)), owners)
        elif kind is Kind.EPISODE:
            refs = micros("reference_time", _MIN)
            table.valid.view()[slots] = refs
            timeline: dict[str, list[tuple[int, int]]] = {}
            for group, ref, slot in zip(group_ids, refs.tolist(), slot_list, strict=True):
                timeline.setdefault(group, []).append((ref, slot))
            for group, items in timeline.items():
                items.sort()
                self._timeline[group] = items
        elif kind is Kind.ENTITY:
            by_label: dict[str, list[int]] = {}
            names = self._names
            for slot, entity in zip(slot_list, recs, strict=True):
                assert isinstance(entity, Entity)
                for label in entity.labels:
                    by_label.setdefault(label, []).append(slot)
                for name in (entity.name, *entity.aliases):
                    key = (entity.group_id, normalize_name(name))
                    found = names.get(key)
                    if found is None:
                        names[key] = {entity.id}
                    else:
                        found.add(entity.id)
            for label, labelled in by_label.items():
                column = Column(np.bool_, False)
                column.ensure(size)
                column.view()[labelled] = True
                table.labels[label] = column
        elif kind is Kind.MENTION:
            episode_ids, entity_ids = list(map(_EPISODE, recs)), list(map(_ENTITY, recs))
            _group_into(self._mentions_by_episode, episode_ids, entity_ids)
            _group_into(self._mentions_by_entity, entity_ids, episode_ids)
        elif kind is Kind.MEMBERSHIP:
            community_ids, entity_ids = list(map(_COMMUNITY, recs)), list(map(_ENTITY, recs))
            _group_into(self._members_by_community, community_ids, entity_ids)
            _group_into(self._members_by_entity, entity_ids, community_ids)

    def memory_breakdown(self) -> dict[str, int]:
        """Approximate bytes held by the indexes, by part (for benchmarks; records are not counted here)."""
        out = {"vectors": 0, "hnsw_graph": 0, "bm25": 0, "columns": 0}
        for index in self._vectors.values():
            parts = index.memory()
            out["vectors"] += parts["vectors"]
            out["hnsw_graph"] += parts["graph"]
            out["columns"] += parts["columns"]
        for text in self._texts.values():
            out["bm25"] += text.memory()["bm25"]
        for table in self._tables.values():
            out["columns"] += table.alive.size * (1 + 4 + 8 * 4 + 4) + sum(c.size for c in table.labels.values())
        return out


_ID, _GROUP, _RELATION = attrgetter("id"), attrgetter("group_id"), attrgetter("relation")
_EPISODES = attrgetter("episodes")
_SOURCE, _TARGET = attrgetter("source_id"), attrgetter("target_id")
_EPISODE, _ENTITY, _COMMUNITY = attrgetter("episode_id"), attrgetter("entity_id"), attrgetter("community_id")


def _codes(values: list[str], codes: dict[str, int]) -> npt.NDArray[np.int32]:
    """The code of each value in ``codes``, adding the new ones (in first-seen order)."""
    for value in dict.fromkeys(values):
        if value not in codes:
            codes[value] = len(codes)
    return np.fromiter(map(codes.__getitem__, values), dtype=np.int32, count=len(values))


def _pick(values: list[str], at: npt.NDArray[np.int64]) -> list[str]:
    """``[values[i] for i in at]`` at C speed."""
    if len(at) == 0:
        return []
    picked = itemgetter(*at.tolist())(values)
    return [picked] if len(at) == 1 else list(picked)


def _group_into(index: dict[str, set[str]], keys: list[str], values: list[str]) -> None:
    """``index[key].add(value)`` for each pair, grouped with one sort instead of a Python loop per pair (bulk
    restores build millions of these sets)."""
    if not keys:
        return
    unique = list(dict.fromkeys(keys))
    code = dict(zip(unique, range(len(unique)), strict=True))
    codes = np.fromiter(map(code.__getitem__, keys), dtype=np.int64, count=len(keys))
    ordered = _pick(values, np.argsort(codes, kind="stable"))
    ends = np.bincount(codes, minlength=len(unique)).cumsum().tolist()
    groups = map(set, map(ordered.__getitem__, map(slice, [0, *ends[:-1]], ends)))
    if not index:  # the usual case (a restore into an empty store): no merging, no Python loop
        index.update(zip(unique, groups, strict=True))
        return
    for key, group in zip(unique, groups, strict=True):
        found = index.get(key)
        if found is None:
            index[key] = group
        else:
            found |= group


_FAR_FUTURE = datetime(9999, 12, 31, tzinfo=UTC)
