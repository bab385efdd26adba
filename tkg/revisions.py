"""A fact's earlier supersessions: the transaction-time history of its end, beyond the one a record holds.

A fact record holds its end as the memory believes it now (``invalid_at``, ``invalidated_by``, ``expired_at``: when
the memory learnt it) and its own end (``prior_invalid_at`` while it is superseded). That answers a view of any
past transaction time as long as a fact is superseded once. A fact superseded again *differently* -- a late fact
about the past ends it earlier than the fact that first ended it -- had another believed end in between; each such
earlier state is kept in ``fact.attributes["tkg.revisions"]``, oldest first: the end it was given, the fact that
gave it, when the memory learnt it (``expired_at``) and when it stopped believing it (``until``), as ISO-8601
strings. So the states of a fact on the transaction timeline are: its own end from ``created_at``, then each
revision from its ``expired_at``, then the record's own state from its ``expired_at``.

The rules that write revisions are in :func:`tkg.invalidation.history` (a re-supersession adds one; a supersession
undone by a removal goes back to the state it replaces, dropping the revisions after it; a revision whose fact was
removed is dropped, as if that fact had never been added); :func:`believed_end` and :func:`learnt_by` read them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tkg.models import Fact

#: The attribute that holds a fact's earlier supersessions (see the module docstring).
REVISIONS = "tkg.revisions"


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


def with_revisions(attributes: Mapping[str, Any], revisions: Sequence[Revision]) -> dict[str, Any]:
    """``attributes`` holding ``revisions`` (the key is left out when there are none)."""
    out = {k: v for k, v in attributes.items() if k != REVISIONS}
    if revisions:
        out[REVISIONS] = [r.as_attribute() for r in revisions]
    return out


def learnt_by(fact: Fact, known_at: datetime) -> tuple[Revision, ...]:
    """The earlier supersessions the memory had learnt by ``known_at`` while it did not yet believe the record's
    state (``expired_at`` unset or reached: none are needed); the last of them is what it believed then."""
    if fact.expired_at is None or fact.expired_at <= known_at:
        return ()
    return tuple(r for r in revisions_of(fact) if r.expired_at <= known_at)


def believed_end(fact: Fact, known_at: datetime) -> datetime | None:
    """The fact's end as the memory believed it at ``known_at``: the record's end once its supersession was learnt
    (``expired_at <= known_at``), else the earlier supersession believed then, else its own end."""
    if fact.expired_at is None or fact.expired_at <= known_at:
        return fact.invalid_at
    learnt = learnt_by(fact, known_at)
    return learnt[-1].invalid_at if learnt else fact.prior_invalid_at
