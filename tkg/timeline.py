"""Which records a query sees, on both timelines. The one definition every backend must agree with.

A query names up to two points in time:

* ``known_at`` (transaction time T'): look at the memory as it stood then. Only records created at or before it
  are seen, and a supersession learnt after it (``expired_at > known_at``) is not yet known, so the fact still
  ends where it ended before: the earlier supersession believed then (:mod:`tkg.revisions`), else its own end
  (``prior_invalid_at``: its own end date, or open-ended). Defaults to now.
* ``as_of`` (event time T): keep the facts that held in the world at that moment, ``valid_at <= as_of <
  invalid_at`` with missing bounds open. Defaults to ``known_at``: "what was believed true at that moment".

``include_invalidated=True`` drops the event-time check (history and current facts together) unless ``as_of``
is given explicitly. Entities and communities are seen once created; episodes too, and with an explicit
``as_of`` only those whose reference time is not after it.

A scope may also carry filters (:class:`Filters`): entity labels, fact relation types, and date ranges on the
timestamps of each kind. A filter that names a label or relation nothing has simply admits nothing of that kind.
A date range judges a fact as the view shows it (:meth:`Scope.shown`): its ``invalid_at`` and ``expired_at`` as
known at ``known_at``, not what was learnt later.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TypeVar

from tkg import revisions
from tkg.errors import ValidationError
from tkg.models import Community, Entity, Episode, Fact, Record, check_group_id
from tkg.timeutil import optional_utc, to_utc

R = TypeVar("R", bound=Record)

#: The timestamps a :class:`DateRange` can name, and the kinds of record that have each.
DATE_FIELDS: dict[str, tuple[type, ...]] = {
    "valid_at": (Fact,),
    "invalid_at": (Fact,),
    "created_at": (Fact, Entity, Episode, Community),
    "expired_at": (Fact,),
    "reference_time": (Episode,),
}


@dataclass(frozen=True, slots=True)
class DateRange:
    """``start <= record.<field> < end`` (either bound may be open). A missing timestamp (``None``: unknown
    start, still open, never expired) fails the range unless ``include_missing``.

    >>> from datetime import UTC
    >>> DateRange("valid_at", start=datetime(2024, 1, 1, tzinfo=UTC)).field
    'valid_at'
    """

    field: str
    start: datetime | str | None = None
    end: datetime | str | None = None
    include_missing: bool = False

    def __post_init__(self) -> None:
        if self.field not in DATE_FIELDS:
            raise ValidationError(f"DateRange field {self.field!r} is unknown; use one of {sorted(DATE_FIELDS)}")
        start = optional_utc(self.start, f"DateRange({self.field}).start")
        end = optional_utc(self.end, f"DateRange({self.field}).end")
        if start is not None and end is not None and end < start:
            raise ValidationError(f"DateRange({self.field}): end {end.isoformat()} is before start {start.isoformat()}")
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "end", end)

    def applies_to(self, record: Record) -> bool:
        return isinstance(record, DATE_FIELDS[self.field])

    def admits(self, record: Record) -> bool:
        value = getattr(record, self.field)
        if value is None:
            return self.include_missing
        start, end = self.start, self.end
        return (start is None or start <= value) and (end is None or value < end)  # type: ignore[operator]


@dataclass(frozen=True, slots=True)
class Filters:
    """Filters beside the two timelines: entity labels (any of), fact relation types (any of), date ranges (all).

    Each applies only to the kinds it concerns: labels to entities, relations to facts, a date range to the kinds
    that have its field.
    """

    labels: frozenset[str] | None = None
    relations: frozenset[str] | None = None
    dates: tuple[DateRange, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("labels", "relations"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, Iterable) or not all(isinstance(v, str) and v for v in value):
                raise ValidationError(f"Filters.{name} must be non-empty strings, got {value!r}")
            object.__setattr__(self, name, frozenset(value))
        given = (self.dates,) if isinstance(self.dates, DateRange) else self.dates  # one, as for labels
        dates = tuple(given) if isinstance(given, Iterable) else ()
        if not isinstance(given, Iterable) or not all(isinstance(d, DateRange) for d in dates):
            raise ValidationError(f"Filters.dates must be DateRange values, got {self.dates!r}")
        object.__setattr__(self, "dates", dates)

    def __bool__(self) -> bool:
        return self.labels is not None or self.relations is not None or bool(self.dates)

    def admits(self, record: Record) -> bool:
        if self.labels is not None and isinstance(record, Entity) and self.labels.isdisjoint(record.labels):
            return False
        if self.relations is not None and isinstance(record, Fact) and record.relation not in self.relations:
            return False
        return all(d.admits(record) for d in self.dates if d.applies_to(record))


NO_FILTERS = Filters()


@dataclass(frozen=True, slots=True)
class Scope:
    """A resolved view: which groups, and the two time points. Built by :func:`make_scope`."""

    group_ids: frozenset[str] | None
    known_at: datetime
    as_of: datetime | None  # None: no event-time check on facts
    explicit_as_of: bool = False
    filters: Filters = NO_FILTERS
    #: ``known_at`` was asked for, not read from the clock: the view does not move with time (a store may cache
    #: it as it is, where a view of "now" is cached for as long as the clock crosses no stored timestamp).
    explicit_known_at: bool = False

    def admits(self, record: Record) -> bool:
        if self.group_ids is not None and record.group_id not in self.group_ids:
            return False
        if record.created_at > self.known_at:
            return False
        if self.filters and not self.filters.admits(self.shown(record)):  # a fact's times as the view knows them
            return False
        if isinstance(record, Fact):
            return self.as_of is None or fact_holds(record, self.as_of, self.known_at)
        if isinstance(record, Episode) and self.explicit_as_of and self.as_of is not None:
            return record.reference_time <= self.as_of
        return True

    def shown(self, record: R) -> R:
        """``record`` as this view shows it: a fact as the memory knew it at ``known_at`` (:func:`as_known`)."""
        return as_known(record, self.known_at) if isinstance(record, Fact) else record  # type: ignore[return-value]

    def unfiltered(self) -> Scope:
        """The same view without :class:`Filters` (graph traversal walks the whole visible graph)."""
        return self if not self.filters else replace(self, filters=NO_FILTERS)


def believed_invalid_at(fact: Fact, known_at: datetime) -> datetime | None:
    """The fact's end as the memory knew it at ``known_at``: a supersession learnt later is not yet known, so the
    fact ends where it ended before that -- the earlier supersession believed then (:mod:`tkg.revisions`), else its
    own end (``prior_invalid_at``: its own end, or open). An end given by hand (:meth:`tkg.Memory.invalidate_fact`)
    after ``known_at`` is not known then either: the own end is the one it replaced."""
    return revisions.believed_end(fact, known_at)


def as_known(fact: Fact, known_at: datetime) -> Fact:
    """``fact`` as the memory held it at ``known_at`` (:func:`tkg.revisions.as_known`): a supersession learnt later is
    undone, an end given by hand later not given yet, so a view of a past time shows the fact it filtered by, not
    today's record."""
    return revisions.as_known(fact, known_at)


def fact_holds(fact: Fact, at: datetime, known_at: datetime) -> bool:
    """Did ``fact`` hold in the world at ``at``, according to what the memory knew at ``known_at``?"""
    if fact.valid_at is not None and fact.valid_at > at:
        return False
    end = believed_invalid_at(fact, known_at)
    return end is None or at < end


def group_set(group_ids: Iterable[str] | str | None) -> frozenset[str] | None:
    """``group_ids`` -- one id, an iterable of ids, or None (every group) -- as a set of checked ids."""
    if group_ids is None:
        return None
    if isinstance(group_ids, str):
        group_ids = [group_ids]
    elif not isinstance(group_ids, Iterable) or isinstance(group_ids, bytes | Mapping):
        raise ValidationError(f"group_ids must be a group id or a list of them, got {type(group_ids).__name__}")
    return frozenset(check_group_id(g) for g in group_ids)


def make_scope(
    now: datetime,
    group_ids: Iterable[str] | str | None = None,
    as_of: datetime | str | None = None,
    known_at: datetime | str | None = None,
    include_invalidated: bool = False,
    filters: Filters | None = None,
) -> Scope:
    """Resolve the user's query arguments against ``now`` (from the clock seam) into a :class:`Scope`."""
    if filters is not None and not isinstance(filters, Filters):
        raise ValidationError(f"filters must be a tkg.timeline.Filters value, not {filters!r}")
    if not isinstance(include_invalidated, bool):
        raise ValidationError(f"include_invalidated must be True or False, not {include_invalidated!r}")
    groups = group_set(group_ids)
    asked = optional_utc(known_at, "known_at")
    tx = asked or to_utc(now, "now")
    event = optional_utc(as_of, "as_of")
    explicit = event is not None
    if event is None and not include_invalidated:
        event = tx
    return Scope(
        group_ids=groups,
        known_at=tx,
        as_of=event,
        explicit_as_of=explicit,
        filters=filters or NO_FILTERS,
        explicit_known_at=asked is not None,
    )
