"""Time as a query dimension, checked against a brute-force filter over every fact (property tests), plus the
filters of a scope (labels, relations, date ranges) and the episode timeline, on every backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import T0
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkg import FactInput, FixedClock, HashEmbedder, Memory
from tkg.backends.memory import InMemoryStore
from tkg.errors import TimestampError, ValidationError
from tkg.models import Entity, Episode, Fact, Kind
from tkg.search_config import BfsOrigin, EpisodeContext, Method, Reranker, SearchConfig, TargetConfig
from tkg.storage import WriteBatch
from tkg.timeline import DateRange, Filters, make_scope

EMB = HashEmbedder(dim=32)
DAY = timedelta(days=1)
NOW = T0 + 30 * DAY


def day(n: int | None) -> datetime | None:
    return None if n is None else T0 + n * DAY


@st.composite
def fact_times(draw: st.DrawFn) -> dict[str, datetime | None]:
    # Days from a small range, so that query times often fall exactly on a stored timestamp (the boundaries).
    created = draw(st.integers(0, 20))
    valid = draw(st.none() | st.integers(-10, 25))
    invalid = draw(st.none() | st.integers(valid if valid is not None else -10, 30))
    expired = draw(st.none() | st.integers(created, 30))
    # A superseded fact (expired) keeps the end it had before: open, or its own end date (a supersession only
    # shortens a fact, so that end is not before the current one).
    low = invalid if invalid is not None else (valid if valid is not None else -10)
    prior = None if expired is None else draw(st.none() | st.integers(low, 32))
    # A fact superseded again (tkg.revisions): earlier supersessions, each learnt before the next, the last one
    # replaced when the record's own was learnt.
    # A fact holding again (an end given by hand before the fact that superseded it started) keeps the
    # supersessions it had, each believed until it was replaced.
    revisions: list[dict[str, str]] = []
    if (expired is not None and invalid is not None and expired > created) or (expired is None and created < 30):
        last = expired if expired is not None else 30
        learnt = sorted(draw(st.sets(st.integers(created, last - 1), max_size=2)))
        untils = [*learnt[1:], expired if expired is not None else draw(st.integers(last, 32))] if learnt else []
        for at, until in zip(learnt, untils, strict=True):
            end = day(draw(st.integers(low, 32)))
            revisions.append(
                {
                    "invalid_at": end.isoformat(),
                    "invalidated_by": "f0",
                    "expired_at": day(at).isoformat(),
                    "until": day(until).isoformat(),
                }
            )
    # Ends given by hand (tkg.ended_by_hand), each with the own end it replaced, recorded in turn.
    hand: list[dict[str, str | None]] = []
    for recorded in sorted(draw(st.sets(st.integers(created, 32), max_size=2))):
        before = draw(st.none() | st.integers(low, 32))
        hand.append({"at": day(low).isoformat(), "recorded_at": day(recorded).isoformat(),  # type: ignore[union-attr]
                     "previous_end": None if before is None else day(before).isoformat()})  # type: ignore[union-attr]  # fmt: skip
    attributes: dict[str, object] = {}
    if revisions:
        attributes["tkg.revisions"] = revisions
    if hand:
        attributes["tkg.ended_by_hand"] = hand
    return {
        "created_at": day(created),
        "valid_at": day(valid),
        "invalid_at": day(invalid),
        "expired_at": day(expired),
        "prior_invalid_at": day(prior),
        "attributes": attributes,
    }


def _believed_end(f: Fact, tx: datetime) -> datetime | None:
    # a supersession learnt after tx is not yet known at tx: the fact ends where it ended before it, the last
    # earlier supersession learnt by tx, or its own end
    # and an end given by hand after tx is not given yet: the fact's own end is the one that end replaced
    def own(now: datetime | None) -> datetime | None:
        later = [e for e in f.attributes.get("tkg.ended_by_hand", []) if datetime.fromisoformat(e["recorded_at"]) > tx]
        if not later:
            return now
        return None if later[0]["previous_end"] is None else datetime.fromisoformat(later[0]["previous_end"])

    if f.expired_at is not None and f.expired_at <= tx:
        return f.invalid_at
    for r in f.attributes.get("tkg.revisions", []):  # the supersession believed at tx, if any
        if datetime.fromisoformat(r["expired_at"]) <= tx < datetime.fromisoformat(r["until"]):
            return datetime.fromisoformat(r["invalid_at"])
    return own(f.invalid_at if f.expired_at is None else f.prior_invalid_at)


def _open_at(end: datetime | None, at: datetime) -> bool:
    return end is None or at < end


def brute_force(facts: list[Fact], as_of: datetime | None, known_at: datetime | None, history: bool) -> set[str]:
    """The two timelines, written out again from their definitions (not through tkg.timeline)."""
    tx = known_at or NOW
    out = set()
    for f in facts:
        if f.created_at > tx:
            continue  # not yet recorded at transaction time tx
        at = as_of if as_of is not None else (None if history else tx)
        if at is not None:
            if f.valid_at is not None and f.valid_at > at:
                continue
            if not _open_at(_believed_end(f, tx), at):
                continue
        out.add(f.id)
    return out


def _entities() -> list[Entity]:
    return [
        Entity(id=f"e{i}", group_id="g", name=f"Thing{i}", created_at=T0 - DAY, name_embedding=EMB.embed([f"t{i}"])[0])
        for i in (1, 2)
    ]


def _facts(times: list[dict[str, datetime | None]]) -> list[Fact]:
    return [
        Fact(
            id=f"f{i}",
            group_id="g",
            source_id="e1",
            target_id="e2",
            relation="RELATES_TO",
            fact=f"common fact number {i}",
            embedding=EMB.embed([f"common fact number {i}"])[0],
            **t,  # type: ignore[arg-type]
        )
        for i, t in enumerate(times)
    ]


QUERY_TIMES = st.lists(
    st.tuples(st.none() | st.integers(-12, 32), st.none() | st.integers(-1, 32), st.booleans()), min_size=1, max_size=6
)


INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(INT64 | st.sampled_from([-(2**63), 2**63 - 1, 0, -1, 1])), now=INT64)
def test_the_timestamps_around_a_time_are_found_by_unsigned_arithmetic(values, now):
    """The in-memory store's cached "now" masks hold until "now" crosses a stored timestamp: the nearest ones on
    either side are found with wrapping unsigned arithmetic, which must agree with plain comparisons everywhere,
    the sentinels of absent times (the int64 extremes) and times before 1970 included."""
    import numpy as np

    from tkg.backends.memory.arrays import around

    low, high = -(2**63), 2**63 - 1
    expected = max((v for v in values if v <= now), default=low), min((v for v in values if v > now), default=high)
    assert around(np.array(values, dtype=np.int64), now) == expected


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(times=st.lists(fact_times(), min_size=1, max_size=20), queries=QUERY_TIMES, nows=st.lists(st.integers(0, 32)))
def test_store_search_agrees_with_brute_force_on_both_timelines(make_store, times, queries, nows):
    store = make_store(32)
    store.write(WriteBatch(puts=[*_entities(), *_facts(times)]))
    facts = _facts(times)
    vector = EMB.embed(["common fact"])[0]
    # several queries on one store: the cached scope masks must never serve a stale view
    for as_of, known_at, history in queries:
        scope = make_scope(NOW, ["g"], as_of=day(as_of), known_at=day(known_at), include_invalidated=history)
        expected = brute_force(facts, day(as_of), day(known_at), history)
        assert {h.id for h in store.text_search(Kind.FACT, "common fact", 100, scope)} == expected
        assert {h.id for h in store.vector_search(Kind.FACT, vector, 100, scope)} == expected
        assert {f.id for f in store.facts_of(["e1"], scope)} == expected
    # the default "now" scope moves with the clock: across stored timestamps its mask must follow
    for n in nows:
        now = T0 + n * DAY
        expected = {
            f.id
            for f in facts
            if f.created_at <= now
            and (f.valid_at is None or f.valid_at <= now)
            and _open_at(_believed_end(f, now), now)
        }
        assert {h.id for h in store.text_search(Kind.FACT, "common", 100, make_scope(now, ["g"]))} == expected
        # as of past and future times, as known at that "now" (supersessions learnt later not yet known)
        for as_of in (-3, n - 5, n, 31):
            expected = brute_force(facts, day(as_of), now, False)
            scope = make_scope(now, ["g"], as_of=day(as_of))
            assert {h.id for h in store.vector_search(Kind.FACT, vector, 100, scope)} == expected


def _believed_expiry(f: Fact, tx: datetime) -> datetime | None:
    # when the supersession the memory knew at tx was learnt: the record's own once learnt, else the earlier one
    # believed then, else none
    if f.expired_at is not None and f.expired_at <= tx:
        return f.expired_at
    for r in f.attributes.get("tkg.revisions", []):
        if datetime.fromisoformat(r["expired_at"]) <= tx < datetime.fromisoformat(r["until"]):
            return datetime.fromisoformat(r["expired_at"])
    return None


def _in_range(value: datetime | None, start: int | None, end: int | None, missing: bool) -> bool:
    if value is None:
        return missing
    return (start is None or day(start) <= value) and (end is None or value < day(end))  # type: ignore[operator]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    times=st.lists(fact_times(), min_size=1, max_size=15),
    queries=QUERY_TIMES,
    field=st.sampled_from(["invalid_at", "expired_at"]),
    start=st.none() | st.integers(-5, 33),
    length=st.none() | st.integers(0, 20),
    missing=st.booleans(),
    nows=st.lists(st.tuples(st.integers(0, 32), st.booleans()), max_size=8),
)
def test_date_filters_judge_a_fact_as_the_view_knows_it(
    make_store, times, queries, field, start, length, missing, nows
):
    """A date range on invalid_at or expired_at reads a fact's end and expiry as known at known_at (the end
    believed then, the supersession learnt by then), as the view shows the fact: a filter judged today's record,
    so a view of the past found a supersession it did not know yet."""
    store = make_store(32)
    facts = _facts(times)
    store.write(WriteBatch(puts=[*_entities(), *facts]))
    end = None if length is None else (start if start is not None else -5) + length
    filters = Filters(dates=(DateRange(field, start=day(start), end=day(end), include_missing=missing),))
    vector = EMB.embed(["common fact"])[0]
    for as_of, known_at, history in queries:
        scope = make_scope(
            NOW, ["g"], as_of=day(as_of), known_at=day(known_at), include_invalidated=history, filters=filters
        )
        tx = day(known_at) or NOW
        known = _believed_end if field == "invalid_at" else _believed_expiry
        expected = {
            f.id
            for f in facts
            if f.id in brute_force(facts, day(as_of), day(known_at), history)
            and _in_range(known(f, tx), start, end, missing)
        }
        assert {h.id for h in store.vector_search(Kind.FACT, vector, 100, scope)} == expected
        assert {h.id for h in store.text_search(Kind.FACT, "common fact", 100, scope)} == expected
        assert {f.id for f in store.facts_of(["e1"], scope)} == expected
    # a view of "now" moves with the clock: its cached mask must follow the ends and expiry it filters by
    for n, history in nows:
        now = T0 + n * DAY
        known = _believed_end if field == "invalid_at" else _believed_expiry
        expected = {
            f.id
            for f in facts
            if f.id in brute_force(facts, None, now, history) and _in_range(known(f, now), start, end, missing)
        }
        scope = make_scope(now, ["g"], include_invalidated=history, filters=filters)
        assert {h.id for h in store.text_search(Kind.FACT, "common fact", 100, scope)} == expected, n


@settings(max_examples=15, deadline=None)
@given(times=st.lists(fact_times(), min_size=1, max_size=15), queries=QUERY_TIMES)
def test_memory_search_agrees_with_brute_force(times, queries):
    store = InMemoryStore(dim=EMB.dim)
    memory = Memory(store, embedder=EMB, clock=FixedClock(NOW))
    facts = _facts(times)
    store.write(WriteBatch(puts=[*_entities(), *facts]))
    config = SearchConfig(facts=TargetConfig(methods=(Method.BM25, Method.COSINE, Method.BFS), limit=50))
    for as_of, known_at, history in queries:
        found = memory.search(
            "common fact",
            group_ids="g",
            config=config,
            as_of=day(as_of),
            known_at=day(known_at),
            include_invalidated=history,
        )
        assert {s.record.id for s in found.facts} == brute_force(facts, day(as_of), day(known_at), history)


DAYS = st.integers(0, 32)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.data_too_large])
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 11), fact_times(), st.booleans(), st.none() | st.integers(-12, 32), st.integers(0, 32)
        ),
        min_size=1,
        max_size=30,
    )
)
def test_cached_masks_follow_writes_and_deletes(steps):
    """Searches between writes: a cached scope mask is brought up to date slot by slot (the in-memory store
    recomputes only what changed), and must always equal a brute-force filter over the current facts."""
    store = InMemoryStore(dim=32)
    store.write(WriteBatch(puts=_entities()))
    current: dict[int, Fact] = {}
    vector = EMB.embed(["common fact"])[0]
    for number, times, delete, as_of, now in steps:
        if delete and number in current:
            store.write(WriteBatch(deletes=[(Kind.FACT, current.pop(number).id)]))
        else:
            current[number] = _facts([times] * (number + 1))[number]
            store.write(WriteBatch(puts=[current[number]]))
        facts = list(current.values())
        for known in (None, day(now)):  # a moving "now" scope, and an explicit transaction time
            clock = day(now) if known is None else NOW
            scope = make_scope(clock, ["g"], as_of=day(as_of), known_at=known)
            expected = brute_force(facts, day(as_of), known or clock, False)
            assert {h.id for h in store.vector_search(Kind.FACT, vector, 100, scope)} == expected
            assert {f.id for f in store.facts_of(["e1"], scope)} == expected


# -- filters ----------------------------------------------------------------------------------------------------
def _filtered_graph() -> list[Entity | Fact | Episode]:
    people = [
        Entity(
            id=f"p{i}",
            group_id="g",
            name=f"Person{i}",
            created_at=T0 + i * DAY,
            labels=("Entity", "Person") if i % 2 else ("Entity", "Place"),
            name_embedding=EMB.embed([f"Person{i}"])[0],
        )
        for i in range(6)
    ]
    facts = [
        Fact(
            id=f"f{i}",
            group_id="g",
            source_id=f"p{i}",
            target_id=f"p{(i + 1) % 6}",
            relation=("WORKS_AT", "KNOWS", "LIVES_IN")[i % 3],
            fact=f"alpha relation {i}",
            created_at=T0 + i * DAY,
            valid_at=None if i == 0 else T0 + i * DAY,
            invalid_at=T0 + 10 * DAY if i == 4 else None,
            expired_at=T0 + 10 * DAY if i == 4 else None,
            embedding=EMB.embed([f"alpha relation {i}"])[0],
        )
        for i in range(6)
    ]
    episodes = [
        Episode(
            id=f"ep{i}",
            group_id="g",
            content=f"alpha episode {i}",
            source="text",
            reference_time=T0 + i * DAY,
            created_at=T0 + 20 * DAY,
            embedding=EMB.embed([f"alpha episode {i}"])[0],
        )
        for i in range(4)
    ]
    return [*people, *facts, *episodes]


FILTERS = [
    Filters(labels=frozenset({"Person"})),
    Filters(labels=frozenset({"Nothing"})),
    Filters(relations=frozenset({"KNOWS", "LIVES_IN"})),
    Filters(relations=frozenset({"MISSING"})),
    Filters(dates=(DateRange("valid_at", start=T0 + 2 * DAY, end=T0 + 5 * DAY),)),
    Filters(dates=(DateRange("valid_at", end=T0 + 3 * DAY, include_missing=True),)),
    Filters(dates=(DateRange("invalid_at", start=T0),)),
    Filters(dates=(DateRange("expired_at", start=T0, include_missing=True),)),
    Filters(dates=(DateRange("created_at", start=T0 + 3 * DAY),)),
    Filters(dates=(DateRange("reference_time", end=T0 + 2 * DAY),)),
    Filters(labels=frozenset({"Place"}), relations=frozenset({"WORKS_AT"}), dates=(DateRange("created_at", end=NOW),)),
]


@pytest.mark.parametrize("filters", FILTERS, ids=range(len(FILTERS)))
def test_filters_agree_with_brute_force(make_store, filters):
    store = make_store(32)
    records = _filtered_graph()
    store.write(WriteBatch(puts=records))
    scope = make_scope(NOW, ["g"], include_invalidated=True, filters=filters)
    for kind, query in (
        (Kind.ENTITY, "Person0 Person1 Person2 Person3 Person4 Person5"),
        (Kind.FACT, "alpha"),
        (Kind.EPISODE, "alpha"),
    ):
        expected = {r.id for r in records if r.kind is kind and filters.admits(r)}
        assert {h.id for h in store.text_search(kind, query, 100, scope)} == expected, kind
        assert {h.id for h in store.vector_search(kind, EMB.embed([query])[0], 100, scope)} == expected, kind


def test_filter_values_are_validated():
    with pytest.raises(TimestampError):
        DateRange("valid_at", start=datetime(2024, 1, 1))  # naive
    with pytest.raises(ValidationError):
        DateRange("born_at")
    with pytest.raises(ValidationError):
        DateRange("valid_at", start=NOW, end=T0)
    with pytest.raises(ValidationError):
        Filters(labels=frozenset({""}))
    assert Filters(labels="Person").labels == frozenset({"Person"})  # type: ignore[arg-type]


def test_episode_window_follows_the_timeline(make_store):
    store = make_store(32)
    episodes = [
        Episode(
            id=f"ep{i}",
            group_id="g",
            content=f"turn {i}",
            source="message",
            reference_time=T0 + (i // 3) * DAY,
            created_at=T0,
        )
        for i in (0, 1, 2, 3, 4, 5, 6)
    ]
    store.write(WriteBatch(puts=[episodes[i] for i in (3, 0, 6, 1, 4, 2, 5)]))  # out of order: the timeline sorts
    # by reference time, then insertion order within one time (ep1 was stored before ep2, ep3 before ep4)
    assert [e.id for e in store.episode_window("ep3", 2, 1)] == ["ep1", "ep2", "ep3", "ep4"]
    assert [e.id for e in store.episode_window("ep0", 5, 0)] == ["ep0"]
    assert store.episode_window("missing", 1, 1) == []
    assert [e.id for e in store.episode_window("ep6", 0, 5)] == ["ep6"]


def test_bfs_limit_keeps_the_nearest(make_store):
    store = make_store(32)
    names = [f"n{i}" for i in range(12)]
    ents = [Entity(id=n, group_id="g", name=n, created_at=T0) for n in names]
    # a star around n0 (n1..n5), and a chain n5 - n6 - ... - n11
    edges = [("n0", f"n{i}") for i in range(1, 6)] + [(f"n{i}", f"n{i + 1}") for i in range(5, 11)]
    facts = [
        Fact(id=f"f{i}", group_id="g", source_id=a, target_id=b, relation="LINKS", fact=f"{a} {b}", created_at=T0)
        for i, (a, b) in enumerate(edges)
    ]
    store.write(WriteBatch(puts=[*ents, *facts]))
    scope = make_scope(NOW, ["g"])
    full = store.bfs(["n0"], 20, scope)
    assert full["n11"] == 7 and len(full) == 12
    for limit in (1, 3, 6, 9):
        part = store.bfs(["n0"], 20, scope, limit=limit)
        assert len(part) == limit and all(full[k] == v for k, v in part.items())
        assert max(part.values()) <= min((full[k] for k in full if k not in part), default=99)


@pytest.mark.parametrize(("learnt", "end"), [(0, 1), (1, 2), (0, 3)])
def test_a_moving_now_follows_the_ends_of_earlier_supersessions(make_store, learnt: int, end: int) -> None:
    """The cached "now" view must change when "now" crosses the end an earlier supersession gave a fact (not only
    the time it was learnt): that end decides until the record's own supersession is learnt (day 4)."""
    revision = {"invalid_at": day(end).isoformat(), "invalidated_by": "f0", "expired_at": day(learnt).isoformat(),
                "until": day(4).isoformat()}  # fmt: skip
    times = {"created_at": T0, "valid_at": None, "invalid_at": day(2), "expired_at": day(4), "prior_invalid_at": None}
    facts = _facts([{**times, "attributes": {"tkg.revisions": [revision]}}])  # type: ignore[dict-item]
    store = make_store(32)
    store.write(WriteBatch(puts=[*_entities(), *facts]))
    for n in range(6):
        now = day(n)
        assert now is not None
        expected = {f.id for f in facts if _open_at(_believed_end(f, now), now)}
        assert {h.id for h in store.text_search(Kind.FACT, "common", 100, make_scope(now, ["g"]))} == expected, n


def test_a_known_at_view_ranks_by_the_restatements_known_then() -> None:
    """config="episode_mentions" as of an earlier known_at counts the episodes that had stated each fact by then
    (it counted restatements recorded later, and ranked by today's memory)."""
    clock = FixedClock("2024-01-01T00:00:00Z")
    memory = Memory(embedder=HashEmbedder(dim=64), clock=clock)
    rome = FactInput("Ann", "LIKES", "Rome", "Ann likes Rome", valid_at="2020-01-01T00:00:00Z")
    oslo = FactInput("Ann", "LIKES", "Oslo", "Ann likes Oslo", valid_at="2020-01-01T00:00:00Z")
    memory.add_facts([rome, oslo], group_id="g")
    then = clock.now()

    def ranked(**known: Any) -> list[tuple[str, float]]:
        found = memory.search("Ann likes Oslo", config="episode_mentions", **known)
        return [(hit.record.fact, round(hit.score, 6)) for hit in found.facts]

    before = ranked()
    for _ in range(3):
        clock.advance(days=1)
        memory.add_facts([rome], group_id="g")  # restated, learnt after `then`
    assert ranked()[0] == ("Ann likes Rome", 4.0)
    assert ranked(known_at=then) == before


@pytest.mark.parametrize("later", [10, 47, 60, 300])
def test_a_known_at_view_weighs_conversation_sessions_as_the_memory_of_then(later: int) -> None:
    """The conversation reranker's sessions in a known_at view: turns recorded later (and said later) do not
    crowd its scan of the timeline. With 48 or more, the session of the last turns lost its end, and its bonus."""
    config = SearchConfig(
        episodes=TargetConfig(
            reranker=Reranker.EPISODE_CONTEXT,
            candidate_factor=5,
            context=EpisodeContext(bm25_weight=0.0, entity_weight=0.0, time_weight=0.0, neighbour_weight=0.0),
        )
    )
    clock = FixedClock("2024-01-01T12:00:00Z")
    memory = Memory(embedder=HashEmbedder(dim=64), clock=clock)
    t0 = datetime(2024, 1, 1, 10, 0, tzinfo=UTC)
    turns = [
        ("Ann: I went hiking yesterday.", 0),
        ("Bob: Where did you go?", 1),
        ("Ann: Up the mountain near the lake.", 2),
        ("Cy: Unrelated chatter about cooking pasta.", 300),
        ("Cy: I like tomato sauce a lot.", 301),
        ("Dee: The weather is cold today.", 540),
        ("Dee: I bought a new coat.", 541),
    ]
    for text, minutes in turns:
        memory.add_episode(text, group_id="g", reference_time=t0 + timedelta(minutes=minutes), extract=False)
    then = clock.now()

    def ranked(**known: Any) -> list[tuple[str, float]]:
        found = memory.search("Dee bought mountain lake", config=config, group_ids=["g"], **known)
        return [(hit.record.content, round(hit.score, 6)) for hit in found.episodes]

    before = ranked()
    clock.advance(days=1)
    for i in range(later):
        memory.add_episode(
            f"Zed: filler line {i} about nothing.", group_id="g", reference_time=t0 + timedelta(days=2, minutes=i),
            extract=False,
        )  # fmt: skip
    assert ranked(known_at=then) == before


def test_a_known_at_view_walks_from_the_recent_episodes_it_sees() -> None:
    """BFS from the recent episodes in a known_at view starts from the latest episodes the view sees: episodes
    recorded later with earlier reference times (a backfill) took every slot, and the walk found nothing."""
    walk = SearchConfig(facts=TargetConfig(methods=(Method.BFS,), bfs_origin=BfsOrigin.RECENT_EPISODES))
    clock = FixedClock("2024-03-01T00:00:00Z")
    memory = Memory(embedder=HashEmbedder(dim=64), clock=clock)
    memory.add_facts(
        [FactInput("Ann", "WORKS_AT", "Acme", "Ann works at Acme", valid_at="2020-01-01T00:00:00Z")],
        group_id="g",
        reference_time="2024-02-28T00:00:00Z",
    )
    then = clock.now()

    def walked(**known: Any) -> list[str]:
        return [hit.record.fact for hit in memory.search("zzz qqq", config=walk, group_ids=["g"], **known).facts]

    assert walked() == ["Ann works at Acme"]
    clock.advance(days=1)
    for i in range(40):  # recorded after `then`, said just before it
        memory.add_episode(
            f"Bob: old note {i}", group_id="g", reference_time=then - timedelta(hours=1 + i), extract=False
        )
    assert walked(known_at=then) == ["Ann works at Acme"]
    assert walked(as_of=then) == []  # as known now, the latest turns before `then` are the notes
