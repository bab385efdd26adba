"""The facts whose end changed on the transaction timeline beyond what the store's columns hold.

The fact columns (``invalid``, ``expired``, ``prior``) answer a view of any transaction time for a fact superseded
once and never ended by hand. A fact superseded again (its earlier supersessions, :mod:`tkg.revisions`) or ended by
hand (the end it had before) is listed here, by slot, in microseconds; a view known at a time before such a change
reads its end from here (:meth:`FactHistories.adjust`), by the rule of :func:`tkg.revisions.believed_end`. Few facts
are listed, and a view of "now" passes them by with one vectorised test.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tkg.models import Fact
from tkg.revisions import hand_ends, revisions_of
from tkg.timeutil import to_micros

from .arrays import MAX, MIN

Pairs = tuple[tuple[int, int], ...]
Triples = tuple[tuple[int, int, int], ...]


def _micros(value: object) -> int:
    return MAX if value is None else to_micros(value)  # type: ignore[arg-type]


class FactHistories:
    """Slot -> (earlier supersessions as (learnt, believed until, end), ends by hand as (recorded, own end before)),
    oldest first."""

    def __init__(self) -> None:
        self._by_slot: dict[int, tuple[Triples, Pairs]] = {}
        # sorted slots, and for each: when its first supersession here was learnt, when its last was replaced, when
        # its last end by hand was recorded
        self._arrays: tuple[npt.NDArray[np.int64], ...] | None = None

    def __bool__(self) -> bool:
        return bool(self._by_slot)

    def set(self, slot: int, fact: Fact) -> None:
        """List the fact now at ``slot`` if its end changed on the transaction timeline, else forget the slot."""
        revisions = tuple(
            (to_micros(r.expired_at), to_micros(r.until), to_micros(r.invalid_at)) for r in revisions_of(fact)
        )
        hand = tuple((to_micros(at), _micros(before)) for at, before in hand_ends(fact))
        if revisions or hand:
            self._by_slot[slot] = (revisions, hand)
            self._arrays = None
        else:
            self.forget(slot)

    def forget(self, slot: int) -> None:
        if self._by_slot.pop(slot, None) is not None:
            self._arrays = None

    def times(self) -> npt.NDArray[np.int64]:
        """Every time stored here: a view of "now" changes when "now" crosses one."""
        return np.fromiter(
            (t for pairs in self._by_slot.values() for part in pairs for pair in part for t in pair), dtype=np.int64
        )

    def adjust(
        self,
        ends: npt.NDArray[np.int64],
        columns: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]],
        tx: int,
        rows: npt.NDArray[np.int64] | None,
    ) -> None:
        """Correct ``ends`` (the facts' ends as known at ``tx`` by the columns, over all slots or ``rows``) where a
        listed fact's history decides; ``columns``: expired, invalid and prior over the same slots."""
        positions, slots, first_learnt, last_until, last_recorded = self._listed(len(ends), rows)
        expired, invalid, prior = (c[positions] for c in columns)
        # Only where an end by hand came after tx, or a supersession listed here was believed at tx: elsewhere the
        # columns are right.
        wanted = (last_recorded > tx) | ((first_learnt <= tx) & (tx < last_until))
        for i in np.flatnonzero(wanted).tolist():
            revisions, hand = self._by_slot[int(slots[i])]
            ends[positions[i]] = _believed(int(expired[i]), int(invalid[i]), int(prior[i]), revisions, hand, tx)

    def adjust_expiry(
        self, expiry: npt.NDArray[np.int64], expired: npt.NDArray[np.int64], tx: int, rows: npt.NDArray[np.int64] | None
    ) -> None:
        """Correct ``expiry`` (when each fact's supersession was learnt, as known at ``tx`` by the ``expired``
        column: MAX where not by then) where an earlier supersession listed here was believed at ``tx``: the fact
        was expired then, when that one was learnt (the ``expired_at`` of :func:`tkg.revisions.as_known`)."""
        positions, slots, first_learnt, last_until, _ = self._listed(len(expiry), rows)
        wanted = (first_learnt <= tx) & (tx < last_until) & ~((expired[positions] != MAX) & (expired[positions] <= tx))
        for i in np.flatnonzero(wanted).tolist():
            revisions, _ = self._by_slot[int(slots[i])]
            for learnt, until, _ in reversed(revisions):
                if learnt <= tx:
                    if tx < until:
                        expiry[positions[i]] = learnt
                    break

    def _listed(self, size: int, rows: npt.NDArray[np.int64] | None) -> tuple[npt.NDArray[np.int64], ...]:
        """The positions (over all ``size`` slots, or in ``rows``) of the listed facts, and their prefilter arrays
        (:meth:`_prefilter`) in the same order."""
        slots, first_learnt, last_until, last_recorded = self._prefilter()
        if rows is None:
            inside = slots < size
            positions = slots[inside]
            order: npt.NDArray[np.int64] | npt.NDArray[np.bool_] = inside
        else:
            positions = np.flatnonzero(np.isin(rows, slots))
            order = np.searchsorted(slots, rows[positions])
        return (positions, *(a[order] for a in (slots, first_learnt, last_until, last_recorded)))

    def _prefilter(self) -> tuple[npt.NDArray[np.int64], ...]:
        if self._arrays is None:
            slots = np.array(sorted(self._by_slot), dtype=np.int64)
            parts = [self._by_slot[s] for s in slots.tolist()]
            first = np.array([r[0][0] if r else MAX for r, _ in parts], dtype=np.int64)
            until = np.array([max(u for _, u, _ in r) if r else MIN for r, _ in parts], dtype=np.int64)
            last = np.array([max(at for at, _ in h) if h else MIN for _, h in parts], dtype=np.int64)
            self._arrays = (slots, first, until, last)
        return self._arrays


def _believed(expired: int, invalid: int, prior: int, revisions: Triples, hand: Pairs, tx: int) -> int:
    """:func:`tkg.revisions.believed_end` in microseconds (MAX: open)."""
    if expired != MAX and expired <= tx:
        return invalid
    for learnt, until, end in reversed(revisions):
        if learnt <= tx:
            if tx < until:
                return end
            break
    own = invalid if expired == MAX else prior
    for recorded, before in hand:
        if recorded > tx:
            return before
    return own
