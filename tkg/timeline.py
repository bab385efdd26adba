"""Which records a query sees, on both timelines. The one definition every backend must agree with.

A query names up to two points in time:

* ``known_at`` (transaction time T'): look at the memory as it stood then. Only records created at or before it
  are seen, and an invalidation learnt after it (``expired_at > known_at``) is not yet known, so the fact still
  looks open-ended. Defaults to now.
* ``as_of`` (event time T): keep the facts that held in the world at that moment, ``valid_at <= as_of <
  invalid_at`` with missing bounds open. Defaults to ``known_at``: "what was believed true at that moment".

``include_invalidated=True`` drops the event-time check (history and current facts together) unless ``as_of``
is given explicitly. Entities and communities are seen once created; episodes too, and with an explicit
``as_of`` only those whose reference time is not after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from tkg.models import Episode, Fact, Record, check_group_id
from tkg.timeutil import optional_utc, to_utc


@dataclass(frozen=True, slots=True)
class Scope:
    """A resolved view: which groups, and the two time points. Built by :func:`make_scope`."""

    group_ids: frozenset[str] | None
    known_at: datetime
    as_of: datetime | None  # None: no event-time check on facts
    explicit_as_of: bool = False

    def admits(self, record: Record) -> bool:
        if self.group_ids is not None and record.group_id not in self.group_ids:
            return False
        if record.created_at > self.known_at:
            return False
        if isinstance(record, Fact):
            return self.as_of is None or fact_holds(record, self.as_of, self.known_at)
        if isinstance(record, Episode) and self.explicit_as_of and self.as_of is not None:
            return record.reference_time <= self.as_of
        return True


def believed_invalid_at(fact: Fact, known_at: datetime) -> datetime | None:
    """The fact's end as the memory knew it at ``known_at``: an invalidation learnt later is not yet known."""
    if fact.expired_at is not None and fact.expired_at > known_at:
        return None
    return fact.invalid_at


def fact_holds(fact: Fact, at: datetime, known_at: datetime) -> bool:
    """Did ``fact`` hold in the world at ``at``, according to what the memory knew at ``known_at``?"""
    if fact.valid_at is not None and fact.valid_at > at:
        return False
    end = believed_invalid_at(fact, known_at)
    return end is None or at < end


def make_scope(
    now: datetime,
    group_ids: Iterable[str] | str | None = None,
    as_of: datetime | str | None = None,
    known_at: datetime | str | None = None,
    include_invalidated: bool = False,
) -> Scope:
    """Resolve the user's query arguments against ``now`` (from the clock seam) into a :class:`Scope`."""
    if isinstance(group_ids, str):
        group_ids = [group_ids]
    groups = None if group_ids is None else frozenset(check_group_id(g) for g in group_ids)
    tx = optional_utc(known_at, "known_at") or to_utc(now, "now")
    event = optional_utc(as_of, "as_of")
    explicit = event is not None
    if event is None and not include_invalidated:
        event = tx
    return Scope(group_ids=groups, known_at=tx, as_of=event, explicit_as_of=explicit)
