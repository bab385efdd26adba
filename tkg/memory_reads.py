"""The read half of the facade: what the doors (servers, CLI, pictures) and tests need besides search, each
call under the memory's read lock (:mod:`tkg.locks`). :class:`tkg.Memory` is the only class that uses it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from tkg import reads
from tkg.clock import Clock
from tkg.embedders.base import Embedder
from tkg.errors import NotFoundError, ValidationError
from tkg.locks import MemoryLocks
from tkg.models import Entity, Episode, EpisodeStatus, Fact, Kind, Mention, Record, check_id_list, check_lookup_id
from tkg.reads import Neighbourhood
from tkg.storage import Store
from tkg.timeline import Filters, group_set, make_scope
from tkg.timeutil import optional_utc

Groups = Sequence[str] | str | None


class MemoryReads:
    """Reads of a memory's store (see :class:`tkg.Memory`)."""

    _store: Store
    _locks: MemoryLocks
    _clock: Clock
    _embedder: Embedder

    def get(self, kind: Kind | str, record_id: str) -> Record:
        """The record of this kind with this id; :class:`NotFoundError` if there is none."""
        found = self.get_many(kind, [check_lookup_id(record_id)])[0]
        if found is None:
            raise NotFoundError(f"no {kind_of(kind).value} with id {record_id!r}")
        return found

    def get_many(self, kind: Kind | str, ids: Sequence[str]) -> list[Record | None]:
        """The records of this kind with these ids, in order; None where there is none."""
        kind = kind_of(kind)
        wanted = check_id_list(ids, "ids (get() reads one record)")
        with self._locks.read():
            return self._store.get(kind, wanted)

    def groups(self) -> list[str]:
        """The groups that hold at least one record, sorted."""
        with self._locks.read():
            return sorted(self._store.groups())

    def records(self, kind: Kind | str, group_ids: Groups = None) -> list[Record]:
        """Every record of a kind (in these groups), history included, in store order: a full read, for exports
        and tests. For current facts use :meth:`get_all`; for relevance, :meth:`search`."""
        groups = group_set(group_ids)
        with self._locks.read():
            return list(self._store.scan(kind_of(kind), groups))

    def get_all(
        self,
        group_ids: Groups = None,
        *,
        as_of: datetime | str | None = None,
        known_at: datetime | str | None = None,
        include_invalidated: bool = False,
        filters: Filters | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Fact]:
        """The facts of these groups, in store order: by default those that hold now as the memory knows them;
        ``as_of`` / ``known_at`` / ``include_invalidated`` / ``filters`` as in :meth:`search`. ``limit`` and
        ``offset`` page through them."""
        if limit is not None:
            _at_least(limit, "limit", 1)
        _at_least(offset, "offset", 0)
        scope = make_scope(self._clock.now(), group_ids, as_of, known_at, include_invalidated, filters)
        with self._locks.read():
            found = reads.facts(self._store, scope.group_ids, scope)
        return found[offset:] if limit is None else found[offset : offset + limit]

    def episodes(
        self,
        group_ids: Groups = None,
        *,
        status: EpisodeStatus | str | None = None,
        before: datetime | str | None = None,
        last: int | None = None,
    ) -> list[Episode]:
        """Episodes of these groups (with this status), by reference time, then creation. ``before``: only those
        said at or before it; ``last``: only the latest ``last`` of those (still oldest first), as the previous
        messages of a conversation at a time."""
        try:
            state = None if status is None else EpisodeStatus(status)
        except ValueError:
            raise ValidationError(f"unknown status {status!r}; use one of {[s.value for s in EpisodeStatus]}") from None
        if last is not None and (not isinstance(last, int) or isinstance(last, bool) or last < 0):
            raise ValidationError(f"last must be a non-negative integer, got {last!r}")
        until = optional_utc(before, "before")
        groups = group_set(group_ids)
        with self._locks.read():
            return reads.episodes(self._store, groups, state, until, last)

    def find_entities(self, name: str, *, group_ids: Groups = None) -> list[Entity]:
        """Entities whose name or alias equals ``name`` once normalised as entity resolution does."""
        if not isinstance(name, str) or not name.strip():
            raise ValidationError("an entity name is needed, got an empty value")
        groups = group_set(group_ids)
        with self._locks.read():
            return reads.entities_named(self._store, name, groups if groups is not None else self._store.groups())

    def facts_about(
        self,
        entity_id: str | Sequence[str],
        *,
        include_invalidated: bool = True,
        as_of: datetime | str | None = None,
        known_at: datetime | str | None = None,
    ) -> list[Fact]:
        """Every fact touching an entity (or any of several), oldest first: its history, ended facts included,
        unless ``include_invalidated=False``; ``as_of`` / ``known_at`` view it at other times."""
        ids = [entity_id] if isinstance(entity_id, str) else entity_id
        if not isinstance(ids, Sequence) or not all(isinstance(i, str) for i in ids):
            raise ValidationError(f"entity_id must be an entity id or a list of them, got {entity_id!r}")
        ids = list(ids)
        with self._locks.read():
            for found, wanted in zip(self._store.get(Kind.ENTITY, ids), ids, strict=True):
                if found is None:
                    raise NotFoundError(f"no entity with id {wanted!r}")
            timed = as_of is not None or known_at is not None or not include_invalidated
            scope = make_scope(self._clock.now(), None, as_of, known_at, include_invalidated) if timed else None
            return reads.facts_about(self._store, ids, scope)

    def neighbourhood(
        self,
        entity_id: str,
        *,
        depth: int = 1,
        as_of: datetime | str | None = None,
        known_at: datetime | str | None = None,
        limit: int = 100,
    ) -> Neighbourhood:
        """The entities within ``depth`` hops of an entity and the facts among them, in its group, as the memory
        knew them at ``known_at`` (default now): every fact, ended ones included, or with ``as_of`` those that held
        then. At most ``limit`` entities (nearest first, then by name); :attr:`Neighbourhood.omitted` counts the
        rest. Raises :class:`NotFoundError` for an unknown entity, or one recorded after ``known_at``."""
        _at_least(depth, "depth", 0)
        _at_least(limit, "limit", 1)
        known = optional_utc(known_at, "known_at")
        center = self.get(Kind.ENTITY, entity_id)
        assert isinstance(center, Entity)
        if known is not None and center.created_at > known:
            raise NotFoundError(
                f"entity {center.name!r} ({entity_id}) was recorded at {center.created_at.isoformat()}, after "
                f"known_at {known.isoformat()}: the memory did not know it yet"
            )
        scope = make_scope(self._clock.now(), [center.group_id], as_of, known, include_invalidated=True)
        with self._locks.read():
            return reads.neighbourhood(self._store, center, depth, scope, limit)

    def episode_mentions(self, episode_id: str) -> list[Mention]:
        """The entities an episode names, as mentions (with what the episode said about each)."""
        episode_id = check_lookup_id(episode_id)
        with self._locks.read():
            return self._store.mentions(episode_ids=[episode_id])

    def stats(self, group_ids: Groups = None) -> dict[str, Any]:
        """Record counts by kind (in these groups), the groups, and the embedder's name."""
        groups = group_set(group_ids)
        with self._locks.read():
            counts = {kind.value: self._store.count(kind, groups) for kind in Kind}
            held = sorted(self._store.groups() if groups is None else groups & self._store.groups())
        return {"records": counts, "groups": held, "embedder": self._embedder.name}


def _at_least(value: object, what: str, least: int) -> None:
    """Raise :class:`ValidationError` unless ``value`` is an integer (not a bool) of at least ``least``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValidationError(f"{what} must be an integer of at least {least}, got {value!r}")


def kind_of(kind: Kind | str) -> Kind:
    """``kind`` as a :class:`Kind`; :class:`ValidationError` for a name that is none."""
    try:
        return Kind(kind)
    except ValueError:
        raise ValidationError(f"unknown record kind {kind!r}; use one of {[k.value for k in Kind]}") from None
