"""The backend conformance suite: what every Store must do, run against every backend (see conftest.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import zlib
from datetime import timedelta

import numpy as np
import pytest
from conftest import T0
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkg.embedders import HashEmbedder
from tkg.errors import BackendError, EmbeddingError, ValidationError
from tkg.models import Entity, Episode, Fact, Kind, Mention
from tkg.storage import Candidates, WriteBatch
from tkg.timeline import Filters, make_scope
from tkg.tokens import MAX_TOKEN_CHARS, tokenize

EMB = HashEmbedder(dim=32)
DAY = timedelta(days=1)


def entity(i: int, group: str = "g", name: str | None = None) -> Entity:
    name = name or f"Entity{i}"
    return Entity(id=f"e{i}", group_id=group, name=name, created_at=T0, name_embedding=EMB.embed([name])[0])


def fact(i: int, a: int, b: int, text: str, group: str = "g", **times: object) -> Fact:
    return Fact(
        id=f"f{i}",
        group_id=group,
        source_id=f"e{a}",
        target_id=f"e{b}",
        relation="RELATES_TO",
        fact=text,
        created_at=times.pop("created_at", T0),  # type: ignore[arg-type]
        embedding=EMB.embed([text])[0],
        **times,  # type: ignore[arg-type]
    )


def episode(i: int, t: int = 0, group: str = "g", text: str | None = None) -> Episode:
    text = text or f"episode number {i}"
    return Episode(
        id=f"ep{i}",
        group_id=group,
        content=text,
        source="text",
        reference_time=T0 + t * DAY,
        created_at=T0,
        embedding=EMB.embed([text])[0],
    )


def scope(group: str | None = "g", **kw: object):
    return make_scope(T0 + 1000 * DAY, None if group is None else [group], **kw)  # type: ignore[arg-type]


def test_put_get_scan_count_groups(make_store):
    store = make_store(32)
    store.write(WriteBatch(puts=[entity(1), entity(2), entity(3, group="h"), fact(1, 1, 2, "one knows two")]))
    assert [e.id for e in store.get(Kind.ENTITY, ["e2", "nope", "e1"]) if e] == ["e2", "e1"]
    assert store.get(Kind.ENTITY, ["nope"]) == [None]
    assert [e.id for e in store.scan(Kind.ENTITY)] == ["e1", "e2", "e3"]
    assert [e.id for e in store.scan(Kind.ENTITY, frozenset({"h"}))] == ["e3"]
    assert store.count(Kind.ENTITY) == 3 and store.count(Kind.ENTITY, frozenset({"g"})) == 2
    assert store.groups() == {"g", "h"}
    assert store.get(Kind.FACT, ["f1"])[0] == fact(1, 1, 2, "one knows two")


def test_records_of_several_kinds_read_together_are_what_each_get_returns(make_store):
    """get_together (a search's records of every target, read at once: on several connections of a database) is,
    in order, what get returns for each (kind, ids): missing ids as None, an empty list as one."""
    store = make_store(32)
    store.write(WriteBatch(puts=[entity(1), entity(2), fact(1, 1, 2, "one knows two"), episode(1), episode(2)]))
    asks = [
        (Kind.FACT, ["f1", "nope"]),
        (Kind.ENTITY, ["e2", "e1", "e2"]),
        (Kind.EPISODE, []),
        (Kind.EPISODE, ["ep2", "ep1"]),
    ]
    alone = [store.get(kind, ids) for kind, ids in asks]
    assert [[r.id if r else None for r in records] for records in alone] == [
        ["f1", None],
        ["e2", "e1", "e2"],
        [],
        ["ep2", "ep1"],
    ]
    for _ in range(2):  # again: a backend's connections are reused
        assert store.get_together(asks) == alone
    assert store.get_together([]) == []


def test_replace_and_delete_update_every_index(make_store):
    store = make_store(32)
    store.write(WriteBatch(puts=[entity(1, name="Alice"), entity(2, name="Bob"), fact(1, 1, 2, "Alice likes tea")]))
    changed = dataclasses.replace(
        store.get(Kind.FACT, ["f1"])[0], fact="Alice likes coffee", embedding=EMB.embed(["Alice likes coffee"])[0]
    )
    store.write(WriteBatch(puts=[changed]))
    sc = scope()
    assert store.text_search(Kind.FACT, "tea", 5, sc) == []
    assert [h.id for h in store.text_search(Kind.FACT, "coffee", 5, sc)] == ["f1"]
    assert store.count(Kind.FACT) == 1
    store.write(WriteBatch(deletes=[(Kind.FACT, "f1")]))
    assert store.get(Kind.FACT, ["f1"]) == [None]
    assert store.text_search(Kind.FACT, "coffee", 5, sc) == []
    assert store.vector_search(Kind.FACT, EMB.embed(["Alice likes coffee"])[0], 5, sc) == []
    assert store.facts_of(["e1"]) == []
    assert store.bfs(["e1"], 3, sc) == {"e1": 0}


def test_write_is_all_or_nothing(make_store):
    store = make_store(32)
    store.write(WriteBatch(puts=[entity(1)]))
    before = list(store.scan(Kind.ENTITY))
    dangling = fact(1, 1, 99, "points nowhere")
    with pytest.raises(BackendError):
        store.write(WriteBatch(puts=[entity(2), dangling]))
    wrong_dim = dataclasses.replace(entity(3), name_embedding=np.ones(5, dtype=np.float32))
    with pytest.raises(EmbeddingError):
        store.write(WriteBatch(puts=[entity(4), wrong_dim]))
    nan = dataclasses.replace(entity(5), name_embedding=np.full(32, np.nan, dtype=np.float32))
    with pytest.raises(EmbeddingError):
        store.write(WriteBatch(puts=[nan]))
    cross = dataclasses.replace(entity(6), group_id="other")
    with pytest.raises(BackendError):
        store.write(WriteBatch(puts=[cross, fact(2, 1, 6, "crosses groups")]))
    with pytest.raises(ValidationError):
        store.write(WriteBatch(puts=["not a record"]))  # type: ignore[list-item]
    assert list(store.scan(Kind.ENTITY)) == before
    assert store.count(Kind.FACT) == 0 and store.groups() == {"g"}


def test_vector_search_is_exact_top_k_and_complete(make_store):
    # 300 items: most go through the HNSW graph (tail of 8), some stay in the tail; results must equal brute force.
    store = make_store(32)
    names = [f"item {i} colour {i % 7} shape {i % 11}" for i in range(300)]
    store.write(WriteBatch(puts=[entity(i, name=n) for i, n in enumerate(names)]))
    store.write(WriteBatch(deletes=[(Kind.ENTITY, f"e{i}") for i in range(0, 300, 3)]))
    vectors = EMB.embed(names)
    live = [i for i in range(300) if i % 3]
    for q in ["colour 3 shape 5", "item 7", "shape 10"]:
        qv = EMB.embed([q])[0]
        hits = store.vector_search(Kind.ENTITY, qv, 10, scope())
        exact = {f"e{i}": float(vectors[i] @ qv) for i in live}
        truth = sorted(exact, key=lambda i: -exact[i])[:10]
        assert len(hits) == 10
        # exactly the brute-force top 10: same scores, and the same ids wherever the scores are not tied at the cut
        assert np.allclose([h.score for h in hits], [exact[i] for i in truth], atol=1e-5)
        cut = exact[truth[-1]]
        assert {h.id for h in hits if h.score > cut + 1e-5} == {i for i in truth if exact[i] > cut + 1e-5}
        assert all(abs(exact[h.id] - h.score) <= 1e-5 for h in hits)  # each hit's own score, not a neighbour's
        assert all(int(h.id[1:]) % 3 for h in hits)  # never a deleted one
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    # asking for more than exist returns all of them, not an error
    assert len(store.vector_search(Kind.ENTITY, EMB.embed(["x"])[0], 1000, scope())) == len(live)


def test_candidates_answer_each_list_as_its_own_search_would(make_store):
    """A search's candidate lists asked at once (a database reads them on several connections together) are, in
    order, what each vector_search or text_search call returns alone; an unknown method or a kind without text is
    refused, and the store answers afterwards."""
    store = make_store(32)
    texts = [f"Ann visited city {i % 9} in spring {i % 4}" for i in range(60)]
    store.write(WriteBatch(puts=[entity(i, name=f"Person {i % 13} of city {i % 9}") for i in range(40)]))
    store.write(WriteBatch(puts=[fact(i, i % 40, (i * 7) % 40, t) for i, t in enumerate(texts)]))
    store.write(WriteBatch(puts=[episode(i, i, text=t) for i, t in enumerate(texts[:30])]))
    sc = scope()
    query = "city 3 in spring"
    vector = EMB.embed([query])[0]
    asks = [
        Candidates(method, kind, k)
        for kind in (Kind.FACT, Kind.ENTITY, Kind.EPISODE)
        for method, k in (("cosine", 7), ("bm25", 5))
    ]
    alone = [
        store.vector_search(a.kind, vector, a.k, sc)
        if a.method == "cosine"
        else store.text_search(a.kind, query, a.k, sc)
        for a in asks
    ]
    assert all(alone) and len({tuple(hits) for hits in alone}) == len(asks)  # six different, non-empty lists
    for _ in range(3):  # again: a backend's connections are reused
        assert store.candidates(asks, query, vector, sc) == alone
    assert store.candidates([], query, vector, sc) == []
    with pytest.raises(ValidationError):  # refused before anything is read, wherever it is in the batch
        store.candidates([*asks, Candidates("fuzzy", Kind.FACT, 5)], query, vector, sc)  # type: ignore[arg-type]
    for wrong in (Candidates("bm25", Kind.MENTION, 5), Candidates("cosine", Kind.MEMBERSHIP, 5)):
        with pytest.raises(BackendError):  # no text, no vectors: refused alike by every backend
            store.candidates([*asks, wrong], query, vector, sc)
    assert store.candidates(asks[:2], query, vector, sc) == alone[:2]


def test_text_search_contract(make_store):
    store = make_store(32)
    texts = [f"filler words number {i}" for i in range(40)] + ["the quick brown fox", "a quick dog", "brown bread"]
    store.write(WriteBatch(puts=[entity(i, name=t) for i, t in enumerate(texts)]))
    hits = store.text_search(Kind.ENTITY, "quick brown", 10, scope())
    ids = [h.id for h in hits]
    # The contract every backend meets: documents sharing a term are found, documents sharing none are absent,
    # and scores are positive and in rank order (the scores themselves are compared with the reference store's in
    # test_store_oracle).
    assert set(ids) == {"e40", "e41", "e42"}
    assert ids.index("e40") < min(ids.index("e41"), ids.index("e42"))
    assert all(h.score > 0 for h in hits) and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert store.text_search(Kind.ENTITY, "the of and", 10, scope()) == []  # stop words only
    assert store.text_search(Kind.ENTITY, "zebra", 10, scope()) == []
    store.write(WriteBatch(puts=[entity(99, name="quick brown fresh")]))  # found at once (fresh tail)
    assert "e99" in {h.id for h in store.text_search(Kind.ENTITY, "quick brown", 10, scope())}


def test_a_text_with_a_word_longer_than_a_database_key_is_stored_and_found_alike(make_store):
    """A run of 3,000 word characters no compression shrinks (a pasted key, a hex dump): PostgreSQL refused the whole
    write (a term is a btree key, at most ~2.7 KB) where memory took it. The tokenizer cuts such a run into tokens of
    MAX_TOKEN_CHARS, so every backend stores it and finds it by the same run."""
    blob = hashlib.sha256(b"0").hexdigest() * 47  # 3,008 hex digits
    assert len(tokenize(blob)) == -(-len(blob) // MAX_TOKEN_CHARS)
    store = make_store(32)
    store.write(WriteBatch(puts=[episode(1, text=f"the key is {blob} ok"), episode(2, text="another key")]))
    assert [h.id for h in store.text_search(Kind.EPISODE, blob, 10, scope())] == ["ep1"]
    assert [h.id for h in store.text_search(Kind.EPISODE, blob[:255], 10, scope())] == ["ep1"]


def test_group_scoping_never_leaks(make_store):
    store = make_store(32)
    store.write(WriteBatch(puts=[entity(1, "g", "Alice"), entity(2, "h", "Alice")]))
    assert {h.id for h in store.text_search(Kind.ENTITY, "alice", 5, scope("g"))} == {"e1"}
    assert {h.id for h in store.vector_search(Kind.ENTITY, EMB.embed(["Alice"])[0], 5, scope("h"))} == {"e2"}
    assert [e.id for e in store.entities_by_name("g", ["  ALICE "])["alice"]] == ["e1"]
    assert {h.id for h in store.text_search(Kind.ENTITY, "alice", 5, scope(None))} == {"e1", "e2"}


def test_a_final_plus_or_hash_is_part_of_a_name(make_store):
    """ "C++", "C#" and "C" are three names on every backend ("C++." and '"C#"' find them); the punctuation
    around a name is dropped otherwise. All three were one name, so resolution merged them."""
    store = make_store(32)
    store.write(
        WriteBatch(puts=[entity(1, "g", "C++"), entity(2, "g", "C#"), entity(3, "g", "C"), entity(4, "g", "Acme")])
    )
    found = store.entities_by_name("g", ["C++.", '"C#"', "C", "(Acme)"])
    assert {key: [e.id for e in hits] for key, hits in found.items()} == {
        "c++": ["e1"], "c#": ["e2"], "c": ["e3"], "acme": ["e4"]
    }  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    edges=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=30),
    seeds=st.lists(st.integers(0, 9), min_size=1, max_size=3, unique=True),
    depth=st.integers(1, 3),
    limit=st.none() | st.integers(1, 8),
    rewritten=st.sets(st.integers(0, 29)),
)
def test_bfs_with_a_limit_keeps_the_entities_met_first(make_store, edges, seeds, depth, limit, rewritten):
    """A walk cut at a limit keeps the entities it meets first: seeds in the order given, then level by level, each
    entity's facts in the order they were first written (ids in another order than the writes; a fact written
    again keeps its place). PostgreSQL kept the smallest ids of the last level, and the in-memory store moved a
    rewritten fact to the end, so a hub's neighbours differed between backends."""
    store = make_store(32)
    people = [dataclasses.replace(entity(i), id=f"e{9 - i:02d}") for i in range(10)]  # ids against write order
    facts = [
        dataclasses.replace(
            fact(i, 0, 0, f"fact {i}"), id=f"f{99 - i:03d}", source_id=people[a].id, target_id=people[b].id
        )
        for i, (a, b) in enumerate(edges)
    ]
    store.write(WriteBatch(puts=people))
    for at in range(0, len(facts), 7):  # in several writes, in order
        store.write(WriteBatch(puts=facts[at : at + 7]))
    again = [dataclasses.replace(f, fact=f.fact + " again") for i, f in enumerate(facts) if i in rewritten]
    if again:  # written again, in reverse: each keeps its place
        store.write(WriteBatch(puts=again[::-1]))
    starts = [people[i].id for i in seeds]
    hops: dict[str, int] = {s: 0 for s in starts}
    queue, cut = list(starts), False
    while queue and not cut:
        current = queue.pop(0)
        if hops[current] >= depth:
            continue
        for f in facts:
            if current not in (f.source_id, f.target_id):
                continue
            other = f.target_id if f.source_id == current else f.source_id
            if other not in hops:
                if limit is not None and len(hops) >= limit:
                    cut = True
                    break
                hops[other] = hops[current] + 1
                queue.append(other)
    assert store.bfs(starts, depth, scope(), limit) == hops


def test_bfs_meets_a_rewritten_fact_in_its_first_place(make_store):
    """A fact written again (an episode restating it, its supersession) keeps its place among its ends' facts:
    the in-memory store moved it to the end, so a walk cut at a limit met other neighbours than on the
    reference and PostgreSQL stores."""
    store = make_store(32)
    store.write(WriteBatch(puts=[entity(i) for i in range(6)]))
    spokes = [fact(i, 0, i, f"hub knows {i}") for i in range(1, 6)]
    store.write(WriteBatch(puts=spokes))
    store.write(WriteBatch(puts=[dataclasses.replace(f, fact=f.fact + " again") for f in spokes[:2]]))
    assert store.bfs(["e0"], 1, scope(), limit=3) == {"e0": 0, "e1": 1, "e2": 1}


@st.composite
def fact_times(draw):
    """Random bi-temporal stamps (days from T0), including open ends and invalidations learnt later."""
    created = draw(st.integers(0, 20))
    valid = draw(st.none() | st.integers(-10, 20))
    invalid = draw(st.none() | st.integers(valid if valid is not None else -10, 30))
    expired = draw(st.none() | st.integers(created, 40)) if invalid is not None else None
    day = lambda n: None if n is None else T0 + n * DAY  # noqa: E731
    return {"created_at": day(created), "valid_at": day(valid), "invalid_at": day(invalid), "expired_at": day(expired)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    times=st.lists(fact_times(), min_size=1, max_size=25),
    as_of=st.none() | st.integers(-12, 35),
    known_at=st.none() | st.integers(-1, 45),
    include_invalidated=st.booleans(),
)
def test_time_filters_agree_with_the_pure_definition(make_store, times, as_of, known_at, include_invalidated):
    store = make_store(32)
    store.write(WriteBatch(puts=[entity(1), entity(2)]))
    facts = [fact(i, 1, 2, f"alpha fact {i}", **t) for i, t in enumerate(times)]
    store.write(WriteBatch(puts=facts))
    sc = make_scope(
        T0 + 25 * DAY,
        ["g"],
        as_of=None if as_of is None else T0 + as_of * DAY,
        known_at=None if known_at is None else T0 + known_at * DAY,
        include_invalidated=include_invalidated,
    )
    expected = {f.id for f in facts if sc.admits(f)}
    by_text = {h.id for h in store.text_search(Kind.FACT, "alpha fact", 100, sc)}
    by_vector = {h.id for h in store.vector_search(Kind.FACT, EMB.embed(["alpha fact"])[0], 100, sc)}
    assert by_text == expected and by_vector == expected
    assert {f.id for f in store.facts_of(["e1"], sc)} == expected


def test_a_fact_superseded_twice_shows_each_believed_end_at_its_own_transaction_time(make_store):
    """Lives in Oslo from day 0 (open); on day 10 the memory learns a move on day 8 (ends it at 8); on day 20 a
    late fact says the move was on day 5 (ends it at 5). As known on day 15 it ended at 8; before day 10 it was
    open; from day 20 it ends at 5 -- on every backend, through search, neighbourhood and the time filters."""
    store = make_store(32)
    store.write(WriteBatch(puts=[entity(1), entity(2), entity(3)]))
    revision = {
        "invalid_at": (T0 + 8 * DAY).isoformat(),
        "invalidated_by": "f2",
        "expired_at": (T0 + 10 * DAY).isoformat(),
        "until": (T0 + 20 * DAY).isoformat(),
    }
    oslo = fact(
        1, 1, 2, "alpha lives in oslo", valid_at=T0, invalid_at=T0 + 5 * DAY, expired_at=T0 + 20 * DAY,
        invalidated_by="f3", attributes={"tkg.revisions": [revision]},
    )  # fmt: skip
    store.write(WriteBatch(puts=[oslo]))
    vector = EMB.embed(["alpha lives in oslo"])[0]
    for known, holds_on_day_6 in ((9, True), (10, True), (15, True), (19, True), (20, False), (25, False)):
        for as_of, expected in ((6, holds_on_day_6), (7, known < 20), (9, known < 10)):
            sc = scope(as_of=T0 + as_of * DAY, known_at=T0 + known * DAY)
            found = {h.id for h in store.text_search(Kind.FACT, "alpha oslo", 10, sc)}
            assert found == ({"f1"} if expected else set()), (known, as_of)
            assert {h.id for h in store.vector_search(Kind.FACT, vector, 10, sc)} == found
            assert {f.id for f in store.facts_of(["e1"], sc)} == found


def test_the_ends_of_the_facts_a_scope_admits_in_insertion_order(make_store):
    """fact_ends (the edges community detection reads) gives the ends of exactly the facts a scope admits, in the
    order a scan gives them, across groups, both timelines, relation filters, a replacement and a deletion."""
    store = make_store(32)
    store.write(WriteBatch(puts=[*(entity(i) for i in range(5)), entity(9, group="h")]))
    facts = [
        fact(1, 0, 1, "zero one"),
        fact(2, 2, 1, "ended", valid_at=T0, invalid_at=T0 + 2 * DAY, expired_at=T0 + 2 * DAY),
        fact(3, 3, 4, "learnt later", created_at=T0 + 5 * DAY),
        fact(4, 4, 0, "deleted"),
        fact(5, 9, 9, "other group", group="h"),
        fact(6, 1, 3, "from day three", valid_at=T0 + 3 * DAY),
    ]
    store.write(WriteBatch(puts=facts))
    store.write(WriteBatch(puts=[dataclasses.replace(facts[0], fact="zero one again")], deletes=[(Kind.FACT, "f4")]))
    assert store.fact_ends(scope()) == (["e0", "e3", "e1"], ["e1", "e4", "e3"])
    for sc in (
        scope(),
        scope(None),
        scope("h"),
        scope(include_invalidated=True),
        scope(as_of=T0 + DAY),
        scope(known_at=T0 + DAY),
        scope(filters=Filters(relations=frozenset({"OTHER"}))),
    ):
        admitted = [f for f in store.scan(Kind.FACT, sc.group_ids) if sc.admits(f)]
        assert store.fact_ends(sc) == ([f.source_id for f in admitted], [f.target_id for f in admitted]), sc


def test_bfs_hops_respect_scope(make_store):
    store = make_store(32)
    store.write(WriteBatch(puts=[entity(i) for i in range(6)]))
    store.write(
        WriteBatch(
            puts=[
                fact(1, 0, 1, "zero one"),
                fact(2, 2, 1, "two one"),  # reversed direction still connects
                fact(3, 2, 3, "two three"),
                fact(4, 3, 4, "ended", valid_at=T0, invalid_at=T0 + DAY, expired_at=T0 + DAY),
            ]
        )
    )
    assert store.bfs(["e0"], 2, scope()) == {"e0": 0, "e1": 1, "e2": 2}
    assert store.bfs(["e0"], 5, scope()) == {"e0": 0, "e1": 1, "e2": 2, "e3": 3}
    assert store.bfs(["e0"], 5, scope(include_invalidated=True))["e4"] == 4
    assert store.bfs(["missing"], 3, scope()) == {}


def test_provenance_mentions_and_timeline(make_store):
    store = make_store(32)
    store.write(WriteBatch(puts=[episode(1, t=5), episode(2, t=1), episode(3, t=9), entity(1), entity(2)]))
    f = dataclasses.replace(fact(1, 1, 2, "linked"), episodes=("ep1", "ep3"))
    store.write(
        WriteBatch(
            puts=[f, Mention("ep1", "e1", "g", T0), Mention("ep1", "e2", "g", T0), Mention("ep3", "e1", "g", T0)]
        )
    )
    assert [x.id for x in store.episode_facts("ep3")] == ["f1"]
    assert store.episode_facts("ep2") == []
    assert {m.entity_id for m in store.mentions(episode_ids=["ep1"])} == {"e1", "e2"}
    assert {m.episode_id for m in store.mentions(entity_ids=["e1"])} == {"ep1", "ep3"}
    assert [e.id for e in store.recent_episodes("g", T0 + 6 * DAY, 5)] == ["ep2", "ep1"]
    assert [e.id for e in store.recent_episodes("g", T0 + 30 * DAY, 2)] == ["ep1", "ep3"]
    with pytest.raises(BackendError):
        store.write(WriteBatch(puts=[Mention("ep404", "e1", "g", T0)]))
    store.write(WriteBatch(deletes=[(Kind.EPISODE, "ep2")]))
    assert [e.id for e in store.recent_episodes("g", T0 + 6 * DAY, 5)] == ["ep1"]


def test_episode_as_of_hides_later_episodes(make_store):
    store = make_store(32)
    store.write(WriteBatch(puts=[episode(1, t=1, text="lunch with Ann"), episode(2, t=10, text="lunch with Bo")]))
    hits = store.text_search(Kind.EPISODE, "lunch", 5, scope(as_of=T0 + 5 * DAY))
    assert [h.id for h in hits] == ["ep1"]


class _Turned:
    """An embedder double with two exactly orthogonal directions whose float32 products are not exactly 0
    ((0.6, 0.8) and (0.8, -0.6)); any other text points elsewhere."""

    name, dim = "turned-4", 4

    def embed(self, texts: list[str]) -> np.ndarray:
        known = {"north": [0.6, 0.8, 0.0, 0.0], "east": [0.8, -0.6, 0.0, 0.0]}
        return np.asarray([known.get(t.split()[-1].lower(), [0.0, 0.0, 1.0, 0.0]) for t in texts], dtype=np.float32)


def test_an_orthogonal_record_is_found_alike_on_every_backend(make_store):
    """Cosine 0 is at the default floor (min_similarity 0): kept on every backend, though pgvector returns
    1 - distance a hair below 0 where the in-memory backend computes 0.0 exactly."""
    from tkg import FactInput, Memory, SearchConfig, TargetConfig

    turned = _Turned()
    memory = Memory(make_store(turned.dim), embedder=turned)
    memory.add_facts([FactInput("Ann", "FACES", "East", fact="Ann faces east")], group_id="g")
    cosine_only = SearchConfig(facts=TargetConfig(methods=("cosine",)))
    found = memory.search("north", group_ids=["g"], config=cosine_only, targets=("facts",))
    assert [r.record.fact for r in found.facts] == ["Ann faces east"]


class _PerText:
    """A seeded random unit vector per text (the same text, the same vector)."""

    dim = 64
    name = "per-text-test"

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = [np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dim) for t in texts]
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)


@pytest.mark.parametrize("bag_of_words", [False, True])
def test_hybrid_search_ranks_alike_on_every_backend(make_store, bag_of_words):
    """Cosine and BM25 scores agree across backends (BM25: the formula of tkg.tokens over the same corpus
    statistics; cosine: tkg.cosines, pgvector's own distance being an ulp off; equal scores in insertion order),
    so the fused ranking a memory returns is the same on every backend, in order. With a random vector per text,
    equal texts tie exactly; with a bag-of-words embedder (the shipped HashEmbedder), texts of equal length sharing
    one word tie too -- and pgvector, or float64 arithmetic, broke those ties their own way."""
    from tkg import FactInput, FixedClock, HashEmbedder, Memory
    from tkg.backends.reference import ReferenceStore

    embedder = HashEmbedder() if bag_of_words else _PerText()

    rng = np.random.default_rng(11)
    people, places = ["Ann", "Bob", "Cleo", "Dan", "Eve"], ["Paris", "Berlin", "Rome", "Oslo", "Lima", "Kyoto"]
    verbs = ["lives in", "works in", "visited", "loves", "studied in"]
    facts = []
    for i in range(120):
        who, where, verb = rng.choice(people), rng.choice(places), rng.choice(verbs)
        relation = verb.upper().replace(" ", "_")
        facts.append(FactInput(str(who), relation, str(where), fact=f"{who} {verb} {where} (note {i % 7})"))
    results = []
    for store in (make_store(embedder.dim), ReferenceStore(dim=embedder.dim)):
        memory = Memory(store, embedder=embedder, clock=FixedClock(T0))
        for start in range(0, len(facts), 15):  # several writes: the in-memory text index has a main part and a tail
            memory.add_facts(facts[start : start + 15], group_id="g")
        found = []
        for query in ("who lives in Paris", "Berlin", "Eve loves Kyoto", "studied in Oslo note 3", "works"):
            hits = memory.search(query, group_ids=["g"], targets=("facts", "entities"), limit=10)
            found.append(
                (
                    [(f.record.fact, round(f.score, 6)) for f in hits.facts],
                    [(e.record.name, round(e.score, 6)) for e in hits.entities],
                )
            )
        results.append(found)
    assert results[0] == results[1]


def test_equal_texts_score_at_most_one_and_come_in_insertion_order(make_store):
    """A vector with itself came out an ulp above 1 (1.0000001); equal texts tie exactly, first stored first."""
    store = make_store(EMB.dim)
    said = "message number 41 ok"  # its float32 product with itself is 1.0000001
    texts = [said, "something else", *[said] * 30]
    store.write(WriteBatch(puts=[episode(i, t=i, text=t) for i, t in enumerate(texts)]))
    hits = store.vector_search(Kind.EPISODE, EMB.embed([said])[0], 5, scope())
    assert [h.id for h in hits] == ["ep0", "ep2", "ep3", "ep4", "ep5"]
    assert all(h.score <= 1.0 for h in hits) and len({h.score for h in hits}) == 1
