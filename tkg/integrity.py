"""Reference integrity: what a write may point to, decided once for every backend.

* every record put is a tkg record;
* a fact's two entities exist (in the store, or in the same write) and belong to the fact's group: facts never
  cross groups;
* a mention's episode and entity exist, a membership's community and entity exist, each of the link's group.

A record put and deleted in the same write counts as deleted (deletes apply after puts). A backend calls
:func:`check_write` before it changes anything, with a lookup of what it already holds; a bulk load into an empty
store passes a lookup that finds nothing, so everything must be in the load itself.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from operator import attrgetter

from tkg.errors import BackendError, ValidationError
from tkg.models import RECORD_TYPES, Kind, Record

#: ``(kind, ids) -> {id: group_id}`` for those of the ids the store holds.
Lookup = Callable[[Kind, Collection[str]], Mapping[str, str]]

_GROUP, _SOURCE, _TARGET = attrgetter("group_id"), attrgetter("source_id"), attrgetter("target_id")
_EPISODE, _ENTITY, _COMMUNITY = attrgetter("episode_id"), attrgetter("entity_id"), attrgetter("community_id")
_ENDPOINTS = (Kind.EPISODE, Kind.ENTITY, Kind.COMMUNITY)


def references(puts: Sequence[Record], deletes: Iterable[tuple[Kind, str]]) -> dict[Kind, list[str]]:
    """The ids :func:`check_write` asks its lookup for, by kind (sorted; a kind with none is left out): those the
    puts point to that the write itself does not put. A backend that pays a round trip per lookup reads them all at
    once, before the check."""
    return {kind: ids for kind, ids in _partition(puts, deletes)[2].items() if ids}


def _partition(
    puts: Sequence[Record], deletes: Iterable[tuple[Kind, str]]
) -> tuple[dict[Kind, list[Record]], set[tuple[Kind, str]], dict[Kind, list[str]]]:
    """The puts by kind, the deletes as (kind, id), and per endpoint kind the ids referenced from outside the write."""
    types = tuple(RECORD_TYPES.values())
    by_kind: dict[Kind, list[Record]] = {kind: [] for kind in Kind}
    for record in puts:
        if not isinstance(record, types):
            raise ValidationError(f"cannot store {type(record).__name__}; expected a tkg record")
        by_kind[record.kind].append(record)
    deleted = {(Kind(kind), record_id) for kind, record_id in deletes}
    facts, mentions, members = by_kind[Kind.FACT], by_kind[Kind.MENTION], by_kind[Kind.MEMBERSHIP]
    referenced: dict[Kind, set[str]] = {
        Kind.ENTITY: {*map(_SOURCE, facts), *map(_TARGET, facts), *map(_ENTITY, mentions), *map(_ENTITY, members)},
        Kind.EPISODE: set(map(_EPISODE, mentions)),
        Kind.COMMUNITY: set(map(_COMMUNITY, members)),
    }
    needed = {}
    for kind in _ENDPOINTS:
        incoming = {r.id for r in by_kind[kind] if (kind, r.id) not in deleted}
        needed[kind] = sorted(i for i in referenced[kind] if i not in incoming)
    return by_kind, deleted, needed


def nothing_stored(kind: Kind, ids: Collection[str]) -> Mapping[str, str]:
    """The lookup of an empty store."""
    return {}


def check_write(puts: Sequence[Record], deletes: Iterable[tuple[Kind, str]], stored: Lookup) -> None:
    """Raise :class:`ValidationError` (not a record) or :class:`BackendError` (a dangling or cross-group
    reference) if applying ``puts`` then ``deletes`` to a store holding what ``stored`` finds would break the
    rules above. ``stored`` is asked once per kind, for the ids of :func:`references` (none: not asked). Whole
    columns are compared at C speed; the loops that name a culprit run only on failure."""
    by_kind, deleted, needed = _partition(puts, deletes)
    facts, mentions, members = by_kind[Kind.FACT], by_kind[Kind.MENTION], by_kind[Kind.MEMBERSHIP]
    groups: dict[Kind, dict[str, str]] = {}
    for kind in _ENDPOINTS:
        found = stored(kind, needed[kind]) if needed[kind] else {}
        incoming = {r.id: r.group_id for r in by_kind[kind] if (kind, r.id) not in deleted}
        groups[kind] = {**{i: g for i, g in found.items() if (kind, i) not in deleted}, **incoming}
    entity_group = groups[Kind.ENTITY]
    fact_groups = list(map(_GROUP, facts))
    if (
        list(map(entity_group.get, map(_SOURCE, facts))) != fact_groups
        or list(map(entity_group.get, map(_TARGET, facts))) != fact_groups
    ):
        for fact in facts:
            for end in (_SOURCE(fact), _TARGET(fact)):
                group = entity_group.get(end)
                if group is None:
                    raise BackendError(f"fact {fact.id} points to entity {end!r}, which does not exist")
                if group != fact.group_id:
                    raise BackendError(
                        f"fact {fact.id} in group {fact.group_id!r} points to entity {end!r} of group {group!r}; "
                        "facts never cross groups"
                    )
    _check_link("mention", mentions, _EPISODE, groups[Kind.EPISODE], "episode", entity_group)
    _check_link("membership", members, _COMMUNITY, groups[Kind.COMMUNITY], "community", entity_group)


def _check_link(
    what: str,
    links: Sequence[Record],
    first: Callable[[Record], str],
    first_group: Mapping[str, str],
    first_kind: str,
    entity_group: Mapping[str, str],
) -> None:
    """A link record (a mention, a membership) points to an existing record of ``first_kind`` and an existing
    entity, both of its own group."""
    link_groups = list(map(_GROUP, links))
    if list(map(first_group.get, map(first, links))) == link_groups and (
        list(map(entity_group.get, map(_ENTITY, links))) == link_groups
    ):
        return
    for link in links:
        ends = (first_group.get(first(link)), entity_group.get(_ENTITY(link)))
        if None in ends:
            raise BackendError(f"{what} {link.id} points to a missing {first_kind} or entity")
        if ends != (link.group_id, link.group_id):  # type: ignore[attr-defined]
            raise BackendError(
                f"{what} {link.id} in group {link.group_id!r} links records of groups {ends[0]!r} and {ends[1]!r}; "  # type: ignore[attr-defined]
                f"{what}s never cross groups"
            )
