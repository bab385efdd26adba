"""Every backend against the oracle: the same random writes into the brute-force reference store and into the
backend under test, then the same questions asked of both, answers compared.

What must be equal: every read of the storage contract (records, order, counts, groups, names, facts of an
entity, breadth-first hops, mentions, memberships, provenance, episode timelines), cosine top-k (ids and scores),
and errors. Full-text search: the in-memory backend computes the same BM25 as the oracle (compared once its
indexes are folded, ``flush``: its main index keeps the statistics of its last rebuild until then); PostgreSQL's
full text is not BM25, so it is held to the stated contract: the same documents share a term with the query,
scores positive, best first.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from conftest import small_memory_store
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import tkg.backends.memory.store as memory_store
from tkg.backends.memory import InMemoryStore
from tkg.backends.memory.precision import BFLOAT16
from tkg.backends.reference import ReferenceStore
from tkg.embedders import HashEmbedder
from tkg.errors import TkgError
from tkg.models import (
    Community,
    Entity,
    Episode,
    EpisodeSource,
    Fact,
    Kind,
    Membership,
    Mention,
    Record,
    Verdict,
)
from tkg.storage import Closest, Hit, Store, WriteBatch
from tkg.timeline import DateRange, Filters, make_scope
from tkg.vector_sketches import EXACT_UP_TO

EMB = HashEmbedder(dim=16)
T0 = datetime(2024, 1, 1, tzinfo=UTC)
GROUPS = ["g", "h"]
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "paris", "rome", "tea", "jazz", "acme"]
RELATIONS = ["LIKES", "LIVES_IN", "WORKS_AT"]
LABELS = ["Person", "Place", "Org"]


def day(n: int) -> datetime:
    return T0 + timedelta(days=n)


class World:
    """Draws valid (and some invalid) writes, and remembers every id it made."""

    def __init__(self, data: st.DataObject, embed: Callable[[list[str]], Any] = EMB.embed) -> None:
        self.data = data
        self.embed = embed  # texts -> vectors of the records it makes
        self.n = 0
        self.entities: dict[str, str] = {}  # id -> group
        self.episodes: dict[str, str] = {}
        self.facts: dict[str, Fact] = {}
        self.communities: dict[str, str] = {}
        self.names: list[str] = []

    def draw(self, strategy: st.SearchStrategy[Any]) -> Any:
        return self.data.draw(strategy)

    def _id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def text(self, words: int = 3) -> str:
        return " ".join(self.draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=words)))

    def entity(self) -> Entity:
        group = self.draw(st.sampled_from(GROUPS))
        name = self.text(2).title()
        aliases = tuple(self.draw(st.lists(st.sampled_from(WORDS), max_size=1)))
        record = Entity(
            id=self._id("e"),
            group_id=group,
            name=name,
            created_at=day(self.draw(st.integers(0, 20))),
            summary=self.text(4),
            labels=("Entity", *self.draw(st.lists(st.sampled_from(LABELS), max_size=1))),
            aliases=aliases,
            name_embedding=self.embed([name])[0] if self.draw(st.booleans()) or True else None,
        )
        self.entities[record.id] = group
        self.names += [name, *aliases]
        return record

    def episode(self) -> Episode:
        group = self.draw(st.sampled_from(GROUPS))
        content = self.text(5)
        record = Episode(
            id=self._id("ep"),
            group_id=group,
            content=content,
            source=EpisodeSource.TEXT,
            reference_time=day(self.draw(st.integers(0, 30))),
            created_at=day(self.draw(st.integers(0, 30))),
            embedding=self.embed([content])[0],
        )
        self.episodes[record.id] = group
        return record

    def fact(self) -> Fact | None:
        group = self.draw(st.sampled_from(GROUPS))
        ends = [e for e, g in self.entities.items() if g == group]
        if not ends:
            return None
        episodes = [e for e, g in self.episodes.items() if g == group]
        valid = self.draw(st.one_of(st.none(), st.integers(0, 30)))
        span = self.draw(st.one_of(st.none(), st.integers(0, 10)))
        created = self.draw(st.integers(0, 30))
        expired = self.draw(st.one_of(st.none(), st.integers(0, 10)))
        text = self.text(4)
        judged = self.draw(st.lists(st.sampled_from(sorted(self.facts) or ["none"]), max_size=2, unique=True))
        verdicts = {other: self.draw(st.sampled_from(list(Verdict))) for other in judged}
        record = Fact(
            id=self._id("f"),
            group_id=group,
            source_id=self.draw(st.sampled_from(ends)),
            target_id=self.draw(st.sampled_from(ends)),
            relation=self.draw(st.sampled_from(RELATIONS)),
            fact=text,
            created_at=day(created),
            valid_at=None if valid is None else day(valid),
            invalid_at=None if valid is None or span is None else day(valid + span),
            expired_at=None if expired is None else day(created + expired),
            episodes=tuple(self.draw(st.lists(st.sampled_from(episodes), max_size=2, unique=True))) if episodes else (),
            embedding=self.embed([text])[0],
            verdicts=verdicts,
        )
        self.facts[record.id] = record
        return record

    def links(self) -> list[Record]:
        out: list[Record] = []
        for episode_id, group in list(self.episodes.items())[-2:]:
            for entity_id in [e for e, g in self.entities.items() if g == group][-2:]:
                out.append(Mention(episode_id, entity_id, group, day(1), name="x"))
        group = self.draw(st.sampled_from(GROUPS))
        members = [e for e, g in self.entities.items() if g == group]
        if members:
            name = self.text(2)
            community = Community(
                id=self._id("c"),
                group_id=group,
                name=name,
                created_at=day(2),
                summary=self.text(3),
                name_embedding=self.embed([name])[0],
            )
            self.communities[community.id] = group
            out.append(community)
            out += [Membership(community.id, m, group, day(2)) for m in members[:3]]
        return out

    def batch(self) -> WriteBatch:
        puts: list[Record] = []
        deletes: list[tuple[Kind, str]] = []
        for _ in range(self.draw(st.integers(1, 4))):
            choice = self.draw(st.sampled_from(["entity", "episode", "fact", "fact", "links", "replace", "delete"]))
            if choice == "entity":
                puts.append(self.entity())
            elif choice == "episode":
                puts.append(self.episode())
            elif choice == "fact" and (made := self.fact()) is not None:
                puts.append(made)
            elif choice == "links":
                puts += self.links()
            elif choice == "replace" and self.facts:
                old = self.facts[self.draw(st.sampled_from(sorted(self.facts)))]
                end = self.draw(st.integers(0, 40))
                # A replace may also change which facts the verdicts name (the stores' reverse indexes follow).
                judged = self.draw(st.lists(st.sampled_from(sorted(self.facts)), max_size=2, unique=True))
                verdicts = {other: self.draw(st.sampled_from(list(Verdict))) for other in judged}
                changed = dataclasses.replace(
                    old,
                    invalid_at=None if old.valid_at is None else max(old.valid_at, day(end)),
                    expired_at=day(35),
                    verdicts=self.draw(st.sampled_from([old.verdicts, verdicts])),
                )
                self.facts[old.id] = changed
                puts.append(changed)
            elif choice == "delete":
                pools = {Kind.FACT: self.facts, Kind.EPISODE: self.episodes, Kind.ENTITY: self.entities}
                kind = self.draw(st.sampled_from(sorted(pools)))
                if pools[kind]:
                    deletes.append((kind, self.draw(st.sampled_from(sorted(pools[kind])))))
        return WriteBatch(puts=puts, deletes=deletes)


def scopes(world: World) -> list[Any]:
    now = day(60)
    return [
        make_scope(now, None, include_invalidated=True),
        make_scope(now, ["g"]),
        make_scope(now, ["h"], as_of=day(12)),
        make_scope(now, GROUPS, known_at=day(15)),
        make_scope(now, ["g"], as_of=day(8), known_at=day(25)),
        make_scope(now, None, include_invalidated=True, filters=Filters(labels=("Person",))),
        make_scope(now, None, include_invalidated=True, filters=Filters(relations=("LIKES", "WORKS_AT"))),
        make_scope(
            now, None, include_invalidated=True, filters=Filters(dates=(DateRange("valid_at", day(5), day(20)),))
        ),
    ]


def same_hits(ours: list[Hit], oracle: list[Hit], what: str) -> None:
    """Same ids in the same order and the same scores; where scores tie (within float noise), any order."""
    assert len(ours) == len(oracle), what
    assert np.allclose([h.score for h in ours], [h.score for h in oracle], atol=1e-5, rtol=1e-5), what
    groups: dict[int, tuple[set[str], set[str]]] = {}
    for i, (a, b) in enumerate(zip(ours, oracle, strict=True)):
        tied = next((g for g, _ in enumerate(oracle[:i]) if abs(oracle[g].score - b.score) <= 1e-5), i)
        mine, theirs = groups.setdefault(tied, (set(), set()))
        mine.add(a.id)
        theirs.add(b.id)
    last = max(groups, default=None)
    for start, (mine, theirs) in groups.items():
        if start != last:  # the last group may be cut by k differently among equal scores
            assert mine == theirs, what


def compare(store: Store, oracle: ReferenceStore, world: World) -> None:
    for kind in Kind:
        assert list(store.scan(kind)) == list(oracle.scan(kind)), kind
        for group in GROUPS:
            groups = frozenset({group})
            assert list(store.scan(kind, groups)) == list(oracle.scan(kind, groups)), (kind, group)
            assert store.count(kind, groups) == oracle.count(kind, groups), (kind, group)
        ids = [r.id for r in oracle.scan(kind)] + ["missing"]
        assert store.get(kind, ids) == oracle.get(kind, ids), kind
    assert store.groups() == oracle.groups()
    for group in GROUPS:
        assert store.entities_by_name(group, world.names[:12]) == oracle.entities_by_name(group, world.names[:12])
    entity_ids = sorted(world.entities)[:10]
    for scope in scopes(world):
        what = f"scope {scope}"
        for entity_id in entity_ids:
            assert store.facts_of([entity_id], scope) == oracle.facts_of([entity_id], scope), what
            assert store.bfs([entity_id], 2, scope) == oracle.bfs([entity_id], 2, scope), what
            limited = store.bfs([entity_id], 3, scope, limit=3)
            truth = oracle.bfs([entity_id], 3, scope)
            assert len(limited) <= 3 and all(truth[e] == hops for e, hops in limited.items()), what
            if limited:  # nothing left out is nearer than the farthest kept
                assert all(h >= max(limited.values()) for e, h in truth.items() if e not in limited), what
        for query in ["alpha paris", "tea", "rome jazz acme", "zulu"]:
            vector = EMB.embed([query])[0]
            for kind in (Kind.ENTITY, Kind.FACT, Kind.EPISODE, Kind.COMMUNITY):
                for k in (1, 4, 50):
                    same_hits(
                        store.vector_search(kind, vector, k, scope),
                        oracle.vector_search(kind, vector, k, scope),
                        f"cosine {kind} {query!r} k={k} {what}",
                    )
                    ours, theirs = store.text_search(kind, query, k, scope), oracle.text_search(kind, query, k, scope)
                    same_hits(ours, theirs, f"bm25 {kind} {query!r} k={k} {what}")
    compare_neighbourhoods(store, oracle, world)
    if isinstance(store, InMemoryStore):  # every neighbourhood read from the columns, then from the adjacency sets
        for sparse in (10**9, 0):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(memory_store, "_SPARSE", sparse)
                compare_neighbourhoods(store, oracle, world)
    for episode_id in sorted(world.episodes):
        assert store.episode_facts(episode_id) == oracle.episode_facts(episode_id)
        assert store.mentions(episode_ids=[episode_id]) == oracle.mentions(episode_ids=[episode_id])
        assert store.episode_window(episode_id, 1, 2) == oracle.episode_window(episode_id, 1, 2)
    for entity_id in entity_ids:
        assert store.mentions(entity_ids=[entity_id]) == oracle.mentions(entity_ids=[entity_id])
        assert store.memberships(entity_ids=[entity_id]) == oracle.memberships(entity_ids=[entity_id])
    for community_id in sorted(world.communities):
        assert store.memberships(community_ids=[community_id]) == oracle.memberships(community_ids=[community_id])
    assert store.mentions() == oracle.mentions() and store.memberships() == oracle.memberships()
    for group in GROUPS:
        for before, n in ((day(10), 2), (day(40), 5), (day(0), 1)):
            assert store.recent_episodes(group, before, n) == oracle.recent_episodes(group, before, n)


def compare_neighbourhoods(store: Store, oracle: ReferenceStore, world: World) -> None:
    """The reads of a new fact's neighbourhood (facts between two entities, of an entity and relation, judging
    others, closest by cosine); the in-memory backend also with every neighbourhood counted as large (read from
    its columns, as for a hot entity)."""
    entity_ids = sorted(world.entities)[:8]
    fact_ids = [*sorted(world.facts)[:6], "missing"]
    vector = EMB.embed(["alpha paris tea"])[0]
    for n, entity_id in enumerate(entity_ids):
        ends = [entity_id, *entity_ids[n + 1 : n + 2]]
        pairs = [(entity_id, other) for other in entity_ids[n:]]
        assert store.facts_between(pairs) == oracle.facts_between(pairs), pairs
        assert store.facts_judging(fact_ids, ends) == oracle.facts_judging(fact_ids, ends), ends
        for relation in [*RELATIONS, "NONE"]:
            assert store.facts_with(ends, relation) == oracle.facts_with(ends, relation), (ends, relation)
            for same, holding in itertools.product((True, False), (False, True)):
                for k in (1, 3, 50):
                    ours = store.closest_facts(ends, vector, k, relation, same=same, holding=holding)
                    theirs = oracle.closest_facts(ends, vector, k, relation, same=same, holding=holding)
                    assert all(f == store.get(Kind.FACT, [f.id])[0] for f, _ in ours)
                    assert not holding or all(f.expired_at is None for f, _ in ours)
                    same_hits(
                        [Hit(f.id, s) for f, s in ours],
                        [Hit(f.id, s) for f, s in theirs],
                        f"closest {ends} {relation} same={same} holding={holding} k={k}",
                    )
            # Several reads made together (on a database: on several connections) are each what it reads alone.
            asks = [
                Closest(ends, vector, k, relation, same, holding)
                for same, holding in itertools.product((False, True), (False, True))
                for k in (3, 50)
            ]
            alone = [
                store.closest_facts(a.entity_ids, a.vector, a.k, a.relation, same=a.same, holding=a.holding)
                for a in asks
            ]
            assert store.closest_facts_together(asks) == alone, (ends, relation)
    assert store.closest_facts_together([]) == []


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_every_backend_answers_like_the_reference_store(
    make_store: Callable[[int], Store], data: st.DataObject
) -> None:
    store = make_store(EMB.dim)
    if isinstance(store, ReferenceStore):
        pytest.skip("the oracle against itself")
    answers_like_the_oracle(store, World(data), data)


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_a_bfloat16_store_answers_like_the_reference_store_on_vectors_it_keeps_exactly(data: st.DataObject) -> None:
    """``vector_precision="bfloat16"`` changes nothing but the rounding of the vectors: given vectors that are
    bfloat16 values already, every answer (records and their vectors, cosine scores, closest facts) is the
    oracle's."""
    store = small_memory_store(EMB.dim, vector_precision="bfloat16")
    answers_like_the_oracle(store, World(data, lambda texts: BFLOAT16.round(EMB.embed(texts))), data)


def answers_like_the_oracle(store: Store, world: World, data: st.DataObject) -> None:
    """The world's random writes into ``store`` and the reference store, then every question compared."""
    oracle = ReferenceStore(dim=EMB.dim)
    for step in range(data.draw(st.integers(3, 14))):
        batch = world.batch()
        errors = []
        for target in (store, oracle):
            try:
                target.write(batch)
                errors.append(None)
            except TkgError as exc:
                errors.append(type(exc))
        note(f"step {step}: {len(batch.puts)} puts, {batch.deletes} deletes -> {errors}")
        assert errors[0] == errors[1]
    try:
        compare(store, oracle, world)
    finally:
        store.close()  # one example's connections are not the next one's


def test_the_closest_facts_around_a_hot_entity_are_found_among_crowding_ones(
    make_store: Callable[[int], Store],
) -> None:
    """Past the facts scored exactly, the closest facts around an entity come from the bit sketches of its
    neighbourhood (tkg.vector_sketches) on every backend. Here the facts of the new fact's own relation crowd the
    query (an index walk under the filter was crowded out by them): asked for the other relations' closest, or for
    its own, every backend returns exact scores and the true closest (the exact answer is the storage interface's
    own, which scores every fact of the entity)."""
    dim, rng = 32, np.random.default_rng(5)
    store = make_store(dim)
    query = rng.standard_normal(dim).astype(np.float32)
    hub = Entity(id="user", group_id="g", name="User", created_at=T0)
    others = [Entity(id=f"o{i}", group_id="g", name=f"Thing {i}", created_at=T0) for i in range(50)]
    facts = []
    for i in range(2 * EXACT_UP_TO + 1000):  # more of each side than are all scored exactly
        near = i % 2 == 0  # the KNOWS facts lie around the query, the others anywhere
        vector = (query + 0.3 * rng.standard_normal(dim) if near else rng.standard_normal(dim)).astype(np.float32)
        facts.append(
            Fact(
                id=f"f{i}",
                group_id="g",
                source_id="user",
                target_id=f"o{i % 50}",
                relation="KNOWS" if near else ["OWNS", "READ"][i % 4 // 2],
                fact=f"fact {i}",
                created_at=T0,
                expired_at=T0 if i % 3 == 0 else None,  # a third superseded: not among the holding ones
                embedding=vector,
            )
        )
    try:
        store.write(WriteBatch(puts=[hub, *others, *facts]))
        for n in range(6):
            probe = (query + 0.5 * rng.standard_normal(dim)).astype(np.float32)
            for same, holding in itertools.product((True, False), (False, True)):
                exact = Store.closest_facts(store, ["user"], probe, 10**6, "KNOWS", same=same, holding=holding)
                score = {f.id: s for f, s in exact}
                kth = exact[9][1] - 1e-5
                got = store.closest_facts(["user"], probe, 10, "KNOWS", same=same, holding=holding)
                assert len(got) == 10
                assert all(abs(s - score[f.id]) <= 1e-5 for f, s in got), (n, same)  # exact scores
                assert all((f.relation == "KNOWS") == same for f, _ in got)
                assert all(f.expired_at is None for f, _ in got) or not holding
                found = sum(s >= kth for _, s in got)
                assert found >= 9, (n, same, holding, found)
            both = [Closest(["user"], probe, 10, "KNOWS", same) for same in (False, True)]
            assert store.closest_facts_together(both) == [
                store.closest_facts(["user"], probe, 10, "KNOWS", same=same) for same in (False, True)
            ]
    finally:
        store.close()
