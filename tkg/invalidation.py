"""Truth maintenance: which facts may contradict a new one, and the valid-time history a set of facts implies.

Pure functions over :class:`tkg.models.Fact` values; nothing here reads a store or calls an LLM.

A fact keeps what was said about it: its own interval ``[valid_at, own end)`` (:func:`own_end`: the end the episode
gave it, kept in ``prior_invalid_at`` while the fact is superseded), the times it was stated (its episodes'
reference times: the first, and the last), when the memory learnt each (it orders only facts said at one time),
and the LLM's verdicts on the older facts it was compared with (``Fact.verdicts``). The history of a set of facts
is a function of those alone (:func:`history`), never of the order they arrived in otherwise, so adding facts in
any order, or removing one, gives what adding the others alone would have given. The rules:

1. **Same statement.** Two facts state the same thing when they have the same subject, relation and object and
   the same sentence (case, spacing and final punctuation aside), or the same subject, object and single-valued
   relation, or the LLM judged one the same as the other (same two entities). A verbatim repeat with the same
   interval is not a new fact: it adds its episode to the fact's provenance.
2. **Contradiction.** Two facts contradict when the ontology says so (single-valued relation, same subject, another
   object) or the LLM judged one to contradict the other. Verdicts carry over within a statement: a fact restating
   another contradicts what that one contradicts.
3. **The sweep.** The facts are taken in world-time order: by start (an unknown start is "since forever"), then by
   the time they were last said (the newer word second: a fact said again is said anew; at one time, the word
   the memory learnt last), then by sentence, then the longer own end first.
   A fact whose statement already holds when it starts restates it: it is kept with an empty interval,
   superseded by the fact it restates -- unless it holds on past that one's own end: then it continues the
   statement, and the fact it restates ends at its start, so the statement holds over both intervals, once.
   But of the two, a fact with an end of its own last said after the other, from the same start or none said, is the
   newer word on when the statement ended: "works at Acme since 2020", then "worked at Acme until May" (or "from
   2020 to May"), holds until May; a later stint ("at Acme during 2023") ends nothing.
   Otherwise it starts to hold, and every holding fact it contradicts ends at
   its start: old ``invalid_at`` = new ``valid_at``, ``invalidated_by`` = the new fact, ``prior_invalid_at`` = the
   old one's own end. A fact whose own end comes first simply ends. So a fact about the past that arrives late is
   stored already superseded, and it shortens the facts it falls inside, exactly as if it had arrived in order.
   A fact that starts "since forever" and is superseded by another such fact ends when that one was (last) said, or
   at its own end if that comes first (then it is not superseded: it simply ends); until then, a fact that starts
   before may still end it earlier or carry it on.
4. **Transaction time.** ``expired_at`` is set when the memory learns that a fact is superseded, kept while that
   stays so, and cleared if the supersession is undone (its cause removed). A fact superseded again differently
   keeps the supersession it replaces as a revision (:mod:`tkg.revisions`), so views of past transaction times
   see each end the memory believed; removing the later cause brings the earlier supersession back as recorded.

Candidates for the LLM (:func:`may_concern`) are never the whole group: facts sharing the entity pair, or an
endpoint and the relation, or an endpoint and a similar sentence (chosen by the caller), whose own intervals
overlap the new fact's -- superseded facts included, so that a late-arriving fact meets the facts it falls inside.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from datetime import UTC, datetime
from typing import Any

from tkg.memo import Memo
from tkg.models import Fact, Verdict, evolve
from tkg.revisions import ENDED_BY_HAND, RESTATED_BY, Revision, revisions_of, with_revisions
from tkg.revisions import restated as said_again
from tkg.timeutil import iso_offset

#: The end given to a restatement whose start is unknown (an empty interval before every real date).
_NEVER = datetime(1, 1, 2, tzinfo=UTC)
_BEFORE_ALL = datetime.min.replace(tzinfo=UTC)


def is_live(fact: Fact) -> bool:
    """Not superseded: the memory still believes the fact as recorded."""
    return fact.expired_at is None


def own_end(fact: Fact) -> datetime | None:
    """The end the fact was given when it was stated (``None``: open), whatever superseded it since."""
    return fact.prior_invalid_at if fact.invalidated_by is not None else fact.invalid_at


def end_by_hand(fact: Fact, at: datetime, now: datetime, note: Mapping[str, Any] | None = None) -> Fact:
    """``fact`` with its own end set to ``at`` by hand at ``now``, the end it had before (and the caller's
    ``note``, if any) kept in :data:`ENDED_BY_HAND`. Its history must then be settled again (:func:`history`)."""
    previous = own_end(fact)
    entry: dict[str, Any] = {"at": at.isoformat(), "recorded_at": now.isoformat(), "previous_end": iso_offset(previous)}
    if note:
        entry["note"] = dict(note)
    attributes = {**fact.attributes, ENDED_BY_HAND: [*fact.attributes.get(ENDED_BY_HAND, ()), entry]}
    if fact.invalidated_by is not None:
        return evolve(fact, prior_invalid_at=at, attributes=attributes)
    return evolve(fact, invalid_at=at, attributes=attributes)


def as_stated(fact: Fact) -> Fact:
    """The fact as it was stated: its own interval, not superseded."""
    if fact.invalidated_by is None and fact.expired_at is None:
        return fact
    return evolve(fact, invalid_at=own_end(fact), expired_at=None, invalidated_by=None, prior_invalid_at=None)


def same_pair(a: Fact, b: Fact) -> bool:
    return {a.source_id, a.target_id} == {b.source_id, b.target_id}


def text_key(sentence: str) -> str:
    """A sentence compared for verbatim repeats: case and spacing folded, final punctuation dropped. (Memoised:
    every new fact compares its sentence with those of its entities' facts, over and over.)"""
    return _TEXT_KEYS.table.get(sentence) or _TEXT_KEYS(sentence)  # a hit without a call


def _fold_sentence(sentence: str) -> str:
    return " ".join(sentence.casefold().split()).rstrip(_FINAL)


_FINAL = ".!?… "  # the final punctuation a verbatim repeat may differ by, with the spaces before it


_TEXT_KEYS = Memo(_fold_sentence, 1 << 16)


def overlaps(a: Fact, b: Fact) -> bool:
    """Do the two facts' intervals ``[valid_at, invalid_at)`` share an instant? Missing bounds are open; two facts
    starting at the same instant overlap even if one of them is empty."""
    return _overlap(a.valid_at, a.invalid_at, b.valid_at, b.invalid_at)


def overlaps_as_stated(a: Fact, b: Fact) -> bool:
    """Do the two facts' own intervals (as stated, whatever superseded them) share an instant?"""
    return _overlap(a.valid_at, own_end(a), b.valid_at, own_end(b))


def _overlap(a0: datetime | None, a1: datetime | None, b0: datetime | None, b1: datetime | None) -> bool:
    if a0 is not None and b0 is not None and a0 == b0:
        return True
    if a1 is not None and b0 is not None and a1 <= b0:
        return False
    return not (b1 is not None and a0 is not None and b1 <= a0)


def may_concern(new: Fact, old: Fact, *, similar: bool = False) -> bool:
    """May ``old`` repeat or contradict ``new``? Same group and a shared endpoint, with the same pair, or the same
    relation, or (``similar``: the caller found their sentences close) any relation; and own intervals that
    overlap. Whether ``old`` is superseded does not matter."""
    if old.id == new.id or old.group_id != new.group_id:
        return False
    shares = bool({new.source_id, new.target_id} & {old.source_id, old.target_id})
    related = same_pair(new, old) or (shares and (new.relation == old.relation or similar))
    return related and overlaps_as_stated(new, old)


def statement_key(fact: Fact) -> tuple[str, ...]:
    """What makes two facts verbatim the same statement: their ends, relation and sentence."""
    return (fact.source_id, fact.target_id, fact.relation, text_key(fact.fact))


def same_statement(a: Fact, b: Fact, single_valued: Callable[[str], bool]) -> bool:
    """The deterministic half of "same statement": verbatim, or one single-valued slot with the same object."""
    if (a.source_id, a.target_id, a.relation) != (b.source_id, b.target_id, b.relation):
        return False
    return single_valued(a.relation) or text_key(a.fact) == text_key(b.fact)


def single_valued_conflict(a: Fact, b: Fact, single_valued: Callable[[str], bool]) -> bool:
    """For a single-valued relation (one object per subject at a time): same subject and relation, other object."""
    return (
        a.source_id == b.source_id
        and a.relation == b.relation
        and a.target_id != b.target_id
        and single_valued(a.relation)
    )


def verdict_between(a: Fact, b: Fact) -> Verdict | None:
    """The LLM's verdict on the pair, whichever of the two holds it (a ``same`` verdict only counts for the same
    two entities)."""
    found = a.verdicts.get(b.id) or b.verdicts.get(a.id)
    if found is None:
        return None
    if found == Verdict.SAME and not same_pair(a, b):
        return Verdict.COMPATIBLE
    return found if isinstance(found, Verdict) else Verdict(found)  # records hold members; a plain dict may not


class _Classes:
    """Union-find over fact ids: the statements of a set of facts."""

    def __init__(self, ids: Iterable[str]) -> None:
        self.parent = {i: i for i in ids}

    def find(self, i: str) -> str:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def statement_episodes(facts: Sequence[Fact], statement: Mapping[str, str]) -> dict[str, set[str]]:
    """The episodes that said each statement (``statement``: fact id -> its statement's root)."""
    said: dict[str, set[str]] = {}
    for fact in facts:
        said.setdefault(statement[fact.id], set()).update(fact.episodes)
    return said


class Conflicts:
    """Which statements (roots of :class:`_Classes`) contradict one another: the pairs an LLM judged (both orders),
    and those of a single-valued relation of the ontology, which are not listed but read from each statement's
    (subject, relation) -> objects: two statements conflict when they give one subject and relation two objects. A
    value changed N times would be N^2 / 2 pairs, made for every new fact of that subject."""

    __slots__ = ("_judged", "_slots")

    def __init__(self, judged: set[tuple[str, str]], slots: dict[str, dict[tuple[str, str], set[str]]]) -> None:
        self._judged = judged
        self._slots = slots  # statement root -> (subject, single-valued relation) -> the objects its facts give

    def __contains__(self, pair: tuple[str, str]) -> bool:
        first, second = pair
        if first == second:  # a fact never contradicts its own statement, whatever an LLM said
            return False
        if pair in self._judged:
            return True
        mine, theirs = self._slots.get(first), self._slots.get(second)
        if not mine or not theirs:
            return False
        if len(theirs) < len(mine):
            mine, theirs = theirs, mine
        for key, objects in mine.items():
            others = theirs.get(key)
            if others is not None and len(objects | others) > 1:  # an object of one differs from one of the other
                return True
        return False


def statements(facts: Sequence[Fact], single_valued: Callable[[str], bool]) -> tuple[_Classes, Conflicts]:
    """The statement of each fact (classes) and which statements contradict one another.

    An LLM's verdict between two statements that one episode says both of does not count while it does: one message
    said both, so they are two statements and both hold (the verdict counts again once no episode says both, as
    after a removal). Whether two verbatim statements are said together is decided before any "same" verdict joins
    them, so the answer does not depend on the order verdicts are read in. A single-valued relation of the ontology
    decides on its own."""
    classes = _Classes(f.id for f in facts)
    by_statement: dict[tuple[str, ...], list[str]] = {}
    for fact in facts:  # the deterministic half of same_statement(), grouped instead of compared pairwise
        key = (fact.source_id, fact.relation, fact.target_id)
        by_statement.setdefault(key if single_valued(fact.relation) else statement_key(fact), []).append(fact.id)
    for ids in by_statement.values():
        for member in ids[1:]:
            classes.union(ids[0], member)
    verbatim = {f.id: classes.find(f.id) for f in facts}
    said_in = statement_episodes(facts, verbatim)
    judged: list[tuple[str, str]] = []
    known = {f.id: f for f in facts}
    for fact in facts:
        for other_id in fact.verdicts:
            other = known.get(other_id)
            if other is None:
                continue
            found = verdict_between(fact, other)
            if found == Verdict.SAME and said_in[verbatim[fact.id]].isdisjoint(said_in[verbatim[other_id]]):
                classes.union(fact.id, other_id)
            elif found == Verdict.CONTRADICTS:
                judged.append((fact.id, other_id))
    said_in = statement_episodes(facts, {f.id: classes.find(f.id) for f in facts})
    pairs: set[tuple[str, str]] = set()
    for a, b in judged:
        ra, rb = classes.find(a), classes.find(b)
        if ra != rb and said_in[ra].isdisjoint(said_in[rb]):
            pairs.update(((ra, rb), (rb, ra)))
    slots: dict[str, dict[tuple[str, str], set[str]]] = {}
    for fact in facts:
        if single_valued(fact.relation):
            mine = slots.setdefault(classes.find(fact.id), {})
            mine.setdefault((fact.source_id, fact.relation), set()).add(fact.target_id)
    return classes, Conflicts(pairs, slots)


def history(
    facts: Sequence[Fact],
    stated: Mapping[str, datetime],
    single_valued: Callable[[str], bool],
    now: datetime,
    undone: Set[datetime] = frozenset(),
    said_last: Mapping[str, tuple[datetime, datetime]] | None = None,
) -> dict[str, Fact]:
    """The valid-time history of ``facts`` by the rules above: every fact, superseded or not, as it must now be
    stored (a fact whose history does not change is returned as given, the same object). ``stated`` maps each
    fact id to the time it was stated (the reference time of its earliest episode); ``now`` is the transaction time
    of any change; ``undone`` the transaction times of the facts a removal takes away (a change learnt then is
    undone with them). ``facts`` must hold every fact linked to another by a statement or a contradiction (a
    component); facts outside it are not consulted. ``said_last``: when each fact was last said, as (the latest
    reference time of its episodes, when the memory learnt that word) -- a fact said again later is the newer
    word; by default its statement time and when it was last learnt."""
    # The sweep reads a fact's own interval, statement and verdicts, none of which a supersession changes: it runs
    # over the facts as given and notes only who ends whom, when; each fact is rebuilt at most once, at the end.
    classes, conflicts = statements(facts, single_valued)
    ends = {f.id: own_end(f) for f in facts}
    last = {f.id: said_last[f.id] if said_last and f.id in said_last else _said_last(f, stated) for f in facts}
    order = sorted(facts, key=lambda f: _sweep_key(f, last))
    superseded: dict[str, tuple[datetime, str]] = {}  # fact id -> (the end it is given, the fact that ends it)
    until = dict(ends)  # the end each fact holds to, as the sweep has decided so far
    holding: list[Fact] = []
    for fact in order:
        start = fact.valid_at
        holding = [h for h in holding if _holds_at(h, until[h.id], start)]
        statement = classes.find(fact.id)
        restated = next((h for h in holding if classes.find(h.id) == statement), None)
        if restated is not None and not _carries_on(fact, ends, restated, until[restated.id], last):
            superseded[fact.id] = (start if start is not None else _NEVER, restated.id)
            continue
        ended = start if start is not None else last[fact.id][0]  # no start: from when it was (last) said
        kept = []
        for h in holding:
            if h is restated:  # carried on from this fact's start (with no start either: it covers it whole)
                superseded[h.id] = (_NEVER if start is None else start, fact.id)
            elif (classes.find(h.id), statement) in conflicts and _ends_at_or_after(until[h.id], ended):
                superseded[h.id] = (ended, fact.id)
                if start is None:  # ended when this one was stated: until then a later fact may still end it
                    until[h.id] = ended  # earlier, or restate it
                    kept.append(h)
            else:
                kept.append(h)
        holding = [*kept, fact]
    present = {f.id for f in facts}
    return {f.id: _settled(f, ends[f.id], superseded.get(f.id), now, present, undone) for f in order}


def may_end_last(new: Fact, single_valued: Callable[[str], bool]) -> bool:
    """What :func:`ended_by_last` asks of ``new`` alone: a start, a relation that is not single-valued, no end
    given by a supersession, and only "contradicts" verdicts."""
    return (
        new.valid_at is not None
        and not single_valued(new.relation)
        and new.invalidated_by is None
        and all(v is Verdict.CONTRADICTS or v is Verdict.COMPATIBLE for v in new.verdicts.values())
    )


def ended_by_last(
    new: Fact,
    contradicted: Sequence[Fact],
    enders: Mapping[str, Fact],
    said_last: Mapping[str, tuple[datetime, datetime]],
    single_valued: Callable[[str], bool],
    now: datetime,
) -> dict[str, Fact] | None:
    """What :func:`history` changes when ``new`` comes last: the facts it ends, settled. None when that is not
    plainly so (the caller then settles the whole component).

    ``contradicted``: every fact of each statement ``new`` holds a "contradicts" verdict on, whole (restatements
    and facts joined by "same" verdicts), as stored; ``enders``: the fact that ended each of them that is ended
    (``invalidated_by``), as stored; ``said_last``: when each of all these facts was last said.

    The history of the component (every fact linked to ``new``) was settled before ``new`` came, and the sweep of
    :func:`history` reaches ``new`` last when it comes after every contradicted fact and after what ended each: it
    finds the stored facts as they are, nothing after ``new`` acts on what it changes, and ``new`` ends the
    contradicted facts that hold at its start (no other fact conflicts with a statement of its own). Applies when
    ``new`` has a start, a relation that is not single-valued, only "contradicts" verdicts, and a statement of its
    own; each fact that ended a contradicted one has a start (one without keeps the fact it ended holding for a
    while, in the sweep); each revision of these facts was caused by one of them."""
    if not may_end_last(new, single_valued):
        return None
    if any(single_valued(f.relation) for f in contradicted):
        return None  # its restatements in other words are one statement: not found by sentence
    facts = [new, *contradicted]
    classes, conflicts = statements(facts, single_valued)
    mine = classes.find(new.id)
    if any(classes.find(f.id) == mine for f in contradicted):
        return None
    last = _sweep_key(new, said_last)
    for fact in [*contradicted, *enders.values()]:
        if _sweep_key(fact, said_last) >= last:
            return None
    for fact in contradicted:
        ender = None if fact.invalidated_by is None else enders.get(fact.invalidated_by)
        if (fact.expired_at is None) != (fact.invalidated_by is None) or (ender is not None and ender.valid_at is None):
            return None
        if fact.invalidated_by is not None and ender is None:
            return None
    start = new.valid_at
    assert start is not None  # may_end_last
    # The facts known to be linked: a revision by another fact may name one no longer linked (what linked them was
    # removed), which the whole history would drop, whether or not ``new`` ends the fact that holds it.
    present = {f.id for f in facts} | enders.keys()
    if not all(_revised_within(f, present) for f in [*contradicted, *enders.values()]):
        return None
    changed: dict[str, Fact] = {}
    for fact in contradicted:
        end = own_end(fact)
        if fact.invalidated_by is not None or (classes.find(fact.id), mine) not in conflicts:
            continue
        if _holds_at(fact, end, start) and _ends_at_or_after(end, start):
            changed[fact.id] = _settled(fact, end, (start, new.id), now, present, frozenset())
    return changed


def ended_in_slot(
    new: Fact, slot: Sequence[Fact], judging: Sequence[Fact], single_valued: Callable[[str], bool], now: datetime
) -> dict[str, Fact] | None:
    """What :func:`history` changes when ``new``, of a single-valued relation, starts after every fact of its slot
    (its subject and relation) and nothing links the slot to other facts: the value holding at its start, if it is
    another, ends there; if it is the same value, holding on without an end of its own, ``new`` restates it (kept
    empty, superseded by it). None when that is not plainly so (the caller then settles the whole component).

    ``slot``: every stored fact of ``new``'s subject and relation (:func:`component` walks them all); ``judging``:
    the facts whose verdicts name one of them. A value changed or said again N times thus costs a read of the
    slot, not a sweep of it. Applies when ``new`` has a start and no verdict but "compatible", and every fact of
    the slot starts before it, holds no verdict but "compatible" and none names it, and was ended (if it was) by a
    fact of the slot."""
    if not single_valued(new.relation) or any((f.source_id, f.relation) != (new.source_id, new.relation) for f in slot):
        return None
    return _settled_last(new, slot, judging, lambda f: f.target_id == new.target_id, now)


def restated_last(
    new: Fact, statement: Sequence[Fact], judging: Sequence[Fact], single_valued: Callable[[str], bool], now: datetime
) -> dict[str, Fact] | None:
    """What :func:`history` changes when ``new``, of a relation that is not single-valued, restates verbatim a
    statement after every fact of it and nothing links the statement to other facts: when a fact of the statement
    holds at its start, without an end of its own, ``new`` is kept superseded by it (empty: the statement holds
    on, once); when none does, ``new`` holds; nothing else changes. None when that is not plainly so (the caller
    then settles the whole component).

    ``statement``: every stored fact of ``new``'s statement (its ends, relation and sentence); ``judging``: the facts
    whose verdicts name one of them. Something said again and again, day after day, thus costs a read of the
    statement, not a sweep of every time it was said. Applies when ``new`` has a start and no verdict but
    "compatible", and every fact of the statement starts before it, holds no verdict but "compatible" and none
    names it, and was ended (if it was) by a fact of the statement."""
    key = statement_key(new)
    if single_valued(new.relation) or not statement or any(statement_key(f) != key for f in statement):
        return None
    return _settled_last(new, statement, judging, lambda f: True, now)


def _settled_last(
    new: Fact, facts: Sequence[Fact], judging: Sequence[Fact], restates: Callable[[Fact], bool], now: datetime
) -> dict[str, Fact] | None:
    """:func:`ended_in_slot` and :func:`restated_last`, once their ``facts`` are known to be the whole component
    of ``new`` but for what links them to other facts (``restates``: which of them are of ``new``'s statement).
    The sweep of :func:`history` then reaches ``new`` last, the others as stored; at its start at most one
    statement holds (a later one ends an earlier one it contradicts), and ``new`` restates it or ends it."""
    start = new.valid_at
    if start is None or not may_settle_alone(new):
        return None
    ids = {f.id for f in facts}
    present = {*ids, new.id}
    for fact in facts:
        if fact.valid_at is None or fact.valid_at >= start or not _settled_within(fact, ids, present):
            return None
    if any(_names(f, ids) for f in judging):
        return None
    # a fact ended by another ends before that one starts, so before ``new``: only the unended may hold at its start
    holding = [f for f in facts if f.invalidated_by is None and _holds_at(f, own_end(f), start)]
    mine = [f for f in holding if restates(f)]
    if mine:
        if len(holding) != 1 or own_end(mine[0]) is not None:
            return None  # several, or one with an end of its own: which is the newer word needs when each was said
        return {new.id: _settled(new, own_end(new), (start, mine[0].id), now, present, frozenset())}
    return {f.id: _settled(f, own_end(f), (start, new.id), now, present, frozenset()) for f in holding}


def may_settle_alone(new: Fact) -> bool:
    """What :func:`ended_in_slot` and :func:`restated_last` ask of ``new`` alone: a start, no end given by a
    supersession, and no verdict but "compatible"."""
    return new.valid_at is not None and new.invalidated_by is None and not _judged(new)


def _judged(fact: Fact) -> bool:
    """Does ``fact`` hold a verdict that links it to another (anything but "compatible")?"""
    return any(v != Verdict.COMPATIBLE for v in fact.verdicts.values())


def _names(fact: Fact, ids: Set[str]) -> bool:
    """Does ``fact`` hold a verdict other than "compatible" on one of ``ids``?"""
    return any(v != Verdict.COMPATIBLE and i in ids for i, v in fact.verdicts.items())


def _settled_within(fact: Fact, ids: Set[str], present: Set[str]) -> bool:
    """Is ``fact`` linked by no verdict, superseded (if it is) by one of ``ids``, with its record consistent, and
    are the causes of its revisions all ``present``? (Then :func:`history` over ``ids`` alone settled it.)"""
    # (called on every fact of a slot or statement at each new one: the common case, no verdict, no revision and
    # not superseded, is answered without a call)
    if (fact.verdicts and _judged(fact)) or (fact.expired_at is None) != (fact.invalidated_by is None):
        return False
    if fact.invalidated_by is not None and fact.invalidated_by not in ids:
        return False
    return _revised_within(fact, present)


def _revised_within(fact: Fact, present: Set[str]) -> bool:
    """Are the causes of ``fact``'s revisions all ``present``? (A revision by a fact no longer linked to it is one
    :func:`history` drops.)"""
    return not fact.attributes or all(r.invalidated_by in present for r in revisions_of(fact))


def _sweep_key(fact: Fact, said_last: Mapping[str, tuple[datetime, datetime]]) -> tuple[object, ...]:
    """World-time order: start (unknown first), when last said (the newer word second; of facts said at one time,
    as the messages of a session stamped with its date, the one the memory learnt last), sentence, relation, and
    the longer own end first (a fact that holds longer is not restated by one that ends at once); the id only
    between true twins."""
    end = own_end(fact)
    longest = (0, 0.0) if end is None else (1, -(end - _BEFORE_ALL).total_seconds())
    return (fact.valid_at or _BEFORE_ALL, said_last[fact.id], text_key(fact.fact), fact.relation, longest, fact.id)


def _said_last(fact: Fact, stated: Mapping[str, datetime]) -> tuple[datetime, datetime]:
    """A fact's last saying when only its statement time is known: then, learnt when it was last learnt."""
    again = fact.attributes.get(RESTATED_BY)
    learnt = max([fact.created_at, *(t for _, t in said_again(fact))]) if again else fact.created_at
    return stated.get(fact.id, _NEVER), learnt


def _ends_at_or_after(end: datetime | None, at: datetime) -> bool:
    return end is None or end >= at


def _carries_on(
    fact: Fact,
    ends: Mapping[str, datetime | None],
    restated: Fact,
    restated_end: datetime | None,
    said_last: Mapping[str, tuple[datetime, datetime]],
) -> bool:
    """Does ``fact``, restating ``restated`` (holding at its start until ``restated_end``), carry the statement on
    from its start, rather than being empty? When it holds on past that end; and when it ends sooner but is the
    newer word on when the statement ended: stated after ``restated``, with an end of its own ("works at Acme"
    since 2020, then "worked at Acme from 2020 to 2024"), and starting with the statement or not saying when.
    Conversely, ``restated`` with an end of its own and stated after ``fact`` is the newer word (it starts no later,
    in sweep order), and ``fact`` does not carry it on ("works at Acme since 2020", then "worked at Acme until
    May")."""
    end = ends[fact.id]
    fact_said, restated_said = said_last[fact.id], said_last[restated.id]
    if restated_end is None or (end is not None and end <= restated_end):
        # the newer word when it covers the restated fact's start: a later stint ("in Paris in 2015", said after
        # "in Paris since 2010") says nothing of when the statement ended
        covers = fact.valid_at is None or fact.valid_at == restated.valid_at
        return covers and end is not None and end != restated_end and fact_said > restated_said
    return not (ends[restated.id] is not None and restated_said > fact_said)


def _holds_at(fact: Fact, end: datetime | None, start: datetime | None) -> bool:
    """Does ``fact``, holding until ``end`` (its own end, or the one the sweep gave it), still hold at ``start``
    (``None``: since forever)? A fact that starts at the same instant counts, even an empty one (as in
    :func:`overlaps`)."""
    return end is None or start is None or end > start or fact.valid_at == start


def _settled(
    fact: Fact,
    own: datetime | None,
    superseded: tuple[datetime, str] | None,
    now: datetime,
    present: Set[str],
    undone: Set[datetime],
) -> Fact:
    """``fact`` as the sweep leaves it: holding to its ``own`` end, or ``superseded`` (the end it is given, never
    before its start, and the fact that ends it) with its transaction time: a supersession the store already
    records keeps its ``expired_at``; one it recorded before and replaced since comes back with its ``expired_at``
    and the revisions before it when what replaced it is undone (its cause no longer ``present``, or learnt at a
    time in ``undone``: with a fact the removal takes away); a new one is learnt ``now``. A supersession replaced
    while its cause stays (superseded again, or holding again after an end given by hand) becomes a revision
    (:mod:`tkg.revisions`); revisions by facts no longer ``present`` are dropped (as if never added). ``fact``
    itself when nothing changes."""
    stored = revisions_of(fact)
    earlier = tuple(r for r in stored if r.invalidated_by in present)
    current: Revision | None = None  # the record's supersession, while its cause is present
    if fact.expired_at is not None and fact.invalid_at is not None and fact.invalidated_by in present:
        assert fact.invalidated_by is not None
        if fact.expired_at not in undone:
            current = Revision(fact.invalid_at, fact.invalidated_by, fact.expired_at, max(now, fact.expired_at))
    # When the record's state began, if it is undone: its supersession by a removed fact or learnt with one (it may
    # have replaced any revision), or its holding again learnt with one (it replaced the last).
    undone_since: datetime | None = None
    if fact.expired_at is not None:
        undone_since = fact.expired_at if current is None else None
    elif earlier and earlier[-1].until in undone:
        undone_since = earlier[-1].until
    state: tuple[datetime | None, str | None, datetime | None, datetime | None]
    if superseded is None:
        if fact.invalidated_by is None and fact.expired_at is None and earlier == stored:
            return fact  # holding as stored
        state = (own, None, None, None)
    else:
        end, by = superseded
        if fact.valid_at is not None and end < fact.valid_at:
            end = fact.valid_at
        # an earlier supersession comes back as recorded only when what replaced it is undone (the latest, when the
        # same end was believed more than once)
        matching = [i for i, r in enumerate(earlier) if (r.invalid_at, r.invalidated_by) == (end, by)]
        back = matching[-1] if matching else None
        if fact.invalidated_by == by and fact.invalid_at == end and fact.expired_at is not None:
            learnt, current = fact.expired_at, None  # known already
        elif (
            back is not None and undone_since is not None and (fact.expired_at is not None or back == len(earlier) - 1)
        ):
            learnt, earlier, undone_since = earlier[back].expired_at, earlier[:back], None
        else:
            learnt = max(now, fact.created_at, fact.expired_at or now)
        state = (end, by, own, learnt)
    changed = state != (fact.invalid_at, fact.invalidated_by, fact.prior_invalid_at, fact.expired_at)
    if not changed and earlier == stored:
        return fact
    if changed and current is not None and current.until > current.expired_at:  # (believed for no time: not kept)
        earlier = (*earlier, current)
    if changed and undone_since is not None and earlier and earlier[-1].until == undone_since:
        # as if the undone state had never been: what the memory believed before it, it believed until now
        earlier = (*earlier[:-1], dataclasses.replace(earlier[-1], until=max(now, undone_since)))
    invalid_at, invalidated_by, prior_invalid_at, expired_at = state
    return evolve(
        fact,
        invalid_at=invalid_at,
        invalidated_by=invalidated_by,
        prior_invalid_at=prior_invalid_at,
        expired_at=expired_at,
        attributes=with_revisions(fact.attributes, earlier),
    )


def component(seeds: Iterable[str], facts: Sequence[Fact], single_valued: Callable[[str], bool]) -> list[Fact]:
    """The facts of ``facts`` linked to the ``seeds`` through statements or contradictions (transitively): the
    same slot (a single-valued relation's subject, or a verbatim statement), or an LLM verdict other than
    "compatible", either way round. One cheap pass buckets the facts by subject and relation and collects the
    verdicts; sentences are compared only inside the buckets the walk reaches, so an entity with thousands of
    facts costs little when few of them are linked to a new one."""
    by_id = {f.id: f for f in facts}
    # Few containers, on purpose: one list per subject and relation (a container per fact would make the
    # garbage collector, not this loop, the cost at a few thousand facts).
    buckets: dict[tuple[str, str], list[Fact]] = {}
    judged: dict[str, list[str]] = {}  # fact id -> ids of the facts it has a verdict with, either way round
    for fact in facts:
        buckets.setdefault((fact.source_id, fact.relation), []).append(fact)
        if not fact.verdicts:
            continue
        for other, verdict in fact.verdicts.items():
            if verdict is not Verdict.COMPATIBLE and other in by_id:  # members of the enum (Fact checks)
                judged.setdefault(fact.id, []).append(other)
                judged.setdefault(other, []).append(fact.id)
    walked: set[tuple[str, ...]] = set()  # slots whose facts are queued
    seen: set[str] = set()
    queue = [s for s in seeds if s in by_id]
    while queue:
        current = queue.pop()
        if current in seen:
            continue
        seen.add(current)
        fact = by_id[current]
        bucket = (fact.source_id, fact.relation)
        if single_valued(fact.relation):  # one slot: every object contradicts every other
            if bucket not in walked:
                walked.add(bucket)
                queue.extend(f.id for f in buckets[bucket])
        else:  # the same statement: same ends, relation and sentence
            target, key = fact.target_id, text_key(fact.fact)
            if (*bucket, target, key) not in walked:  # a statement's facts are found once, with its first
                walked.add((*bucket, target, key))
                queue.extend(f.id for f in buckets[bucket] if f.target_id == target and text_key(f.fact) == key)
        queue.extend(judged.get(current, ()))
    return [f for f in facts if f.id in seen]
