"""Read queries over a store that are not search: lookups by name, an entity's facts, neighbourhoods, listings.

Pure functions of a :class:`tkg.storage.Store` and a :class:`tkg.timeline.Scope`; :class:`tkg.Memory` calls them
under its read lock, and the doors (servers, CLI, pictures) reach them only through the memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from tkg.models import Entity, Episode, EpisodeStatus, Fact, Kind
from tkg.storage import Store
from tkg.timeline import Scope


@dataclass(frozen=True, slots=True)
class Neighbourhood:
    """The entities within some hops of a centre entity and the facts among them.

    ``hops`` maps each kept entity id to its distance from the centre (the centre is 0); ``omitted`` counts the
    entities reached but left out by the limit.
    """

    center: Entity
    hops: dict[str, int]
    entities: dict[str, Entity]
    facts: list[Fact]
    omitted: int = 0


def entities_named(store: Store, name: str, groups: Iterable[str]) -> list[Entity]:
    """Entities of these groups whose name or alias equals ``name`` once normalised, by group then store order."""
    found: dict[str, Entity] = {}
    for group in sorted(groups):
        for matches in store.entities_by_name(group, [name]).values():
            found.update((e.id, e) for e in matches)
    return list(found.values())


def entities_by_id(store: Store, ids: Iterable[str]) -> dict[str, Entity]:
    wanted = sorted(set(ids))
    return {e.id: e for e in store.get(Kind.ENTITY, wanted) if isinstance(e, Entity)}


def facts_about(store: Store, entity_ids: Sequence[str], scope: Scope | None) -> list[Fact]:
    """Facts touching any of these entities (admitted by ``scope`` when given), by start of validity (the time
    they were recorded when unknown), then id."""
    found = store.facts_of(entity_ids, scope)
    return sorted(found if scope is None else map(scope.shown, found), key=lambda f: (f.valid_at or f.created_at, f.id))


def neighbourhood(store: Store, center: Entity, depth: int, scope: Scope, limit: int) -> Neighbourhood:
    """Walk ``depth`` hops out from ``center`` over the facts ``scope`` admits, keeping at most ``limit`` entities
    (nearest first, then by name). The facts are every admitted fact touching a kept entity (one whose other end
    was left out by the limit included)."""
    hops, entities = {center.id: 0}, {center.id: center}
    frontier, omitted = [center.id], 0
    facts: dict[str, Fact] = {}
    for hop in range(1, depth + 1):
        found = store.facts_of(frontier, scope)
        facts.update((f.id, f) for f in found)
        new_ids = {i for f in found for i in (f.source_id, f.target_id)} - hops.keys()
        fresh = [e for e in entities_by_id(store, new_ids).values() if scope.admits(e)]
        fresh.sort(key=lambda e: (e.name.casefold(), e.id))
        room = max(limit - len(hops), 0)
        omitted += max(len(fresh) - room, 0)
        for e in fresh[:room]:
            hops[e.id], entities[e.id] = hop, e
        frontier = [e.id for e in fresh[:room]]
        if not frontier:
            break
    # Facts among the kept entities that the walk did not cross (e.g. between two ring-1 neighbours).
    facts.update((f.id, f) for f in store.facts_of(list(hops), scope))
    return Neighbourhood(center, hops, entities, [scope.shown(f) for f in facts.values()], omitted)


def episodes(
    store: Store,
    groups: frozenset[str] | None,
    status: EpisodeStatus | None,
    before: datetime | None = None,
    last: int | None = None,
) -> list[Episode]:
    """Episodes of these groups (all groups: None), with this status when given, said at or before ``before``
    when given, by reference time, then creation, then store order; with ``last``, the latest ``last`` of them
    (of one group and any status: read from its timeline, :meth:`Store.recent_episodes`)."""
    if last is not None and status is None and groups is not None and len(groups) == 1:
        until = before if before is not None else datetime.max.replace(tzinfo=UTC)
        found = store.recent_episodes(next(iter(groups)), until, last)
    else:
        found = [
            e
            for e in store.scan(Kind.EPISODE, groups)
            if isinstance(e, Episode)
            and (status is None or e.status is status)
            and (before is None or e.reference_time <= before)
        ]
    found.sort(key=lambda e: (e.reference_time, e.created_at))
    return found if last is None else found[len(found) - last :] if last else []


def facts(store: Store, groups: frozenset[str] | None, scope: Scope | None) -> list[Fact]:
    """Facts of these groups admitted by ``scope`` (every fact, history included: None), in store order."""
    if scope is None:
        return [f for f in store.scan(Kind.FACT, groups) if isinstance(f, Fact)]
    return [scope.shown(f) for f in store.scan(Kind.FACT, groups) if isinstance(f, Fact) and scope.admits(f)]
