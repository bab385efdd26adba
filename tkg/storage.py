"""The storage interface: the one narrow seam between tkg's core and any backend.

Plain records in, plain records and ``(id, score)`` hits out; no backend type crosses it. Every backend answers
these calls with the same results (the conformance suite in ``tests/`` is the definition of "a backend works",
with the brute-force :class:`tkg.backends.reference.ReferenceStore` as its oracle).

A store's optional powers are declared here, the way rdflib's ``Store`` declares them: as class attributes that
say what a backend can do, and as methods with a working default in this base class. Callers use them directly
and never ask "does this store have X?":

* :attr:`Store.shared` -- several processes may open the same data; :meth:`Store.group_lock` then locks across
  processes (default: no lock beyond the caller's own);
* :meth:`Store.load` -- bulk load into an empty store (default: one :meth:`Store.write`);
* :meth:`Store.candidates` -- the candidate lists of one search (:class:`Candidates`) at once (default: one
  :meth:`Store.vector_search` or :meth:`Store.text_search` after the other; a database answers them on several
  connections together);
* :meth:`Store.export_indexes` / :meth:`Store.restore` -- a backend that can persist its own search indexes in a
  snapshot names and encodes them itself (:attr:`Store.persists_indexes`); the snapshot container
  (:mod:`tkg.snapshot`) stores those sections without knowing what they hold, and hands them back on load
  (default: nothing exported; a restore loads the records and builds the indexes);
* :meth:`Store.facts_between`, :meth:`Store.facts_with`, :meth:`Store.facts_judging`, :meth:`Store.closest_facts`
  -- the neighbourhood of a new fact, which truth maintenance reads for every fact of every episode (the
  defaults filter :meth:`Store.facts_of`; a backend answers from indexes, so that an episode about an entity
  with 100,000 facts does not read them all); :meth:`Store.closest_facts_together` makes several
  :meth:`Store.closest_facts` reads (:class:`Closest`) at once (default: one after the other; a database answers
  them on several connections together);
* :meth:`Store.fact_ends` -- the edges of the whole graph for community detection (the default scans the facts;
  a backend reads the two end columns alone);
* :meth:`Store.flush`, :meth:`Store.wait_for_maintenance`, :meth:`Store.stats`, :meth:`Store.close` --
  maintenance, with no-op defaults (a store that maintains its indexes on a thread of its own waits for it in
  :meth:`Store.wait_for_maintenance`).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from tkg.cosines import cosines, inverse_norms
from tkg.embedders.base import check_vectors
from tkg.errors import BackendError, ValidationError
from tkg.models import Entity, Episode, Fact, Kind, Membership, Mention, Record, Vector
from tkg.timeline import Scope

if TYPE_CHECKING:
    from tkg.journal import Journal

#: Dependency order of the kinds: endpoints before the edges that point to them.
KIND_ORDER = (Kind.EPISODE, Kind.ENTITY, Kind.COMMUNITY, Kind.FACT, Kind.MENTION, Kind.MEMBERSHIP)


class Hit(NamedTuple):
    """One search result from a store: the record id and its score (higher is better)."""

    id: str
    score: float


class Candidates(NamedTuple):
    """One candidate list of a search: up to ``k`` ``kind`` records by cosine similarity to the search's vector
    (``method`` "cosine", :meth:`Store.vector_search`) or by BM25 for its text ("bm25", :meth:`Store.text_search`)."""

    method: Literal["cosine", "bm25"]
    kind: Kind
    k: int


class Closest(NamedTuple):
    """One read of :meth:`Store.closest_facts`: its arguments."""

    entity_ids: Sequence[str]
    vector: Vector
    k: int
    relation: str
    same: bool = True
    holding: bool = False


def check_candidates(asks: Sequence[Candidates]) -> None:
    """Refuse a batch of :class:`Candidates` with an unknown method (before anything is read)."""
    for ask in asks:
        if ask.method not in ("cosine", "bm25"):
            raise ValidationError(f"unknown candidate method {ask.method!r}: use 'cosine' or 'bm25'")


@dataclass(slots=True)
class WriteBatch:
    """Records to upsert and ``(kind, id)`` pairs to delete, applied all-or-nothing by :meth:`Store.write`."""

    puts: list[Record] = field(default_factory=list)
    deletes: list[tuple[Kind, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.puts or self.deletes)


@dataclass(slots=True)
class RecordSet:
    """Every record of a memory as a snapshot holds them: by kind, in store order.

    ``times`` and ``vectors`` are the same data in column form, when the reader has it (a backend may use them
    instead of reading the records one by one): per kind, each time field as int64 microseconds since the epoch
    (an absent optional time is the int64 minimum), and the kind's vectors as ``(positions, matrix)`` where row
    ``i`` of ``matrix`` is the vector of record ``positions[i]``.

    Iterating yields every record in dependency order (endpoints first).
    """

    records: dict[Kind, list[Record]] = field(default_factory=dict)
    times: dict[Kind, dict[str, npt.NDArray[np.int64]]] = field(default_factory=dict)
    vectors: dict[Kind, tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Record]:
        for kind in KIND_ORDER:
            yield from self.records.get(kind, ())

    def __len__(self) -> int:
        return sum(len(r) for r in self.records.values())


#: A section's content as a backend hands it over for writing: bytes, or an array written from its own memory.
SectionData = bytes | npt.NDArray[Any]


@dataclass(slots=True)
class IndexExport:
    """What a backend gives a snapshot besides its records (see :meth:`Store.export_indexes`).

    ``sections`` are the backend's own index sections, named and encoded by the backend; the snapshot stores
    them verbatim, checksummed, and hands them back to :meth:`Store.restore`. ``times`` (per kind, time field ->
    int64 microseconds in scan order, absent as int64 minimum), ``vectors`` (per kind, a function from scan
    positions to those records' vectors) and ``fields`` (per kind, a function from a field name to the values of
    that field in scan order, as the records hold them) are optional fast paths for writing the records
    themselves: columns the backend already holds, instead of converting record by record. With ``fields``, the
    records of that kind are not scanned at all.
    """

    sections: dict[str, SectionData] = field(default_factory=dict)
    times: dict[Kind, dict[str, npt.NDArray[np.int64]]] = field(default_factory=dict)
    vectors: dict[Kind, Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float32]]] = field(default_factory=dict)
    fields: dict[Kind, Callable[[str], list[Any]]] = field(default_factory=dict)


class Sections(Protocol):
    """The index sections a snapshot holds, as :meth:`Store.restore` reads them. Every section was checked against
    its checksum when the snapshot was opened."""

    #: The snapshot's format version (a backend may have written its sections differently in older formats).
    version: int

    def names(self) -> list[str]:
        """The sections present (the backend's own names)."""
        ...

    def read(self, name: str) -> memoryview:
        """A section's bytes (read-only; :class:`KeyError` for a section that is not there)."""
        ...


class Store(abc.ABC):
    """What tkg needs from storage. Implementations live in ``backends/``.

    Subclasses implement the abstract methods (the contract is in each docstring) and override an optional
    power only when they have it.
    """

    #: Several processes may open the same data at once (a database). :meth:`group_lock` is then a lock that
    #: holds across processes, and the memory takes it around every read-modify-write of a group.
    shared: ClassVar[bool] = False
    #: :meth:`export_indexes` and :meth:`restore` carry the backend's search indexes through a snapshot, so a
    #: load does not rebuild them.
    persists_indexes: ClassVar[bool] = False
    #: The store keeps nothing between processes itself and can append every committed batch to a write-ahead
    #: journal (:meth:`attach_journal`); :meth:`tkg.Memory.open` makes it durable that way.
    journals: ClassVar[bool] = False

    #: The vector dimension this store was opened with (every vector put must have it).
    dim: int

    # -- the contract ------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def write(self, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically: validate everything (ids, vector dimension and finiteness, that the entities
        and episodes a fact or mention points to exist in the store or the batch; see :mod:`tkg.integrity`), then
        apply all of it. On any error nothing is changed. Puts replace records with the same kind and id; deletes
        of missing ids are ignored."""

    @abc.abstractmethod
    def get(self, kind: Kind, ids: Sequence[str]) -> list[Record | None]:
        """The records with these ids, in order; ``None`` where there is none."""

    @abc.abstractmethod
    def scan(self, kind: Kind, group_ids: frozenset[str] | None = None) -> Iterator[Record]:
        """Every record of a kind (in the given groups), in insertion order. The iterator works on a copy taken
        when it starts: writes made while it is consumed do not disturb it."""

    @abc.abstractmethod
    def count(self, kind: Kind, group_ids: frozenset[str] | None = None) -> int:
        """How many records of a kind (in the given groups)."""

    @abc.abstractmethod
    def groups(self) -> set[str]:
        """The group_ids that hold at least one record."""

    @abc.abstractmethod
    def vector_search(self, kind: Kind, vector: Vector, k: int, scope: Scope) -> list[Hit]:
        """Up to ``k`` records admitted by ``scope``, by cosine similarity to ``vector``, best first. Records without
        a vector are never returned."""

    @abc.abstractmethod
    def text_search(self, kind: Kind, query: str, k: int, scope: Scope) -> list[Hit]:
        """Up to ``k`` records admitted by ``scope`` that share at least one term with ``query``, by full-text
        relevance (BM25 or the backend's equivalent), best first. Scores are positive."""

    @abc.abstractmethod
    def entities_by_name(self, group_id: str, names: Sequence[str]) -> dict[str, list[Entity]]:
        """Entities of ``group_id`` whose normalised name or alias (:func:`tkg.names.normalize_name`) equals the
        normalised form of each given name; keyed by that normalised form."""

    @abc.abstractmethod
    def facts_of(self, entity_ids: Sequence[str], scope: Scope | None = None) -> list[Fact]:
        """Facts with either end among ``entity_ids`` (admitted by ``scope`` when given), in insertion order."""

    @abc.abstractmethod
    def bfs(self, seeds: Sequence[str], depth: int, scope: Scope, limit: int | None = None) -> dict[str, int]:
        """Entities reachable from the ``seeds`` over facts admitted by ``scope`` (either direction), within
        ``depth`` hops: entity id -> hop count (seeds are 0). With ``limit``, the search stops once that many
        entities are reached (seeds included): those a breadth-first walk meets first, the seeds in the order
        given, then each entity's facts in the order they were first written. Every entity returned then has its
        true hop count, and no unreturned entity is nearer than the farthest returned one."""

    @abc.abstractmethod
    def mentions(
        self, episode_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Mention]:
        """Mentions from these episodes and/or to these entities (both given: both must match), in insertion
        order; neither given: all of them."""

    @abc.abstractmethod
    def memberships(
        self, community_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Membership]:
        """Memberships of these communities and/or of these entities (both given: both must match), in insertion
        order; neither given: all of them."""

    @abc.abstractmethod
    def episode_facts(self, episode_id: str) -> list[Fact]:
        """Provenance: the facts whose ``episodes`` include ``episode_id``, in insertion order."""

    @abc.abstractmethod
    def recent_episodes(self, group_id: str, before: datetime, n: int) -> list[Episode]:
        """The ``n`` latest episodes of a group with ``reference_time <= before``, oldest first."""

    @abc.abstractmethod
    def episode_window(self, episode_id: str, before: int, after: int) -> list[Episode]:
        """The episode and up to ``before`` / ``after`` of its neighbours on its group's timeline (ordered by
        reference time, then by insertion), oldest first; empty for an unknown id."""

    # -- optional powers, with defaults ------------------------------------------------------------------------
    def get_together(self, asks: Sequence[tuple[Kind, Sequence[str]]]) -> list[list[Record | None]]:
        """What :meth:`get` returns for each ``(kind, ids)`` of ``asks``, in order. The default asks one after the
        other; a backend whose reads wait on a server answers them together."""
        return [self.get(kind, ids) for kind, ids in asks]

    def candidates(self, asks: Sequence[Candidates], query: str, vector: Vector, scope: Scope) -> list[list[Hit]]:
        """The answer to each of ``asks`` for the search of ``query`` (text) and ``vector`` within ``scope``, in
        order: exactly what :meth:`vector_search` or :meth:`text_search` returns for it. The default asks them
        one after the other; a backend whose searches wait on a server answers them together."""
        check_candidates(asks)
        return [
            self.vector_search(ask.kind, vector, ask.k, scope)
            if ask.method == "cosine"
            else self.text_search(ask.kind, query, ask.k, scope)
            for ask in asks
        ]

    def closest_facts_together(self, asks: Sequence[Closest]) -> list[list[tuple[Fact, float]]]:
        """What :meth:`closest_facts` returns for each of ``asks``, in order (a new fact's first reads around its
        ends: its own relation and the others). The default asks one after the other; a backend whose reads wait
        on a server answers them together."""
        return [
            self.closest_facts(a.entity_ids, a.vector, a.k, a.relation, same=a.same, holding=a.holding) for a in asks
        ]

    def facts_between(self, pairs: Sequence[tuple[str, str]]) -> list[Fact]:
        """Facts joining the two entities of any of ``pairs``, either way round, in insertion order."""
        wanted = {tuple(sorted(pair)) for pair in pairs}
        ends = sorted({e for pair in wanted for e in pair})
        return [f for f in self.facts_of(ends) if tuple(sorted((f.source_id, f.target_id))) in wanted]

    def facts_with(self, entity_ids: Sequence[str], relation: str) -> list[Fact]:
        """Facts with an end among ``entity_ids`` and this relation, in insertion order."""
        return [f for f in self.facts_of(entity_ids) if f.relation == relation]

    def facts_judging(self, fact_ids: Sequence[str], entity_ids: Sequence[str]) -> list[Fact]:
        """Facts with an end among ``entity_ids`` whose verdicts (:attr:`tkg.models.Fact.verdicts`, any verdict)
        name one of ``fact_ids``, in insertion order."""
        wanted = set(fact_ids)
        return [f for f in self.facts_of(entity_ids) if f.verdicts and not wanted.isdisjoint(f.verdicts)]

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
        """Up to ``k`` facts with an end among ``entity_ids``, with ``relation`` (``same``) or any other relation
        (not ``same``), by cosine similarity of their embedding to ``vector``, best first (equal scores in
        insertion order); facts without an embedding are never returned; with ``holding``, only facts no later
        fact superseded (``expired_at`` None). Exact here; a backend may answer a large candidate set from its
        approximate vector index, as :meth:`vector_search` does."""
        facts = [
            f
            for f in self.facts_of(entity_ids)
            if (f.relation == relation) == same and f.embedding is not None and not (holding and f.expired_at)
        ]
        if not facts or k <= 0:
            return []
        query = check_vectors(vector, len(facts[0].embedding))[0]  # type: ignore[arg-type]
        matrix = np.array([f.embedding for f in facts], dtype=np.float32)
        scores = cosines(matrix, query, inverse_norms(matrix)).tolist()  # as every store scores (tkg.cosines)
        order = sorted(range(len(facts)), key=lambda i: -scores[i])[:k]
        return [(facts[i], scores[i]) for i in order]

    def fact_ends(self, scope: Scope) -> tuple[list[str], list[str]]:
        """The source and the target id of every fact ``scope`` admits, in insertion order: the edges of the graph
        for whole-graph work (community detection) that needs nothing else of the facts. The default scans
        them; a backend reads the two ends alone (no record is built)."""
        facts = [f for f in self.scan(Kind.FACT, scope.group_ids) if scope.admits(f)]
        return [f.source_id for f in facts], [f.target_id for f in facts]  # type: ignore[union-attr]

    def group_lock(self, group_id: str) -> AbstractContextManager[None]:
        """Held around a read-modify-write cycle of one group. A :attr:`shared` store locks across processes;
        the default is no lock (the memory's own locks suffice within one process)."""
        return contextlib.nullcontext()

    def load(self, records: Iterable[Record]) -> None:
        """Bulk-load records into an empty store (a snapshot, a migration). The default is one :meth:`write`;
        a backend may build its indexes once at the end instead."""
        if any(self.count(kind) for kind in Kind):
            raise BackendError("load() needs an empty store")
        self.write(WriteBatch(puts=list(records)))

    def export_indexes(self) -> IndexExport | None:
        """The backend's own index sections for a snapshot (see :class:`IndexExport`); None: nothing to add."""
        return None

    def restore(self, records: RecordSet, sections: Sections | None) -> dict[str, Any]:
        """Fill this empty store from a snapshot: the records, and the backend's index sections of
        :meth:`export_indexes` when present (a backend must check that they fit the records and rebuild what does
        not). Returns a report of what was reused and what rebuilt. The default loads the records."""
        self.load(records)
        return {}

    def claim_embedder(self, name: str) -> None:
        """Called by every :class:`tkg.Memory` over this store with its embedder's name. A store whose data
        outlives the process records the first name and raises :class:`~tkg.errors.ConfigurationError` for
        another, so that vectors of two embedders are never mixed (same size or not). The default does nothing:
        a store that lives in one process, or one whose files record the embedder (the snapshot does)."""
        return None

    def attach_journal(self, journal: Journal | None) -> None:
        """From now on, append every committed batch to ``journal`` before applying it (None: stop). Only a
        store that declares :attr:`journals`; others persist themselves."""
        raise BackendError(f"{type(self).__name__} persists its own writes; it takes no journal")

    def flush(self) -> None:
        """Fold pending index work into the bulk indexes now (a long-running memory does it on its own)."""
        return None

    def wait_for_maintenance(self, timeout: float | None = None) -> bool:
        """Wait until the index work this store runs in the background is done (tests and benchmarks); False if
        ``timeout`` seconds passed first. The default: a store that runs none."""
        return True

    def stats(self) -> dict[str, Any]:
        """Counts and backend details, for humans and benchmarks."""
        return {"records": {kind.value: self.count(kind) for kind in Kind}, "groups": len(self.groups())}

    def close(self) -> None:
        """Release connections and files (the store is unusable after)."""
        return None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
