"""The in-memory backend: records in slot tables, numpy columns for filtering, hnswlib and bm25s.

Every kind of record lives in a :class:`~.tables.Table` of slots. Filtering by group and by the two timelines is
done on numpy columns (one boolean mask per query), and that mask is handed to the vector and text indexes, so
search never visits a Python object per record. Graph neighbourhoods use adjacency lists that grow with each
write.

Records are kept as rows of plain values that Python's cycle collector skips (:mod:`.rows`). Vectors are held
once: a stored record's row holds a read-only view of the vector index's row (values bit-identical), which exact
scoring reads too; hnswlib keeps its own copy for its graph walk.
Snapshots carry the HNSW graphs and BM25 arrays as this backend's own sections (:mod:`.persist`), so a load
restores them instead of rebuilding them.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from tkg.embedders.base import check_vectors
from tkg.errors import BackendError, EmbeddingError, ValidationError
from tkg.integrity import check_write
from tkg.journal import Journal
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
)
from tkg.names import normalize_name
from tkg.storage import Candidates, Hit, IndexExport, RecordSet, Sections, Store, WriteBatch, check_candidates
from tkg.timeline import Scope
from tkg.timeutil import to_micros
from tkg.together import run_together

from . import persist
from .arrays import any_of, around
from .maintenance import Maintenance, Task
from .precision import PRECISIONS
from .rows import CODECS, row_codecs
from .tables import MAX, MIN, SetIndex, Table, Timeline, micros_or, name_key
from .text import TextIndex
from .vectors import Mask, VectorIndex

F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    """Run ``method`` holding the store's lock."""

    @functools.wraps(method)
    def locked(self: InMemoryStore, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


# Vectors one background task folds into HNSW: the store's lock is free between tasks, the graph's between inserts
# (measured: folding a whole 512-vector tail per task, the worker re-took the graph lock before a waiting search
# could, and p99.9 of add_episode at 100k facts rose from 21 to 68 ms).
_FOLD_BATCH = 32
# A neighbourhood of facts holding under 1/_SPARSE of the fact table's slots is read from the adjacency sets (Python,
# ~0.4 us a fact); a larger one from the table's columns in one vectorised pass (2-5 ns a slot, every slot: 0.05 ms
# at 10k slots, 2.4 ms at 1M). Around a hot entity of 3,000 facts the sets cost 1.2 ms a read.
_SPARSE = 100
# A search's candidate lists run on search_threads threads at once when the kinds they search hold at least this
# many live records in all, each list counting its kind's (a hybrid search's 6 lists over 50,000 facts, entities
# and episodes together count 100,000).
# Below, a list takes well under a millisecond and handing it over costs about a tenth of one.
_TOGETHER_FROM = 100_000

_FAR_FUTURE = datetime(9999, 12, 31, tzinfo=UTC)

Slots = npt.NDArray[np.int64]
_FACT_ENDS = CODECS[Kind.FACT].getter("source_id", "target_id")


class InMemoryStore(Store):
    """A complete tkg store in process memory (one process; snapshots carry its indexes).

    Fresh vectors wait in a tail of ``vector_tail`` before joining the HNSW graph (``hnsw_m``,
    ``ef_construction``, ``ef_search``; ``threads`` for its bulk builds), and fresh texts in a BM25 tail; both are
    folded in by a background thread of the store (:mod:`.maintenance`), or by the writer that fills a tail when
    ``background`` is False. Searches are exact over tails either way.

    ``ef_search`` is the least number of candidates an HNSW search keeps (more when more results are asked): the
    knob between the recall of cosine search against exact search and its time. benchmarks/bench_scale.py reports
    both for several values; with MiniLM vectors of 100k facts, 64 found 0.990 of the exact top 10 over facts and
    128 found 0.998, for ~0.2 ms more per search of a kind.

    ``vector_precision="bfloat16"`` keeps each vector rounded to bfloat16, half the bytes of the store's own copy
    (0.77 instead of 1.5 KB at 384-d; hnswlib's float32 copy for its graph is unchanged): records read back carry
    the rounded values, and scores are those of the rounded vectors (:mod:`.precision`).

    ``search_threads``: the threads a search's candidate lists (cosine and BM25 per target) run on at once in a
    large store, the calling one included (1: one after the other). numpy and hnswlib release the interpreter
    lock inside their loops, so two make a hybrid search over a million facts ~25% faster on two cores.

    >>> store = InMemoryStore(dim=384)
    >>> store.count(Kind.FACT)
    0
    """

    persists_indexes: ClassVar[bool] = True
    journals: ClassVar[bool] = True

    def __init__(
        self,
        dim: int,
        *,
        hnsw_m: int = 16,
        ef_construction: int = 100,
        ef_search: int = 128,
        vector_tail: int = 512,
        threads: int = 1,
        background: bool = True,
        vector_precision: str = "float32",
        search_threads: int = 2,
    ) -> None:
        if dim < 1:
            raise ValidationError("dim must be positive")
        precision = PRECISIONS.get(vector_precision) if isinstance(vector_precision, str) else None
        if precision is None:
            raise ValidationError(
                f"InMemoryStore: vector_precision must be one of {sorted(PRECISIONS)}, got {vector_precision!r}"
            )
        for name, value, lowest in (
            ("hnsw_m", hnsw_m, 2),
            ("ef_construction", ef_construction, 1),
            ("ef_search", ef_search, 1),
            ("vector_tail", vector_tail, 1),
            ("threads", threads, 1),
            ("search_threads", search_threads, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                raise ValidationError(f"InMemoryStore: {name} must be an integer of at least {lowest}, got {value!r}")
        self.dim = dim
        self.vector_precision = precision.name
        codecs = row_codecs(precision)
        self._tables = {kind: Table(kind, codecs[kind]) for kind in Kind}
        self._vectors = {
            kind: VectorIndex(
                dim,
                m=hnsw_m,
                ef_construction=ef_construction,
                ef_search=ef_search,
                tail_limit=vector_tail,
                threads=threads,
                precision=precision,
            )
            for kind in VECTOR_FIELD
        }
        self._texts = {kind: TextIndex(self._text_source(kind)) for kind in TEXT_KINDS}
        self._restored: dict[str, Any] = {}  # what the last snapshot restore reused or rebuilt
        # Every call holds this lock: the store is safe to share between threads on its own (tkg.Memory adds a
        # readers-writer lock above it, so its readers wait here only for each other's short critical sections).
        self._lock = threading.RLock()
        self._search_threads = search_threads
        self._pool: ThreadPoolExecutor | None = None  # the helpers of large searches (see candidates)
        self._pool_guard = threading.Lock()
        # Folding fresh vectors into HNSW and merging BM25 tails run on a background thread unless background
        # is False (then on the writer that fills a tail, as one long call now and then).
        self._maintenance = Maintenance(self._lock, self._begin_maintenance)
        if background:
            for vectors in self._vectors.values():
                vectors.on_due = self._maintenance.kick
            for text in self._texts.values():
                text.on_due = self._maintenance.kick
        self._journal: Journal | None = None
        self._group_codes: dict[str, int] = {}
        self._relation_codes: dict[str, int] = {}
        self._masks: dict[tuple[Kind, Scope], tuple[int, int, int, Mask]] = {}  # key -> version, lo, hi, mask
        self._ends: tuple[int, int, int, npt.NDArray[np.int64]] | None = None  # version, lo, hi, ends (_fact_ends)
        self._group_counts: dict[str, int] = {}
        self._names = SetIndex()
        self._adjacent = SetIndex()  # entity id -> ids of facts touching it
        self._entity_codes: dict[str, int] = {}  # entity id -> its code in the fact table's end columns
        self._judging = SetIndex()  # fact id -> ids of the facts whose verdicts name it
        self._episode_facts = SetIndex()
        self._mentions_by_episode = SetIndex()
        self._mentions_by_entity = SetIndex()
        self._members_by_community = SetIndex()
        self._members_by_entity = SetIndex()
        self._timeline: dict[str, Timeline] = {}  # group -> its episodes by (reference us, slot)
        # The last neighbourhood split by relation: (the fact table's version, ends, relation) -> the slots with that
        # relation and those with another. An episode asks for both around the same entities, one after the other.
        self._around: tuple[tuple[Any, ...], Slots, Slots] | None = None

    # ------------------------------------------------------------------------------------------------------
    # writes
    @_locked
    def write(self, batch: WriteBatch) -> None:
        prepared = self._validate(batch)
        if self._journal is not None and batch:
            self._journal.append(batch)  # on disk before it is applied: a failed append changes nothing
        for record, vector in prepared:
            self._put(record, vector)
        for kind, record_id in batch.deletes:
            self._delete(kind, record_id)

    def _validate(self, batch: WriteBatch) -> list[tuple[Record, Vector | None]]:
        check_write(batch.puts, batch.deletes, self._stored_groups)
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
            prepared.append((record, vector))
        return prepared

    def _stored_groups(self, kind: Kind, ids: Collection[str]) -> Mapping[str, str]:
        table = self._tables[kind]
        found = map(table.get, ids)
        return {r.id: r.group_id for r in found if r is not None}

    def _put(self, record: Record, vector: Vector | None) -> None:
        table = self._tables[record.kind]
        slot = table.slot_for(record.id)
        old = table.record(slot)
        if old is not None:
            self._unindex(old, slot, keep_search=True)
        else:
            table.live += 1
            self._group_counts[record.group_id] = self._group_counts.get(record.group_id, 0) + 1
        table.touch(slot)
        table.alive[slot] = True
        table.group[slot] = self._group_codes.setdefault(record.group_id, len(self._group_codes))
        table.created[slot] = to_micros(record.created_at)
        if isinstance(record, Fact):
            table.valid[slot] = micros_or(record.valid_at, MIN)
            table.invalid[slot] = micros_or(record.invalid_at, MAX)
            table.expired[slot] = micros_or(record.expired_at, MAX)
            table.prior[slot] = micros_or(record.prior_invalid_at, MAX)
            table.histories.set(slot, record)
            table.relation[slot] = self._relation_codes.setdefault(record.relation, len(self._relation_codes))
            codes = self._entity_codes
            table.source[slot] = codes.setdefault(record.source_id, len(codes))
            table.target[slot] = codes.setdefault(record.target_id, len(codes))
            for end in (record.source_id, record.target_id):
                self._adjacent.setdefault(end, {})[record.id] = None  # a fact rewritten keeps its place
            if isinstance(old, Fact):  # the ends it no longer has (kept through the rewrite, see _unindex)
                for end in {old.source_id, old.target_id} - {record.source_id, record.target_id}:
                    self._discard(self._adjacent, end, record.id)
            for named in record.verdicts:
                self._judging.setdefault(named, {})[record.id] = None
            for episode_id in record.episodes:
                self._episode_facts.setdefault(episode_id, {})[record.id] = None
        elif isinstance(record, Episode):
            ref = to_micros(record.reference_time)
            table.valid[slot] = ref
            timeline = self._timeline.get(record.group_id)
            if timeline is None:
                timeline = self._timeline[record.group_id] = Timeline()
            timeline.insert(ref, slot)
        elif isinstance(record, Entity):
            table.set_labels(slot, record.labels)
            for name in (record.name, *record.aliases):
                self._names.setdefault(name_key(record.group_id, normalize_name(name)), {})[record.id] = None
        elif isinstance(record, Mention):
            self._mentions_by_episode.setdefault(record.episode_id, {})[record.entity_id] = None
            self._mentions_by_entity.setdefault(record.entity_id, {})[record.episode_id] = None
        elif isinstance(record, Membership):
            self._members_by_community.setdefault(record.community_id, {})[record.entity_id] = None
            self._members_by_entity.setdefault(record.entity_id, {})[record.community_id] = None
        index = self._vectors.get(record.kind)
        if index is not None:
            if vector is None:
                index.remove(slot)
            else:
                # One copy: the row keeps the equal, read-only view of the index's row (bit-identical values).
                vector = index.set(slot, vector)
        table.store(slot, record, vector)
        text = self._texts.get(record.kind)
        if text is not None:
            text.set(slot, search_text(record), None if old is None else search_text(old))

    def _delete(self, kind: Kind, record_id: str) -> None:
        table = self._tables[kind]
        slot = table.slot_of.get(record_id)
        record = None if slot is None else table.record(slot)
        if slot is None or record is None:
            return
        self._unindex(record, slot, keep_search=False)
        table.rows[slot] = None
        del table.slot_of[record_id]  # put again, it is a new record: a new slot, at the end of the scan order
        table.touch(slot)
        table.alive[slot] = False
        table.live -= 1
        self._group_counts[record.group_id] -= 1
        if not self._group_counts[record.group_id]:
            del self._group_counts[record.group_id]

    def _unindex(self, record: Record, slot: int, *, keep_search: bool) -> None:
        """Remove a record from the secondary indexes (before replacing or deleting it)."""
        if isinstance(record, Fact):
            self._tables[Kind.FACT].histories.forget(slot)
            if not keep_search:  # a rewrite keeps the fact's place among its ends' facts (the order a walk meets them)
                for end in (record.source_id, record.target_id):
                    self._discard(self._adjacent, end, record.id)
            for named in record.verdicts:
                self._discard(self._judging, named, record.id)
            for episode_id in record.episodes:
                self._discard(self._episode_facts, episode_id, record.id)
        elif isinstance(record, Episode):
            self._timeline[record.group_id].remove(to_micros(record.reference_time), slot)
        elif isinstance(record, Entity):
            for name in (record.name, *record.aliases):
                self._discard(self._names, name_key(record.group_id, normalize_name(name)), record.id)
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
            # The list is copied now (under the store's lock); the texts are made as the caller iterates, which
            # a background rebuild does without the lock (rows are immutable).
            rows, unpack = table.rows.copy(), table.codec.unpack
            return ((slot, search_text(unpack(row))) for slot, row in enumerate(rows) if row is not None)

        return live_texts

    @staticmethod
    def _discard(index: SetIndex, key: Any, value: str) -> None:
        values = index.get(key)
        if values is not None:
            values.pop(value, None)
            if not values:
                del index[key]

    # ------------------------------------------------------------------------------------------------------
    # reads
    @_locked
    def get(self, kind: Kind, ids: Sequence[str]) -> list[Record | None]:
        table = self._tables[Kind(kind)]
        return [table.get(i) for i in ids]

    def scan(self, kind: Kind, group_ids: frozenset[str] | None = None) -> Iterator[Record]:
        with self._lock:
            records = self._tables[Kind(kind)].live_records(group_ids)  # over a copy of the rows
        yield from records

    @_locked
    def count(self, kind: Kind, group_ids: frozenset[str] | None = None) -> int:
        table = self._tables[Kind(kind)]
        if group_ids is None:
            return table.live
        return int(np.count_nonzero(self._mask(Kind(kind), Scope(group_ids, _FAR_FUTURE, None))))

    @_locked
    def groups(self) -> set[str]:
        return set(self._group_counts)

    @_locked
    def vector_search(self, kind: Kind, vector: Vector, k: int, scope: Scope) -> list[Hit]:
        return self._search(Candidates("cosine", kind, k), "", vector, scope)()

    @_locked
    def text_search(self, kind: Kind, query: str, k: int, scope: Scope) -> list[Hit]:
        return self._search(Candidates("bm25", kind, k), query, None, scope)()

    @_locked
    def candidates(self, asks: Sequence[Candidates], query: str, vector: Vector, scope: Scope) -> list[list[Hit]]:
        # The lists run on two threads at once (tkg.together) in a large store: the lock held here keeps writers
        # and index swaps out while the helper reads, as it would for reads made one after the other.
        check_candidates(asks)
        reads = [self._search(ask, query, vector, scope) for ask in asks]
        sizes = [self._tables[Kind(ask.kind)].live for ask in asks]
        distinct = len({(ask.method, Kind(ask.kind)) for ask in asks}) == len(asks)  # an index's caches: one thread
        if self._search_threads == 1 or sum(sizes) < _TOGETHER_FROM or not distinct:
            return [read() for read in reads]
        # BM25 lists (numpy, which holds the interpreter lock in parts of its work) alternate with cosine ones
        # (hnswlib's walk, which releases it), the largest kinds first, so that the two threads overlap best
        # (measured at 1M facts: ~0.75 of the time of one thread, against ~0.79 in the config's order).
        bm25 = sorted((i for i, ask in enumerate(asks) if ask.method == "bm25"), key=lambda i: (-sizes[i], i))
        cosine = sorted((i for i, ask in enumerate(asks) if ask.method != "bm25"), key=lambda i: (-sizes[i], i))
        order = [i for pair in itertools.zip_longest(bm25, cosine) for i in pair if i is not None]
        found = run_together([reads[i] for i in order], self._search_threads - 1, self._start_helpers)
        out: list[list[Hit]] = [[] for _ in asks]
        for i, hits in zip(order, found, strict=True):
            out[i] = hits
        return out

    def _search(self, ask: Candidates, query: str, vector: Vector | None, scope: Scope) -> Callable[[], list[Hit]]:
        """One candidate list (the store's lock held): checked, with its query vector and the scope's mask made now
        (the mask cache is the store's), as a call that reads the indexes without taking the lock."""
        kind = Kind(ask.kind)
        index: VectorIndex | TextIndex | None
        if ask.method == "cosine":
            index = self._vectors.get(kind)
            if index is None:
                raise BackendError(f"{kind} records have no vectors to search")
            wanted: Any = check_vectors(vector, self.dim)[0]
        else:
            index = self._texts.get(kind)
            if index is None:
                raise BackendError(f"{kind} records have no text to search")
            wanted = query
        mask = self._mask(kind, scope)
        searched = index
        return lambda: self._hits(kind, searched.search(wanted, ask.k, mask))

    def _start_helpers(self, drain: Callable[[], None], pending: Callable[[], bool], count: int) -> list[Future[None]]:
        """Start ``count`` helpers of :meth:`candidates` on the store's search pool (a helper holds nothing but its
        thread, so it needs no ``pending`` check)."""
        with self._pool_guard:
            if self._pool is None:  # made at the first large search; its thread ends when the store is dropped
                self._pool = ThreadPoolExecutor(self._search_threads - 1, thread_name_prefix="tkg-search")
            return [self._pool.submit(drain) for _ in range(count)]

    def _mask(self, kind: Kind, scope: Scope) -> Mask:
        """The scope's mask over a kind's slots, cached until the table changes: the methods of one search share
        it. A default "now" scope moves with the clock, but its mask only changes when "now" crosses one of the
        stored timestamps, so it is cached with the interval of times over which it holds (a time asked for is
        cached as it is: finding that interval costs more than the mask). Read-only."""
        table = self._tables[kind]
        now = to_micros(scope.known_at)
        if scope.as_of is not None and not (kind is Kind.FACT or (kind is Kind.EPISODE and scope.explicit_as_of)):
            scope = replace(scope, as_of=None, explicit_as_of=False)  # event time does not bear on this kind
        moving = (
            not scope.explicit_as_of
            and not scope.explicit_known_at
            and (scope.as_of is None or scope.as_of == scope.known_at)
        )
        key = (kind, replace(scope, known_at=_FAR_FUTURE, as_of=scope.as_of and _FAR_FUTURE) if moving else scope)
        cached = self._masks.get(key)
        if cached is not None and cached[1] <= now < cached[2]:
            if cached[0] == table.version:
                return cached[3]
            mask, lo, hi = self._updated_mask(table, scope, cached, now, moving)
        elif kind is Kind.FACT and scope.explicit_as_of and not scope.explicit_known_at and scope.as_of is not None:
            # As of a time, as known now: the view of now without event time (cached with its interval), narrowed
            # to the facts that held then by their ends as known now (cached likewise).
            base = self._mask(kind, replace(scope, as_of=None, explicit_as_of=False))
            mask, lo, hi = base & table.holding(to_micros(scope.as_of), self._fact_ends(table, now)), MIN, MAX
        else:
            mask = table.mask(scope, self._group_codes, self._relation_codes)
            lo, hi = table.stable_interval(now, _ends_bear(scope)) if moving else (MIN, MAX)
        mask.setflags(write=False)
        if len(self._masks) >= 64:  # explicit time points rarely repeat: keep the cache small
            self._masks.clear()
        self._masks[key] = (table.version, lo, hi, mask)
        return mask

    def _fact_ends(self, table: Table, now: int) -> npt.NDArray[np.int64]:
        """Each fact slot's end as known at ``now``: kept until the facts change or ``now`` crosses an expiry."""
        cached = self._ends
        if cached is None or cached[0] != table.version or not cached[1] <= now < cached[2]:
            lo, hi = around(table.expired.view(), now)
            if table.histories:
                below, above = around(table.histories.times(), now)
                lo, hi = max(lo, below), min(hi, above)
            cached = self._ends = (table.version, lo, hi, table.believed_ends(now))
        return cached[3]

    def _updated_mask(
        self, table: Table, scope: Scope, cached: tuple[int, int, int, Mask], now: int, moving: bool
    ) -> tuple[Mask, int, int]:
        """A cached mask brought up to the table's version: only the slots changed since are recomputed (an
        ingestion changes a handful of slots, and a whole mask costs O(slots) per kind at every search)."""
        version, lo, hi, old = cached
        rows = table.changed_since(version)
        size = table.alive.size
        if rows is None or len(rows) > max(64, size // 16):
            mask = table.mask(scope, self._group_codes, self._relation_codes)
            return mask, *(table.stable_interval(now, _ends_bear(scope)) if moving else (MIN, MAX))
        mask = np.zeros(size, dtype=np.bool_)
        mask[: len(old)] = old
        mask[rows] = table.mask(scope, self._group_codes, self._relation_codes, rows)
        if moving:  # the unchanged slots kept their timestamps: the changed ones can only narrow the interval
            new_lo, new_hi = table.stable_interval(now, _ends_bear(scope), rows)
            lo, hi = max(lo, new_lo), min(hi, new_hi)
        return mask, lo, hi

    def _hits(self, kind: Kind, found: list[tuple[int, float]]) -> list[Hit]:
        table = self._tables[kind]
        rows, id_at = table.rows, table.codec.id_at
        return [Hit(id_at(rows[slot]), score) for slot, score in found]  # type: ignore[arg-type]

    @_locked
    def entities_by_name(self, group_id: str, names: Sequence[str]) -> dict[str, list[Entity]]:
        table = self._tables[Kind.ENTITY]
        out: dict[str, list[Entity]] = {}
        for name in names:
            key = normalize_name(name)
            ids = self._names.get(name_key(group_id, key))
            if ids:
                out[key] = sorted((table.get(i) for i in ids), key=lambda e: table.slot_of[e.id])  # type: ignore
        return out

    @_locked
    def facts_of(self, entity_ids: Sequence[str], scope: Scope | None = None) -> list[Fact]:
        table = self._tables[Kind.FACT]
        ids = set().union(*(self._adjacent.get(e, ()) for e in entity_ids)) if entity_ids else set()
        slots = sorted(table.slot_of[i] for i in ids)
        if scope is None:
            return table.records_at(slots)  # type: ignore[return-value]
        admitted = self._mask(Kind.FACT, scope)  # the cached scope mask: no per-fact Python time checks
        return table.records_at(s for s in slots if admitted[s])  # type: ignore[return-value]

    @_locked
    def fact_ends(self, scope: Scope) -> tuple[list[str], list[str]]:
        table = self._tables[Kind.FACT]
        slots = np.flatnonzero(self._mask(Kind.FACT, scope))
        # The fact table's end columns hold entity codes, given in order: the code of an id is its place here.
        ids = np.array(list(self._entity_codes), dtype=object)
        return ids[table.source.view()[slots]].tolist(), ids[table.target.view()[slots]].tolist()

    # The neighbourhood of a new fact (see Store). Few facts around the entities: from the adjacency sets; many
    # (a hot entity): one vectorised pass over the fact table's end and relation columns.
    @_locked
    def facts_between(self, pairs: Sequence[tuple[str, str]]) -> list[Fact]:
        found: set[int] = set()
        for pair in pairs:
            near = min(pair, key=lambda e: len(self._adjacent.get(e, ())))  # read the smaller adjacency set
            found |= self._slots_where(self._adjacent.get(near, ()), set(pair), whole=True)
        return self._facts_at(found)

    @_locked
    def facts_with(self, entity_ids: Sequence[str], relation: str) -> list[Fact]:
        return self._facts_at(self._neighbourhood(entity_ids, relation, True).tolist())

    @_locked
    def facts_judging(self, fact_ids: Sequence[str], entity_ids: Sequence[str]) -> list[Fact]:
        # The facts naming any of them, each once (a fact judged against a statement said N times names all N),
        # then their ends checked once each.
        judges: set[str] = set()
        judging = self._judging
        for named in fact_ids:
            found = judging.get(named)
            if found:
                judges.update(found)
        return self._facts_at(self._slots_where(judges, set(entity_ids), whole=False))

    def _slots_where(self, fact_ids: Iterable[str], ends: set[str], *, whole: bool) -> set[int]:
        """The slots of these facts whose two ends are ``ends`` (``whole``) or that have an end among them."""
        table = self._tables[Kind.FACT]
        rows = table.rows
        found = set()
        for slot in map(table.slot_of.__getitem__, fact_ids):
            touched = set(_FACT_ENDS(rows[slot]))  # type: ignore[arg-type]
            if touched == ends if whole else not touched.isdisjoint(ends):
                found.add(slot)
        return found

    def _facts_at(self, slots: Iterable[int]) -> list[Fact]:
        """The facts at these slots, in slot (insertion) order."""
        return self._tables[Kind.FACT].records_at(sorted(slots))  # type: ignore[return-value]

    @_locked
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
        table = self._tables[Kind.FACT]
        query = check_vectors(vector, self.dim)[0]
        slots = self._neighbourhood(entity_ids, relation, same)
        if holding:
            slots = slots[table.expired.view()[slots] == MAX]
        found = self._vectors[Kind.FACT].closest(query, k, slots)
        return [(table.record(slot), score) for slot, score in found]  # type: ignore[misc]

    def _neighbourhood(self, entity_ids: Sequence[str], relation: str, same: bool) -> Slots:
        """The slots of live facts with an end among ``entity_ids`` and ``relation`` (``same``) or another one,
        in slot order."""
        table = self._tables[Kind.FACT]
        ends = tuple(e for e in dict.fromkeys(entity_ids) if e in self._adjacent)
        key = (table.version, ends, relation)
        around = self._around
        if around is None or around[0] != key:
            with_relation, others = self._split_around(ends, relation)
            with_relation.flags.writeable = others.flags.writeable = False  # shared by the two reads
            around = self._around = (key, with_relation, others)
        return around[1] if same else around[2]

    def _split_around(self, ends: tuple[str, ...], relation: str) -> tuple[Slots, Slots]:
        """The slots of live facts with an end among ``ends`` (all in the adjacency index): with ``relation``, and
        with another one."""
        table = self._tables[Kind.FACT]
        code = self._relation_codes.get(relation, -1)
        if sum(len(self._adjacent[e]) for e in ends) * _SPARSE <= table.alive.size:
            ids = set().union(*(self._adjacent[e] for e in ends)) if ends else set()
            slots = np.fromiter(sorted(table.slot_of[i] for i in ids), dtype=np.int64, count=len(ids))
            kept = table.relation.view()[slots] == code
            return slots[kept], slots[~kept]
        codes = [self._entity_codes[e] for e in ends]
        touching = any_of(table.source.view(), codes) | any_of(table.target.view(), codes)
        touching &= table.alive.view()
        kept = table.relation.view() == code
        return np.flatnonzero(touching & kept), np.flatnonzero(touching & ~kept)

    @_locked
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
                source, target = _FACT_ENDS(facts.rows[slot])  # type: ignore[arg-type]
                other = target if source == current else source
                if other not in hops:
                    if limit is not None and len(hops) >= limit:
                        return hops
                    hops[other] = hops[current] + 1
                    queue.append(other)
        return hops

    @_locked
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
            return list(table.live_records())  # type: ignore[arg-type]
        found = [table.get(f"{ep}>{en}") for ep, en in pairs]
        return sorted((m for m in found if isinstance(m, Mention)), key=lambda m: table.slot_of[m.id])

    @_locked
    def memberships(
        self, community_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Membership]:
        table = self._tables[Kind.MEMBERSHIP]
        if community_ids is None and entity_ids is None:
            return list(table.live_records())  # type: ignore[arg-type]
        if community_ids is not None:
            pairs = {(c, e) for c in community_ids for e in self._members_by_community.get(c, ())}
            if entity_ids is not None:
                wanted = set(entity_ids)
                pairs = {p for p in pairs if p[1] in wanted}
        else:
            pairs = {(c, e) for e in entity_ids or () for c in self._members_by_entity.get(e, ())}
        found = [table.get(f"{c}>{e}") for c, e in pairs]
        return sorted((m for m in found if isinstance(m, Membership)), key=lambda m: table.slot_of[m.id])

    @_locked
    def episode_facts(self, episode_id: str) -> list[Fact]:
        table = self._tables[Kind.FACT]
        ids = self._episode_facts.get(episode_id, ())
        return table.records_at(sorted(table.slot_of[i] for i in ids))  # type: ignore[return-value]

    @_locked
    def recent_episodes(self, group_id: str, before: datetime, n: int) -> list[Episode]:
        timeline = self._timeline.get(group_id)
        if timeline is None:
            return []
        end = timeline.end_of(to_micros(before))
        table = self._tables[Kind.EPISODE]
        return table.records_at(timeline.slots[max(0, end - n) : end])  # type: ignore[return-value]

    @_locked
    def episode_window(self, episode_id: str, before: int, after: int) -> list[Episode]:
        episode = self._tables[Kind.EPISODE].get(episode_id)
        if not isinstance(episode, Episode):
            return []
        timeline = self._timeline.get(episode.group_id)
        if timeline is None:
            return []
        table = self._tables[Kind.EPISODE]
        at = timeline.position(to_micros(episode.reference_time), table.slot_of[episode_id])
        return table.records_at(timeline.slots[max(0, at - before) : at + after + 1])  # type: ignore[return-value]

    # ------------------------------------------------------------------------------------------------------
    # graph algorithms and maintenance
    def _begin_maintenance(self) -> Task | None:
        """The next background task due (the lock held): a batch of a vector tail, else a BM25 merge."""
        for vectors in self._vectors.values():
            if vectors.due():
                return vectors.begin_fold(_FOLD_BATCH)
        for text in self._texts.values():
            if text.due():
                return text.begin_rebuild()
        return None

    def wait_for_maintenance(self, timeout: float | None = None) -> bool:
        """Wait until the background index maintenance is idle (tests and benchmarks); False on timeout."""
        return self._maintenance.wait(timeout)

    @_locked
    def flush(self) -> None:
        """Fold fresh items into the bulk indexes now (normally this happens in batches on its own)."""
        for vectors in self._vectors.values():
            vectors.flush()
        for text in self._texts.values():
            text.rebuild()

    def close(self) -> None:
        """Let the search helper thread end (the store stays usable: a later large search starts another)."""
        with self._pool_guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    @_locked
    def stats(self) -> dict[str, Any]:
        return {
            "records": {kind.value: table.live for kind, table in self._tables.items()},
            "groups": len(self._group_counts),
            "text_index": {kind.value: index.stats() for kind, index in self._texts.items()},
            "restored": dict(self._restored),
            "memory": self.memory_breakdown(),
        }

    def attach_journal(self, journal: Journal | None) -> None:
        self._journal = journal

    @_locked
    def load(self, records: Iterable[Record]) -> None:
        """Bulk-load records into an empty store: one batched index build instead of many adds."""
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
    # snapshots: this backend's own sections (the format is in .persist)
    @_locked
    def export_indexes(self) -> IndexExport:
        return persist.export_indexes(self)

    @_locked
    def restore(self, records: RecordSet, sections: Sections | None) -> dict[str, Any]:
        return persist.restore(self, records, sections)

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


def _ends_bear(scope: Scope) -> bool:
    """Whether a view of facts depends on their ends and expiry as known at its ``known_at`` (which moves with
    "now"): when it judges event time, or filters on ``invalid_at`` or ``expired_at`` (as the view knows them)."""
    return scope.as_of is not None or any(d.field in ("invalid_at", "expired_at") for d in scope.filters.dates)
