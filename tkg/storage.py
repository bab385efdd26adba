"""The storage interface: the one narrow seam between tkg's core and any backend.

Plain records in, plain records and ``(id, score)`` hits out; no backend type crosses it. Every backend answers
these calls with the same results (the conformance suite in ``tests/`` is the definition of "a backend works");
where scoring legitimately differs (BM25 implementations), the suite states the contract both meet.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple, Protocol, runtime_checkable

from tkg.models import Entity, Episode, Fact, Kind, Membership, Mention, Record, Vector
from tkg.timeline import Scope


class Hit(NamedTuple):
    """One search result from a store: the record id and its score (higher is better)."""

    id: str
    score: float


@dataclass(slots=True)
class WriteBatch:
    """Records to upsert and ``(kind, id)`` pairs to delete, applied all-or-nothing by :meth:`Store.write`."""

    puts: list[Record] = field(default_factory=list)
    deletes: list[tuple[Kind, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.puts or self.deletes)


@runtime_checkable
class Store(Protocol):
    """What tkg needs from storage. Implementations live in ``backends/``."""

    #: The vector dimension this store was opened with (every vector put must have it).
    dim: int

    def write(self, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically: validate everything (ids, vector dimension and finiteness, that the entities
        and episodes a fact or mention points to exist in the store or the batch), then apply all of it. On any
        error nothing is changed. Puts replace records with the same kind and id; deletes of missing ids are
        ignored."""
        ...

    def get(self, kind: Kind, ids: Sequence[str]) -> list[Record | None]:
        """The records with these ids, in order; ``None`` where there is none."""
        ...

    def scan(self, kind: Kind, group_ids: frozenset[str] | None = None) -> Iterator[Record]:
        """Every record of a kind (in the given groups), in insertion order."""
        ...

    def count(self, kind: Kind, group_ids: frozenset[str] | None = None) -> int: ...

    def groups(self) -> set[str]:
        """The group_ids that hold at least one record."""
        ...

    def vector_search(self, kind: Kind, vector: Vector, k: int, scope: Scope) -> list[Hit]:
        """Up to ``k`` records admitted by ``scope``, by cosine similarity to ``vector``, best first. Records without
        a vector are never returned."""
        ...

    def text_search(self, kind: Kind, query: str, k: int, scope: Scope) -> list[Hit]:
        """Up to ``k`` records admitted by ``scope`` that share at least one term with ``query``, by full-text
        relevance (BM25 or the backend's equivalent), best first. Scores are positive."""
        ...

    def entities_by_name(self, group_id: str, names: Sequence[str]) -> dict[str, list[Entity]]:
        """Entities of ``group_id`` whose normalised name or alias (:func:`tkg.names.normalize_name`) equals the
        normalised form of each given name; keyed by that normalised form."""
        ...

    def facts_of(self, entity_ids: Sequence[str], scope: Scope | None = None) -> list[Fact]:
        """Facts with either end among ``entity_ids`` (admitted by ``scope`` when given), in insertion order."""
        ...

    def bfs(self, seeds: Sequence[str], depth: int, scope: Scope, limit: int | None = None) -> dict[str, int]:
        """Entities reachable from the ``seeds`` over facts admitted by ``scope`` (either direction), within
        ``depth`` hops: entity id -> hop count (seeds are 0). With ``limit``, the search stops once that many
        entities are reached (seeds included); every entity returned then has its true hop count, and no
        unreturned entity is nearer than the farthest returned one."""
        ...

    def mentions(
        self, episode_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Mention]:
        """Mentions from these episodes and/or to these entities (both given: both must match)."""
        ...

    def memberships(
        self, community_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Membership]:
        """Memberships of these communities and/or of these entities (both given: both must match), in insertion
        order; neither given: all of them."""
        ...

    def episode_facts(self, episode_id: str) -> list[Fact]:
        """Provenance: the facts whose ``episodes`` include ``episode_id``."""
        ...

    def recent_episodes(self, group_id: str, before: datetime, n: int) -> list[Episode]:
        """The ``n`` latest episodes of a group with ``reference_time <= before``, oldest first."""
        ...

    def episode_window(self, episode_id: str, before: int, after: int) -> list[Episode]:
        """The episode and up to ``before`` / ``after`` of its neighbours on its group's timeline (ordered by
        reference time, then by insertion), oldest first; empty for an unknown id."""
        ...
