"""Truth maintenance: which facts may contradict a new one, and what a contradiction does to both timelines.

Pure functions over :class:`tkg.models.Fact` values; nothing here reads a store or calls an LLM.

Candidates (:func:`is_candidate`) are never the whole group: only live facts between the same pair of entities
(either direction), or sharing an endpoint *and* the relation type. The LLM, or an ontology rule for single-valued
relations, nominates contradictions among them; the dates then decide (:func:`settle`), as in the Zep paper:

* the intervals must overlap (``[valid_at, invalid_at)``, missing bounds open), or nothing changes;
* the fact that starts later in the world wins: the earlier one's ``invalid_at`` becomes the later one's
  ``valid_at``, and the earlier one's ``expired_at`` is set to the transaction time ("now");
* a tie in world time goes to the newer information (transaction time): the old fact is closed at that instant;
* a late-arriving fact about the past that a newer fact already covers is stored already invalidated.

Every invalidation records which fact caused it (``invalidated_by``) and the end the fact had before
(``prior_invalid_at``), so removing the cause can restore it exactly (:func:`restore`).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from tkg.models import Fact


def is_live(fact: Fact) -> bool:
    """Not superseded: the memory still believes the fact as recorded."""
    return fact.expired_at is None


def same_pair(a: Fact, b: Fact) -> bool:
    return {a.source_id, a.target_id} == {b.source_id, b.target_id}


def is_candidate(new: Fact, old: Fact) -> bool:
    """May ``old`` be a duplicate of, or contradicted by, ``new``? Same pair, or a shared endpoint and relation."""
    if old.id == new.id or not is_live(old) or old.group_id != new.group_id:
        return False
    if same_pair(new, old):
        return True
    shares = bool({new.source_id, new.target_id} & {old.source_id, old.target_id})
    return shares and new.relation == old.relation


def single_valued_conflict(new: Fact, old: Fact) -> bool:
    """For a single-valued relation (one object per subject at a time): same subject and relation, other object."""
    return (
        is_live(old)
        and old.id != new.id
        and old.source_id == new.source_id
        and old.relation == new.relation
        and old.target_id != new.target_id
    )


def overlaps(a: Fact, b: Fact) -> bool:
    """Do the two facts' validity intervals ``[valid_at, invalid_at)`` share an instant? Missing bounds are open.

    Two facts starting at the same instant overlap even if one of them is empty (``valid_at == invalid_at``).
    """
    a0, a1, b0, b1 = a.valid_at, a.invalid_at, b.valid_at, b.invalid_at
    if a0 is not None and b0 is not None and a0 == b0:
        return True
    if a1 is not None and b0 is not None and a1 <= b0:
        return False
    return not (b1 is not None and a0 is not None and b1 <= a0)


def _before(a: datetime | None, b: datetime | None) -> bool:
    """``a`` strictly earlier than ``b``, with a missing start read as 'since forever'."""
    if a is None:
        return b is not None
    return b is not None and a < b


def supersede(fact: Fact, end: datetime | None, by: Fact, now: datetime) -> Fact:
    """``fact`` ended at ``end`` because of ``by``, learnt at transaction time ``now``."""
    if end is None:
        end = now
    if fact.valid_at is not None and end < fact.valid_at:
        end = fact.valid_at
    return dataclasses.replace(
        fact,
        invalid_at=end,
        expired_at=max(now, fact.created_at),
        invalidated_by=by.id,
        prior_invalid_at=fact.invalid_at,
    )


def settle(new: Fact, old: Fact, now: datetime) -> tuple[Fact, Fact]:
    """Apply a contradiction between ``new`` (being added) and ``old`` (already believed); returns both, changed
    where the rules above say so. Non-overlapping facts come back unchanged."""
    if not is_live(old) or not overlaps(new, old):
        return new, old
    if _before(new.valid_at, old.valid_at):
        # A late-arriving fact about the past: the newer fact covers it from its start on.
        if is_live(new):
            return supersede(new, old.valid_at, old, now), old
        if new.invalid_at is not None and old.valid_at is not None and old.valid_at < new.invalid_at:
            return dataclasses.replace(new, invalid_at=old.valid_at), old
        return new, old
    return new, supersede(old, new.valid_at, new, now)


def restore(fact: Fact) -> Fact:
    """Undo a supersession (its cause was removed): the fact's own end comes back and it is live again."""
    if fact.invalidated_by is None:
        return fact
    return dataclasses.replace(
        fact, invalid_at=fact.prior_invalid_at, expired_at=None, invalidated_by=None, prior_invalid_at=None
    )
