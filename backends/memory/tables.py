"""The in-memory backend's slot tables: one per kind of record, the records (as rows, :mod:`.rows`) and the numpy
columns that filters run on (group, both timelines, relation, labels), so a scope becomes one boolean mask per
query."""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from tkg.models import Kind, Record, Vector
from tkg.timeline import Filters, Scope
from tkg.timeutil import to_micros

from .arrays import MAX, MIN, Column, ObjectList, any_of, around
from .histories import FactHistories
from .rows import CODECS, Row, RowCodec
from .vectors import Mask

#: The ids a secondary index keeps under one key (an entity's facts, an episode's mentions...), as the keys of a
#: dict whose values are None: used as a set, but unlike a set not tracked by Python's cycle collector (a dict of
#: strings only is left out of it), so a full garbage collection walks ~165,000 fewer objects at 100,000 facts.
IdSet = dict[str, None]


def name_key(group_id: str, name: str) -> str:
    """The key of a normalized entity name in a group: one string (a tuple key would have the collector track the
    index's key map), unambiguous whatever the two hold."""
    return f"{len(group_id)}:{group_id}{name}"


class SetIndex:
    """A secondary index, key -> :data:`IdSet`, used as a dict of them (``get``, ``setdefault``, ``del``...). A
    dict whose values are dicts is tracked by the collector, and every full collection visits each of its values
    (~160,000 at 100,000 facts across the store's indexes); here the sets sit in a numpy array of objects, which it
    does not walk (no cycle can pass through a set of strings), and the keys map to their positions in a dict of
    integers, which it does not track."""

    __slots__ = ("_at", "_free", "_sets")

    def __init__(self) -> None:
        self._at: dict[Hashable, int] = {}
        self._sets = ObjectList()
        self._free = array("q")  # positions freed

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._at

    def __getitem__(self, key: Hashable) -> IdSet:
        return self._sets[self._at[key]]  # type: ignore[no-any-return]

    def get(self, key: Hashable, default: Any = None) -> Any:
        at = self._at.get(key)
        return default if at is None else self._sets[at]

    def __setitem__(self, key: Hashable, ids: IdSet) -> None:
        at = self._at.get(key)
        if at is None:
            if not self._free:
                self._at[key] = len(self._sets)
                self._sets.append(ids)
                return
            at = self._free.pop()
            self._at[key] = at
        self._sets[at] = ids

    def setdefault(self, key: Hashable, default: IdSet) -> IdSet:
        at = self._at.get(key)
        if at is not None:
            return self._sets[at]  # type: ignore[no-any-return]
        self[key] = default
        return default

    def items(self) -> Iterator[tuple[Hashable, IdSet]]:
        sets = self._sets
        return ((key, sets[at]) for key, at in self._at.items())

    def __delitem__(self, key: Hashable) -> None:
        at = self._at.pop(key)
        self._sets[at] = None
        self._free.append(at)

    def fill(self, keys: Sequence[Hashable], sets: Iterable[IdSet]) -> None:
        """Hold ``sets`` under ``keys`` (distinct), this index being empty: a bulk restore's millions of sets."""
        assert not self._at, "fill() is for an empty index"
        self._at = dict(zip(keys, range(len(keys)), strict=True))
        self._sets = ObjectList(sets)
        self._free = array("q")


class Timeline:
    """A group's episodes in (reference time, slot) order, as two arrays of machine integers: a list of pairs
    would cost every full collection a visit per episode."""

    __slots__ = ("refs", "slots")

    def __init__(self, pairs: Iterable[tuple[int, int]] = ()) -> None:
        ordered = sorted(pairs)
        self.refs = array("q", [ref for ref, _ in ordered])
        self.slots = array("q", [slot for _, slot in ordered])

    def __len__(self) -> int:
        return len(self.refs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timeline) and (self.refs, self.slots) == (other.refs, other.slots)

    __hash__ = None  # type: ignore[assignment]

    def position(self, ref: int, slot: int) -> int:
        """Where (``ref``, ``slot``) is, or would go."""
        low = bisect.bisect_left(self.refs, ref)
        return bisect.bisect_left(self.slots, slot, low, bisect.bisect_right(self.refs, ref, low))

    def insert(self, ref: int, slot: int) -> None:
        at = self.position(ref, slot)
        self.refs.insert(at, ref)
        self.slots.insert(at, slot)

    def remove(self, ref: int, slot: int) -> None:
        at = self.position(ref, slot)
        del self.refs[at]
        del self.slots[at]

    def end_of(self, ref: int) -> int:
        """The position after the last episode at or before ``ref``."""
        return bisect.bisect_right(self.refs, ref)


#: Records made from rows that a table keeps for its next reads: an episode reads the facts around its entities
#: several times (their closest, then each one's statement), so most reads find their record made; bounded, as
#: these records are objects the cycle collector walks (4,096 facts: a few MB, against ~1 GB at 100,000). A history
#: longer than this (one value changed or restated thousands of times) is made again at each of its reads: at
#: 1,024, a value changed 2,000 times cost 64 ms an episode, 45 ms at 4,096 (bench_hot_entity.py --moves).
_MADE = 4096


def micros_or(value: datetime | None, missing: int) -> int:
    return missing if value is None else to_micros(value)


class Table:
    """Slots of one kind: the records (as rows), their ids, and the numpy columns that filters run on."""

    def __init__(self, kind: Kind, codec: RowCodec | None = None) -> None:
        self.kind = kind
        self.codec = CODECS[kind] if codec is None else codec
        self.rows = ObjectList()  # rows by slot (None: a deleted record's slot), out of the collector's walk
        self._made: dict[int, tuple[Row, Record]] = {}  # slot -> (its row, the record last made of it)
        self.slot_of: dict[str, int] = {}
        self.alive = Column(np.bool_, False)
        self.group = Column(np.int32, -1)
        self.created = Column(np.int64, MAX)
        # Facts: event interval and expiry. Episodes: reference time in `valid`.
        self.valid = Column(np.int64, MIN)
        self.invalid = Column(np.int64, MAX)
        self.expired = Column(np.int64, MAX)
        # A superseded fact's end before the supersession: what a query known before its expiry believes.
        self.prior = Column(np.int64, MAX)
        # Facts whose end changed on the transaction timeline beyond what these columns hold (superseded more than
        # once, ended by hand): a query known before such a change reads their end there.
        self.histories = FactHistories()
        # Filters: a fact's relation code; one boolean column per entity label (labels are few).
        self.relation = Column(np.int32, -1)
        # Facts: the codes of their two ends (the store's entity codes), for the neighbourhood of a hot entity.
        self.source = Column(np.int32, -1)
        self.target = Column(np.int32, -1)
        self.labels: dict[str, Column] = {}
        self.live = 0
        self.version = 0  # bumped on every change; cached masks are keyed by it
        # The slot each version bump since _log_base changed (touch()), so a cached mask can be brought up to date
        # by recomputing those slots alone. A bump that did not log (a bulk change) makes the log disagree with the
        # version, and masks are then recomputed whole.
        self._log = array("q")  # not a list: a full garbage collection would visit each of its items
        self._log_base = 0

    def touch(self, slot: int) -> None:
        """Record that ``slot`` changed: a new version."""
        if len(self._log) != self.version - self._log_base or len(self._log) > 4 * len(self.rows) + 4096:
            # after a bulk change, or to keep the log bounded: masks of older versions recompute whole
            self._log = array("q")
            self._log_base = self.version
        self.version += 1
        self._log.append(slot)

    def changed_since(self, version: int) -> npt.NDArray[np.int64] | None:
        """The slots changed after ``version`` (sorted, unique), or None when the log cannot say."""
        if version < self._log_base or len(self._log) != self.version - self._log_base:
            return None
        return np.unique(np.frombuffer(self._log[version - self._log_base :], dtype=np.int64))

    def slot_for(self, record_id: str) -> int:
        slot = self.slot_of.get(record_id)
        if slot is not None:
            return slot
        slot = len(self.rows)
        self.rows.append(None)
        self.slot_of[record_id] = slot
        columns = (self.alive, self.group, self.created, self.valid, self.invalid, self.expired, self.prior)
        for column in (*columns, self.relation, self.source, self.target):
            column.ensure(slot + 1)
        for column in self.labels.values():
            column.ensure(slot + 1)
        return slot

    def set_labels(self, slot: int, labels: Iterable[str]) -> None:
        wanted = set(labels)
        for label, column in self.labels.items():
            if slot < column.size:
                column[slot] = label in wanted
        for label in wanted - self.labels.keys():
            column = Column(np.bool_, False)
            column.ensure(self.alive.size)
            column[slot] = True
            self.labels[label] = column

    def get(self, record_id: str) -> Record | None:
        slot = self.slot_of.get(record_id)
        return None if slot is None else self.record(slot)

    def record(self, slot: int) -> Record | None:
        """The record at ``slot`` (the store's lock held): made from its row, or the one made last time if the row
        is the same object still (a put replaces the row)."""
        row = self.rows[slot]
        if row is None:
            return None
        made = self._made.get(slot)
        if made is not None and made[0] is row:
            return made[1]
        record = self.codec.unpack(row)
        if len(self._made) >= _MADE:
            del self._made[next(iter(self._made))]  # the oldest
        self._made[slot] = (row, record)
        return record

    def records_at(self, slots: Iterable[int]) -> list[Record]:
        """The records at these slots (all live), in that order (the store's lock held)."""
        return list(map(self.record, slots))  # type: ignore[arg-type]

    def live_records(self, group_ids: frozenset[str] | None = None) -> Iterator[Record]:
        """Every live record (of these groups) in slot order, read from a copy of the rows taken now: writes after
        do not show, and the records are made as the caller iterates (no lock needed then: rows are immutable)."""
        rows, unpack, group_of = self.rows.copy(), self.codec.unpack, self.codec.getter("group_id")
        return (unpack(r) for r in rows if r is not None and (group_ids is None or group_of(r) in group_ids))

    def store(self, slot: int, record: Record, vector: Vector | None) -> None:
        """Keep ``record`` at ``slot``, with ``vector`` (the vector index's view of its vector, or None)."""
        self.rows[slot] = self.codec.pack(record, vector)

    def mask(
        self,
        scope: Scope | None,
        group_codes: dict[str, int],
        relation_codes: dict[str, int],
        rows: npt.NDArray[np.int64] | None = None,
    ) -> Mask:
        """The scope's mask over all slots, or over the slots ``rows`` only (in that order)."""

        def col(column: Column) -> npt.NDArray:  # type: ignore[type-arg]
            return column.at(rows)

        mask = col(self.alive).copy()
        if scope is None:
            return mask
        if scope.group_ids is not None:
            codes = [group_codes[g] for g in scope.group_ids if g in group_codes]
            groups = col(self.group)
            if not codes:
                return np.zeros_like(mask)
            mask &= any_of(groups, codes)
        tx = to_micros(scope.known_at)
        mask &= col(self.created) <= tx
        if self.kind is Kind.FACT and scope.as_of is not None:
            mask &= self.holding(to_micros(scope.as_of), self.believed_ends(tx, rows), rows)
        elif self.kind is Kind.EPISODE and scope.explicit_as_of and scope.as_of is not None:
            mask &= col(self.valid) <= to_micros(scope.as_of)
        if scope.filters:
            self._filter(mask, scope.filters, relation_codes, col, tx, rows)
        return mask

    def believed_ends(self, tx: int, rows: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.int64]:
        """Each fact's end as known at ``tx`` (MAX: open), over all slots or ``rows``. A supersession learnt after
        ``tx`` is not yet known then: the fact ends where it ended before (``prior_invalid_at``, or what
        :attr:`histories` holds: :func:`tkg.timeline.believed_invalid_at`). expired_at None is stored as MAX."""
        expired = self.expired.at(rows)
        ends = np.where((expired > tx) & (expired != MAX), self.prior.at(rows), self.invalid.at(rows))
        if self.histories:
            self.histories.adjust(ends, (expired, self.invalid.at(rows), self.prior.at(rows)), tx, rows)
        return ends

    def believed_expiry(self, tx: int, rows: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.int64]:
        """Each fact's ``expired_at`` as known at ``tx`` (MAX: not superseded as far as was known then), over all
        slots or ``rows``: the record's once learnt by then, else the earlier supersession believed then
        (:attr:`histories`), else none (:func:`tkg.timeline.as_known`)."""
        expired = self.expired.at(rows)
        expiry = np.where(expired <= tx, expired, MAX)
        if self.histories:
            self.histories.adjust_expiry(expiry, expired, tx, rows)
        return expiry

    def holding(self, at: int, ends: npt.NDArray[np.int64], rows: npt.NDArray[np.int64] | None = None) -> Mask:
        """Where a fact held in the world at ``at``, given its believed ``ends`` (over all slots, or ``rows``)."""
        return (self.valid.at(rows) <= at) & (at < ends)  # type: ignore[no-any-return]

    def stable_interval(self, now: int, event_time: bool, rows: npt.NDArray[np.int64] | None = None) -> tuple[int, int]:
        """``[lo, hi)`` around ``now`` in which no stored timestamp that a "now" mask depends on changes its
        comparison with "now" (creation; for facts judged at "now" also validity and expiry); over the slots
        ``rows`` only when given."""
        columns = [self.created.at(rows)]
        if self.kind is Kind.FACT and event_time:
            columns += [c.at(rows) for c in (self.valid, self.invalid, self.expired, self.prior)]
            if self.histories:
                columns.append(self.histories.times())
        lo, hi = MIN, MAX
        for values in columns:
            below, above = around(values, now)
            lo, hi = max(lo, below), min(hi, above)
        return lo, hi

    def _filter(
        self,
        mask: Mask,
        filters: Filters,
        relation_codes: dict[str, int],
        col: Callable[[Column], npt.NDArray],  # type: ignore[type-arg]
        tx: int,
        rows: npt.NDArray[np.int64] | None,
    ) -> None:
        if filters.labels is not None and self.kind is Kind.ENTITY:
            labelled = np.zeros_like(mask)
            for label in filters.labels:
                column = self.labels.get(label)
                if column is not None:
                    labelled |= col(column)
            mask &= labelled
        if filters.relations is not None and self.kind is Kind.FACT:
            codes = [relation_codes[r] for r in filters.relations if r in relation_codes]
            mask &= any_of(col(self.relation), codes)
        for rng in filters.dates:
            column, missing = self._date_column(rng.field)
            if column is None:
                continue
            if self.kind is Kind.FACT and rng.field == "invalid_at":  # as the view knows them
                values = self.believed_ends(tx, rows)
            elif self.kind is Kind.FACT and rng.field == "expired_at":
                values = self.believed_expiry(tx, rows)
            else:
                values = col(column)
            inside = np.ones_like(mask)
            if rng.start is not None:
                inside &= values >= to_micros(rng.start)  # type: ignore[arg-type]
            if rng.end is not None:
                inside &= values < to_micros(rng.end)  # type: ignore[arg-type]
            if missing is not None:
                absent = values == missing
                inside = (inside & ~absent) | (absent if rng.include_missing else False)
            mask &= inside

    def _date_column(self, name: str) -> tuple[Column | None, int | None]:
        """The column holding a DateRange field for this kind, and the sentinel that stands for ``None``."""
        if name == "created_at":
            return self.created, None
        if self.kind is Kind.FACT:
            return {
                "valid_at": (self.valid, MIN),
                "invalid_at": (self.invalid, MAX),
                "expired_at": (self.expired, MAX),
            }.get(name, (None, None))
        if self.kind is Kind.EPISODE and name == "reference_time":
            return self.valid, None
        return None, None
