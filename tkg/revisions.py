"""A fact's transaction-time history beyond what its record holds: earlier supersessions, and ends given by hand.

A fact record holds its end as the memory believes it now (``invalid_at``, ``invalidated_by``, ``expired_at``: when
the memory learnt it) and its own end (``prior_invalid_at`` while it is superseded). That answers a view of any
past transaction time as long as a fact is superseded once. A fact superseded again *differently* -- a late fact
about the past ends it earlier than the fact that first ended it -- or holding again while what superseded it stays
(an end given by hand before that fact started) had another believed end in between; each such earlier state is
kept in ``fact.attributes["tkg.revisions"]``, oldest first: the end it was given, the fact that gave it, when the
memory learnt it (``expired_at``) and when it stopped believing it (``until``), as ISO-8601 strings. So at a
transaction time the memory believed the revision whose ``[expired_at, until)`` holds it, else the record's own
supersession once learnt, else the fact's own end (:func:`state_at`, :func:`believed_end`).

An end given by hand (:meth:`tkg.Memory.invalidate_fact`) changes the fact's own end; each is recorded in
``fact.attributes["tkg.ended_by_hand"]`` with when it was recorded and the own end it replaced, so a view known
before it sees the end it replaced (:func:`own_end_at`).

An episode that states a fact again adds itself to the fact's ``episodes`` (its provenance); each such episode is
recorded in ``fact.attributes["tkg.restated_by"]`` with when the memory learnt it (:func:`restated`), so a view
known before it lists the episodes of then, not one it did not have yet.

The rules that write revisions are in :func:`tkg.invalidation.history` (a supersession replaced while its cause
stays becomes one; a removal is as if the episode had never been added: a state it undoes -- a supersession by a
removed fact or learnt with one, or holding again learnt with one -- goes back to the revision it replaced,
dropping the revisions after it, or else leaves the revision before it believed until the removal; a revision whose
fact was removed is dropped); :func:`believed_end` and :func:`as_known` read them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tkg.errors import ValidationError
from tkg.models import Fact, evolve

#: The attribute that holds a fact's earlier supersessions (see the module docstring).
REVISIONS = "tkg.revisions"
#: The attribute that records ends given by hand (:meth:`tkg.Memory.invalidate_fact`), oldest first: the end,
#: when it was recorded, and the fact's own end before it (ISO-8601 strings, None for open).
ENDED_BY_HAND = "tkg.ended_by_hand"
#: The attribute that records the episodes that stated a fact again after it was recorded, oldest first: the
#: episode's id and when the memory learnt it (ISO-8601).
RESTATED_BY = "tkg.restated_by"


@dataclass(frozen=True, slots=True)
class Revision:
    """One earlier believed state of a superseded fact: ended at ``invalid_at`` by ``invalidated_by``, learnt at
    ``expired_at``, believed until ``until``."""

    invalid_at: datetime
    invalidated_by: str
    expired_at: datetime
    until: datetime

    def as_attribute(self) -> dict[str, str]:
        return {
            "invalid_at": self.invalid_at.isoformat(),
            "invalidated_by": self.invalidated_by,
            "expired_at": self.expired_at.isoformat(),
            "until": self.until.isoformat(),
        }


def revisions_of(fact: Fact) -> tuple[Revision, ...]:
    """The fact's earlier supersessions, oldest first (none for most facts)."""
    raw = fact.attributes.get(REVISIONS)
    if not raw:
        return ()
    return tuple(_parse(entry) for entry in raw)


def _parse(entry: Mapping[str, Any]) -> Revision:
    return Revision(
        datetime.fromisoformat(entry["invalid_at"]),
        str(entry["invalidated_by"]),
        datetime.fromisoformat(entry["expired_at"]),
        datetime.fromisoformat(entry["until"]),
    )


def check_history(fact: Fact) -> None:
    """Raise :class:`tkg.errors.ValidationError` if the fact's history attributes are not what tkg writes (a file
    edited by hand, imported): every read of a past transaction time parses them."""
    try:
        earlier = revisions_of(fact)
        hand = hand_ends(fact)
        again = restated(fact)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValidationError(
            f"fact {fact.id!r}: malformed {REVISIONS!r}, {ENDED_BY_HAND!r} or {RESTATED_BY!r} attribute ({exc})"
        ) from None
    times = [
        *(t for r in earlier for t in (r.invalid_at, r.expired_at, r.until)),
        *(t for pair in hand for t in pair),
        *(at for _, at in again),
    ]
    for when in times:
        if when is not None and when.tzinfo is None:
            raise ValidationError(f"fact {fact.id!r}: a time in its history attributes has no UTC offset")


def with_revisions(attributes: Mapping[str, Any], revisions: Sequence[Revision]) -> dict[str, Any]:
    """``attributes`` holding ``revisions`` (the key is left out when there are none)."""
    out = {k: v for k, v in attributes.items() if k != REVISIONS}
    if revisions:
        out[REVISIONS] = [r.as_attribute() for r in revisions]
    return out


def state_at(fact: Fact, known_at: datetime) -> Revision | None:
    """The earlier supersession the memory believed at ``known_at`` (the one learnt by then and not yet replaced),
    or None: then it believed the record's own supersession (learnt by then) or the fact's own end."""
    if fact.expired_at is not None and fact.expired_at <= known_at:
        return None
    for revision in reversed(revisions_of(fact)):
        if revision.expired_at <= known_at:
            return revision if known_at < revision.until else None
    return None


def hand_ends(fact: Fact) -> tuple[tuple[datetime, datetime | None], ...]:
    """The ends given the fact by hand, oldest first: (when each was recorded, the fact's own end before it)."""
    return tuple(
        (datetime.fromisoformat(e["recorded_at"]), _time_or_none(e.get("previous_end")))
        for e in fact.attributes.get(ENDED_BY_HAND) or ()
    )


def restated(fact: Fact) -> tuple[tuple[str, datetime], ...]:
    """The episodes that stated the fact again after it was recorded, oldest first: (episode id, when learnt)."""
    return tuple(
        (str(e["episode"]), datetime.fromisoformat(e["recorded_at"])) for e in fact.attributes.get(RESTATED_BY) or ()
    )


def stated_again(fact: Fact, episode_id: str, now: datetime) -> Fact:
    """``fact`` with ``episode_id`` among its episodes, recorded as learnt at ``now`` (itself if it is already)."""
    if episode_id in fact.episodes:
        return fact
    entry = {"episode": episode_id, "recorded_at": now.isoformat()}
    attributes = {**fact.attributes, RESTATED_BY: [*fact.attributes.get(RESTATED_BY, ()), entry]}
    return evolve(fact, episodes=(*fact.episodes, episode_id), attributes=attributes)


def without_episode(fact: Fact, episode_id: str) -> Fact:
    """``fact`` as if ``episode_id`` had never stated it (a removal): gone from its episodes and their record."""
    entries = [e for e in fact.attributes.get(RESTATED_BY) or () if e["episode"] != episode_id]
    attributes = {k: v for k, v in fact.attributes.items() if k != RESTATED_BY}
    if entries:
        attributes[RESTATED_BY] = entries
    return evolve(fact, episodes=tuple(e for e in fact.episodes if e != episode_id), attributes=attributes)


def _time_or_none(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def has_history(fact: Fact) -> bool:
    """Whether the fact holds any of this history (most facts hold none)."""
    return REVISIONS in fact.attributes or ENDED_BY_HAND in fact.attributes


def own_end_at(fact: Fact, known_at: datetime) -> datetime | None:
    """The fact's own end as the memory had it at ``known_at``: before an end given by hand was recorded, the end
    it replaced; else the own end its record holds (``prior_invalid_at`` once it is expired, else ``invalid_at``)."""
    return _own_end_at(hand_ends(fact), known_at, fact)


def _own_end_at(ends: Sequence[tuple[datetime, datetime | None]], known_at: datetime, fact: Fact) -> datetime | None:
    for recorded_at, previous in ends:
        if recorded_at > known_at:
            return previous
    return fact.invalid_at if fact.expired_at is None else fact.prior_invalid_at


def believed_end(fact: Fact, known_at: datetime) -> datetime | None:
    """The fact's end as the memory believed it at ``known_at``: the record's end once its supersession was learnt
    (``expired_at <= known_at``), else the earlier supersession believed then (:func:`state_at`), else its own end
    as it was then (:func:`own_end_at`: an end given by hand later is not given yet)."""
    if fact.expired_at is not None and fact.expired_at <= known_at:
        return fact.invalid_at
    revision = state_at(fact, known_at)
    if revision is not None:
        return revision.invalid_at
    return own_end_at(fact, known_at)


def as_known(fact: Fact, known_at: datetime) -> Fact:
    """``fact`` as the memory held it at ``known_at``: a supersession learnt later is undone (the fact is superseded
    by what superseded it then, if anything), an end given by hand later is not given yet, an episode that stated it
    again later is not among its episodes yet, and its attributes list only the changes recorded by then. ``fact``
    itself when nothing was changed after ``known_at``."""
    hand = fact.attributes.get(ENDED_BY_HAND) or ()
    ends = hand_ends(fact)
    later_by_hand = any(recorded_at > known_at for recorded_at, _ in ends)
    again = restated(fact)
    later_sources = {episode for episode, recorded_at in again if recorded_at > known_at}
    settled = fact.expired_at is not None and fact.expired_at <= known_at
    earlier = revisions_of(fact)
    if (
        not later_by_hand
        and not later_sources
        and (settled or fact.expired_at is None)
        and all(r.until <= known_at for r in earlier)
    ):
        return fact  # nothing changed after known_at
    revision = state_at(fact, known_at)
    attributes = {k: v for k, v in fact.attributes.items() if k not in (ENDED_BY_HAND, RESTATED_BY)}
    for name, entries, times in (
        (ENDED_BY_HAND, hand, [recorded_at for recorded_at, _ in ends]),
        (RESTATED_BY, fact.attributes.get(RESTATED_BY) or (), [recorded_at for _, recorded_at in again]),
    ):
        then = [entry for entry, recorded_at in zip(entries, times, strict=True) if recorded_at <= known_at]
        if then:  # the record of each change made by then
            attributes[name] = then
    episodes = tuple(e for e in fact.episodes if e not in later_sources)
    own = _own_end_at(ends, known_at, fact)
    if settled:
        return evolve(fact, prior_invalid_at=own, episodes=episodes, attributes=attributes)
    if revision is not None:
        return evolve(
            fact,
            invalid_at=revision.invalid_at,
            invalidated_by=revision.invalidated_by,
            expired_at=revision.expired_at,
            prior_invalid_at=own,
            episodes=episodes,
            attributes=with_revisions(attributes, earlier[: earlier.index(revision)]),
        )
    return evolve(
        fact, invalid_at=own, expired_at=None, invalidated_by=None, prior_invalid_at=None, episodes=episodes,
        attributes=with_revisions(attributes, [r for r in earlier if r.until <= known_at]),
    )  # fmt: skip
