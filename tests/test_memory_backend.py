"""In-memory backend specifics beyond the Store protocol: index maintenance at scale."""

from __future__ import annotations

import dataclasses
import gc
import threading
import types
from typing import Any

import numpy as np
import pytest
from conftest import T0, searchable_records

from tkg.backends.memory import InMemoryStore
from tkg.embedders import HashEmbedder
from tkg.errors import ValidationError
from tkg.models import Entity, Episode, EpisodeSource, Fact, Kind, Mention, Record, Verdict
from tkg.storage import Candidates, Hit, WriteBatch
from tkg.timeline import make_scope

EMB = HashEmbedder(dim=16)


def test_many_writes_keep_search_complete_across_index_rebuilds():
    store = InMemoryStore(dim=16, vector_tail=64)
    for index in store._texts.values():
        index._min_rebuild = 50
    for batch in range(10):
        store.write(
            WriteBatch(
                puts=[
                    Entity(
                        id=f"e{batch}_{i}",
                        group_id="g",
                        name=f"common word{batch} item{i}",
                        created_at=T0,
                        name_embedding=EMB.embed([f"common word{batch} item{i}"])[0],
                    )
                    for i in range(40)
                ]
            )
        )
    scope = make_scope(T0, ["g"])
    assert len(store.text_search(Kind.ENTITY, "common", 1000, scope)) == 400
    assert len(store.vector_search(Kind.ENTITY, EMB.embed(["common"])[0], 1000, scope)) == 400
    assert {h.id for h in store.text_search(Kind.ENTITY, "word7", 100, scope)} == {f"e7_{i}" for i in range(40)}
    stats = store.stats()["text_index"]["entity"]
    assert stats["main"] > 0  # the bm25s index was rebuilt along the way


def _graph(n: int) -> list[Record]:
    """``n`` entities, one episode each, a fact from each to the next, each entity mentioned by its episode."""
    records: list[Record] = []
    for i in range(n):
        records.append(Entity(id=f"e{i}", group_id="g", name=f"person {i}", created_at=T0))
        records.append(
            Episode(
                id=f"p{i}",
                group_id="g",
                content=f"person {i} met",
                source=EpisodeSource.TEXT,
                reference_time=T0,
                created_at=T0,
            )
        )
        records.append(Mention(episode_id=f"p{i}", entity_id=f"e{i}", group_id="g", created_at=T0))
    for i in range(n):
        records.append(
            Fact(
                id=f"f{i}",
                group_id="g",
                source_id=f"e{i}",
                target_id=f"e{(i + 1) % n}",
                relation="MET",
                fact=f"person {i} met person {i + 1}",
                created_at=T0,
                episodes=(f"p{i}",),
            )
        )
    return records


def test_stored_records_add_no_object_for_the_cycle_collector_to_walk(tmp_path):
    """A full garbage collection stops every thread for a time that grows with the objects it walks. The store
    keeps its records as rows of plain values and its secondary indexes (an entity's facts, an episode's mentions,
    names, ...) as dicts of strings, all of which the cycle collector leaves out: the objects it tracks do not grow
    with the records, written one batch at a time, loaded in bulk or restored from a snapshot (records kept as
    objects would add one each: 1,200 here; a set per index key five more per entity)."""
    from tkg.snapshot import open_snapshot, save

    n = 300
    saved = tmp_path / "m.tkg"
    # Counted apart, by a first round: the modules a first write, flush, save and restore import.
    warm = InMemoryStore(dim=16)
    warm.write(WriteBatch(puts=_graph(n)))
    warm.flush()
    save(warm, saved, {"dim": 16})
    open_snapshot(saved).restore_into(InMemoryStore(dim=16))
    for fill in ("write", "load", "restore"):
        store = InMemoryStore(dim=16)
        if fill == "restore":
            source = InMemoryStore(dim=16)
            source.load(_graph(n))
            save(source, saved, {"dim": 16})
            del source
        gc.collect()
        before = len(gc.get_objects())
        records = _graph(n)  # the caller's records, let go once written: the store's own objects remain
        written = [(r.kind.value, r.id) for r in records]
        if fill == "write":
            store.write(WriteBatch(puts=records))
            store.flush()  # fresh texts wait in a bounded tail, counted per document, until a rebuild folds them in
        elif fill == "load":
            store.load(records)
        else:
            open_snapshot(saved).restore_into(store)
        del records
        gc.collect()
        gc.collect()  # a row holding a tuple still tracked when the collector saw it is left out the next time
        added = len(gc.get_objects()) - before
        assert added <= 60, (fill, added)
        assert {f.id for f in store.facts_of(["e1"])} == {"f0", "f1"}
        assert [m.entity_id for m in store.mentions(episode_ids=["p7"])] == ["e7"]
        assert sorted((r.kind.value, r.id) for kind in Kind for r in store.scan(kind)) == sorted(written)


def _collector_visits(root: object) -> int:
    """How many references a full collection follows among the objects reachable from ``root`` through tracked
    containers (classes, functions and modules, which are the interpreter's, are not followed)."""
    seen, todo, visits = {id(root)}, [root], 0
    while todo:
        for obj in gc.get_referents(todo.pop()):
            visits += 1
            skip = isinstance(obj, type | types.FunctionType | types.ModuleType | types.MethodType)
            if not skip and id(obj) not in seen and gc.is_tracked(obj):
                seen.add(id(obj))
                todo.append(obj)
    return visits


def test_a_full_collection_visits_nothing_per_stored_record(tmp_path):
    """A full collection follows every reference of every tracked container, even to objects it does not track:
    at 100,000 facts the tables' lists of rows and of changed slots, the secondary indexes (dicts of sets) and the
    episodes' timelines made ~1,100,000 such visits, ~60% of a collection's time. Rows, sets and timelines are
    held where the collector does not look (numpy arrays of objects, arrays of machine integers), so what it
    visits from a store does not grow with the records (the last records read, a bounded cache, are emptied
    here; tails of fresh texts are folded)."""
    from tkg.backends.memory.arrays import ObjectList
    from tkg.snapshot import open_snapshot, save

    rows = ObjectList([("a", 1)])
    for i in range(2_000):
        rows.append((f"id{i}", i))
    rows[5] = None
    held = [o for o in gc.get_referents(rows) if isinstance(o, np.ndarray)]
    assert len(held) == 1 and gc.get_referents(held[0]) == [] and not gc.is_tracked(held[0])
    assert (len(rows), rows[0], rows[5], rows[2_000], rows.copy()[1]) == (
        2_001,
        ("a", 1),
        None,
        ("id1999", 1999),
        ("id0", 0),
    )
    with pytest.raises(IndexError):
        rows[2_001]

    visits = {}
    for n in (300, 1_500):
        for fill in ("write", "load", "restore"):
            store = InMemoryStore(dim=16)
            records = _graph(n)
            if fill == "write":
                for at in range(0, len(records), 7):
                    store.write(WriteBatch(puts=records[at : at + 7]))
            elif fill == "load":
                store.load(records)
            else:
                source = InMemoryStore(dim=16)
                source.load(records)
                save(source, tmp_path / "m.tkg", {"dim": 16})
                open_snapshot(tmp_path / "m.tkg").restore_into(store)
            store.flush()
            assert len(store.facts_of(["e1"])) == 2 and len(store.recent_episodes("g", T0, 5)) == 5
            for table in store._tables.values():
                table._made.clear()
            visits[(fill, n)] = _collector_visits(store)
    for fill in ("write", "load", "restore"):  # 4,800 more records, 6,000 more index entries
        assert visits[(fill, 1_500)] - visits[(fill, 300)] < 600, visits


def test_tokenizing_new_words_adds_no_object_for_the_cycle_collector_to_walk():
    """Stems are cached once (PyStemmer's own cache, off, would keep up to 10,000 lists of its words)."""
    from tkg.tokens import tokenize

    gc.collect()
    before = len(gc.get_objects())
    assert len(tokenize(" ".join(f"collectorword{i}s" for i in range(20_000)))) == 20_000
    gc.collect()
    assert len(gc.get_objects()) - before <= 50


def test_records_read_back_are_the_records_written_and_a_replacement_is_read_at_once():
    """Records are made again from their rows: equal to what was written, with the same types (enum members,
    dicts, tuples, the vector bit for bit); a record made for one read serves the next until its row changes."""
    store = InMemoryStore(dim=16)
    vector = EMB.embed(["x"])[0]
    episode = Episode(
        id="p",
        group_id="g",
        content="{}",
        source=EpisodeSource.JSON,
        reference_time=T0,
        created_at=T0,
        attributes={"nested": {"a": [1, 2]}},
        embedding=vector,
    )
    fact = Fact(
        id="f",
        group_id="g",
        source_id="a",
        target_id="b",
        relation="KNOWS",
        fact="a knows b",
        created_at=T0,
        episodes=("p",),
        verdicts={"old": Verdict.CONTRADICTS},
        attributes={"since": T0},
        embedding=vector,
    )
    ends = [Entity(id=e, group_id="g", name=e, created_at=T0) for e in ("a", "b")]
    store.write(WriteBatch(puts=[episode, *ends, fact]))
    got_episode, got_fact = store.get(Kind.EPISODE, ["p"])[0], store.get(Kind.FACT, ["f"])[0]
    assert got_episode == episode and got_fact == fact
    assert got_episode.source is EpisodeSource.JSON and got_fact.verdicts["old"] is Verdict.CONTRADICTS
    assert type(got_fact.episodes) is tuple and type(got_fact.attributes) is dict
    assert got_fact.embedding.tobytes() == vector.tobytes() and not got_fact.embedding.flags.writeable
    assert store.get(Kind.FACT, ["f"])[0] == fact
    changed = dataclasses.replace(fact, fact="a knows b well", verdicts={})
    store.write(WriteBatch(puts=[changed]))
    assert store.get(Kind.FACT, ["f"])[0] == changed and store.facts_of(["a"]) == [changed]
    store.write(WriteBatch(deletes=[(Kind.FACT, "f")]))
    assert store.get(Kind.FACT, ["f"]) == [None] and store.facts_of(["a"]) == []
    store.write(WriteBatch(puts=[fact]))
    assert store.get(Kind.FACT, ["f"])[0] == fact


def test_the_closest_facts_see_every_write_between_two_reads_around_one_entity():
    """An episode reads the facts around an entity twice (its relation, then the others) and the store splits the
    neighbourhood once for both: a fact written, replaced or deleted between two reads is seen by the next one,
    around a hot entity (most of the table) and around one of a few facts (read from the adjacency index)."""
    rng = np.random.default_rng(2)
    store = InMemoryStore(dim=16)
    entities = [Entity(id=f"e{i}", group_id="g", name=f"n{i}", created_at=T0) for i in range(400)]
    store.write(WriteBatch(puts=entities))

    def fact(i: int, source: str, target: str, relation: str) -> Fact:
        vector = rng.standard_normal(16).astype(np.float32)
        return Fact(
            id=f"f{i}",
            group_id="g",
            source_id=source,
            target_id=target,
            relation=relation,
            fact=f"fact {i}",
            created_at=T0,
            embedding=vector,
        )

    hot = [fact(i, "e0", f"e{1 + i % 399}", ("LIKES", "OWNS")[i % 2]) for i in range(600)]
    quiet = [fact(1000 + i, "e1", f"e{2 + i}", "LIKES") for i in range(3)]
    store.write(WriteBatch(puts=hot + quiet))
    query = rng.standard_normal(16).astype(np.float32)
    for around, relation, other in (("e0", "LIKES", "OWNS"), ("e1", "LIKES", "OWNS")):
        for same in (True, False):
            before = {f.id for f, _ in store.closest_facts([around], query, 1000, relation, same=same)}
            added = fact(5000 + len(before), around, "e399", relation if same else other)
            store.write(WriteBatch(puts=[added]))
            after = {f.id for f, _ in store.closest_facts([around], query, 1000, relation, same=same)}
            assert after == before | {added.id}, (around, same)
            moved = dataclasses.replace(added, relation=other if same else relation)
            store.write(WriteBatch(puts=[moved]))
            assert {f.id for f, _ in store.closest_facts([around], query, 1000, relation, same=same)} == before
            store.write(WriteBatch(deletes=[(Kind.FACT, added.id)]))
            assert {f.id for f, _ in store.closest_facts([around], query, 1000, relation, same=not same)} == {
                f.id for f in store.facts_of([around]) if (f.relation == relation) is not same
            }


@pytest.mark.parametrize(
    "option",
    [
        {"hnsw_m": 1},
        {"ef_construction": 0},
        {"ef_search": 0},
        {"ef_search": True},
        {"vector_tail": 0},
        {"threads": 0},
        {"search_threads": 0},
        {"search_threads": 1.5},
    ],
)
def test_index_options_out_of_range_are_refused(option: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match=next(iter(option))):
        InMemoryStore(dim=16, **option)  # type: ignore[arg-type]


def _facts_with_vectors(vectors: np.ndarray) -> list[Record]:
    people: list[Record] = [Entity(id=f"e{i}", group_id="g", name=f"person {i}", created_at=T0) for i in range(2)]
    return people + [
        Fact(
            id=f"f{i}",
            group_id="g",
            source_id="e0",
            target_id="e1",
            relation="MET",
            fact=f"fact {i}",
            created_at=T0,
            embedding=vector,
        )
        for i, vector in enumerate(vectors)
    ]


def test_ef_search_sets_how_far_the_graph_search_looks() -> None:
    """``ef_search`` reaches the HNSW search over a store's facts (6,000 random 32-d vectors, past the size searched
    by brute force): at the number of facts, the answer is the exact top 10 for every query; at 1 (a search for 10
    then keeps ~20 candidates), the same store built alike misses some of them."""
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((6000, 32)).astype(np.float32)
    queries = rng.standard_normal((30, 32)).astype(np.float32)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    exact = [{f"f{i}" for i in np.argsort(-(unit @ query))[:10]} for query in queries]
    scope = make_scope(T0, ["g"])
    found = {}
    for ef in (6000, 1):
        store = InMemoryStore(dim=32, ef_search=ef, background=False)
        store.load(_facts_with_vectors(vectors))
        found[ef] = [{hit.id for hit in store.vector_search(Kind.FACT, query, 10, scope)} for query in queries]
        store.close()
    assert found[6000] == exact
    assert sum(len(got & want) for got, want in zip(found[1], exact, strict=True)) < 10 * len(queries)


# -- a search's candidate lists on two threads -------------------------------------------------------------------
def _searchable(**options: Any) -> tuple[InMemoryStore, list[Candidates], str, np.ndarray, Any]:
    """A small store of people and facts between them, and the six lists of a hybrid search over facts, entities
    and episodes."""
    store = InMemoryStore(dim=16, background=False, **options)
    store.write(WriteBatch(puts=searchable_records(EMB)))
    asks = [Candidates(m, kind, 5) for kind in (Kind.FACT, Kind.ENTITY, Kind.EPISODE) for m in ("cosine", "bm25")]
    return store, asks, "Bob in city 3", EMB.embed(["Bob in city 3"])[0], make_scope(T0, ["g"])


def _meeting_text_searches(store: InMemoryStore, timeout: float = 10) -> set[str]:
    """Make each BM25 list of ``store``'s searches wait until another one is being read too (BrokenBarrierError
    after ``timeout`` seconds): two asked at once pass only if read on two threads at once. Returns the set the
    names of the threads that read them go to."""
    barrier = threading.Barrier(2, timeout=timeout)
    names: set[str] = set()
    search = store._search

    def meeting(ask: Candidates, *args: Any) -> Any:
        read = search(ask, *args)
        if ask.method != "bm25":
            return read

        def met() -> list[Hit]:
            names.add(threading.current_thread().name)
            barrier.wait()
            return read()

        return met

    store._search = meeting  # type: ignore[method-assign]
    return names


def test_a_large_search_reads_its_candidate_lists_on_two_threads_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a store holding enough records, the BM25 lists wait for each other at a barrier: read one after the other
    they would never get past it. The answers, in the order asked, are those of a store that reads them in turn."""
    from tkg.backends.memory import store as store_module

    alone, asks, query, vector, scope = _searchable(search_threads=1)
    expected = alone.candidates(asks, query, vector, scope)
    assert expected == [
        alone.vector_search(a.kind, vector, a.k, scope)
        if a.method == "cosine"
        else alone.text_search(a.kind, query, a.k, scope)
        for a in asks
    ]
    assert all(expected[:4]) and not any(expected[4:])  # episodes: none stored
    monkeypatch.setattr(store_module, "_TOGETHER_FROM", 0)  # this small store counts as a large one
    store, *_ = _searchable()
    names = _meeting_text_searches(store)
    bm25 = [a for a in asks if a.method == "bm25"][:2]  # two lists to meet at the barrier
    assert store.candidates(bm25, query, vector, scope) == [expected[1], expected[3]]
    assert len(names) == 2 and threading.current_thread().name in names
    del store._search
    assert store.candidates(asks, query, vector, scope) == expected
    pool = store._pool
    assert pool is not None and alone._pool is None  # one thread: no helper made
    store.close()  # the helper's thread ends; the store still answers, on a new one
    assert store._pool is None and pool._shutdown
    assert store.candidates(asks, query, vector, scope) == expected
    store.close()


def test_a_small_search_or_one_asking_a_list_twice_reads_on_the_calling_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below the size at which a second thread pays (and whatever the size, when two lists would read one index:
    its caches are not shared between threads), the lists are read one after the other on the calling thread: two
    BM25 lists waiting for each other never meet."""
    from tkg.backends.memory import store as store_module

    store, asks, query, vector, scope = _searchable()
    expected = store.candidates(asks, query, vector, scope)
    names = _meeting_text_searches(store, timeout=0.5)
    with pytest.raises(threading.BrokenBarrierError):
        store.candidates([asks[1], asks[3]], query, vector, scope)
    monkeypatch.setattr(store_module, "_TOGETHER_FROM", 0)  # large enough, but one index asked twice
    with pytest.raises(threading.BrokenBarrierError):
        store.candidates([asks[0], asks[1], asks[1]], query, vector, scope)
    assert names == {threading.current_thread().name}
    del store._search
    assert store.candidates([asks[1], asks[0], asks[1]], query, vector, scope) == [
        expected[1],
        expected[0],
        expected[1],
    ]
    store.close()


def test_views_at_times_asked_for_are_cached_without_scanning_every_timestamp(monkeypatch: pytest.MonkeyPatch) -> None:
    """A view of "now" read from the clock is cached with the interval of times it holds over, found by scanning
    every timestamp. A view known at a time asked for does not move: it is cached as it is, without that scan, and
    found again when asked again. A view as of past times, as known now, is the view of now (scanned once, then
    shared) narrowed by event time. Each mask equals the one the table computes directly."""
    from datetime import timedelta

    from tkg.backends.memory.tables import Table

    day = timedelta(days=1)
    store = InMemoryStore(dim=16, background=False)
    records = searchable_records(EMB)
    # facts that began on days 0..29, every third ended 5 days later, and every fifth of those superseded on day 40
    for i, record in enumerate(records):
        if isinstance(record, Fact):
            n = int(record.id[1:])
            ended = T0 + (n + 5) * day if n % 3 == 0 else None
            superseded = ended is not None and n % 5 == 0
            records[i] = dataclasses.replace(
                record,
                valid_at=T0 + n * day,
                invalid_at=ended,
                expired_at=T0 + 40 * day if superseded else None,
                prior_invalid_at=None,
            )
    store.write(WriteBatch(puts=records))
    table = store._tables[Kind.FACT]
    scans: list[int] = []
    scan = Table.stable_interval
    monkeypatch.setattr(Table, "stable_interval", lambda self, *a: scans.append(1) or scan(self, *a))

    def direct(scope: Any) -> list[bool]:
        return table.mask(scope, store._group_codes, store._relation_codes).tolist()  # type: ignore[no-any-return]

    later = T0 + 60 * day
    asked = make_scope(later, ["g"], known_at=T0 + 20 * day)
    assert asked.explicit_known_at and not make_scope(later, ["g"]).explicit_known_at
    assert store._mask(Kind.FACT, asked).tolist() == direct(asked) and scans == []
    cached = len(store._masks)
    assert store._mask(Kind.FACT, make_scope(later, ["g"], known_at=T0 + 20 * day)).tolist() == direct(asked)
    assert len(store._masks) == cached and scans == []  # the same time asked again: the same mask
    store._mask(Kind.FACT, make_scope(later, ["g"]))
    assert scans  # the clock's views are cached with their interval
    scans.clear()
    for now in (T0 + 30 * day, later):  # before and after the supersessions were learnt
        masks = set()
        for days in range(-2, 40, 3):
            past = make_scope(now, ["g"], as_of=T0 + days * day)
            masks.add(tuple(store._mask(Kind.FACT, past).tolist()))
            assert store._mask(Kind.FACT, past).tolist() == direct(past)
        assert len(masks) > 5
    assert len(scans) == 1  # the view of now without event time: once, and it holds at both times
    store.close()
