"""In-memory backend specifics beyond the Store protocol: index maintenance at scale."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
from conftest import T0

from tkg.backends.memory import InMemoryStore
from tkg.embedders import HashEmbedder
from tkg.models import Entity, Episode, EpisodeSource, Fact, Kind, Mention, Record
from tkg.storage import WriteBatch
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


def test_secondary_indexes_add_no_object_for_the_cycle_collector_to_walk():
    """A full garbage collection stops every thread for a time that grows with the objects it walks. The store's
    secondary indexes (an entity's facts, an episode's mentions, names, ...) hold their ids in dicts of strings,
    which the cycle collector leaves out: the objects it tracks grow by one per record, written one batch at a
    time or loaded in bulk (a set per key would add five per entity here: 2,718 objects for 1,200 records)."""
    n = 300
    for fill in ("write", "load"):
        store = InMemoryStore(dim=16)
        records = _graph(n)
        gc.collect()
        before = len(gc.get_objects())
        if fill == "write":
            store.write(WriteBatch(puts=records))
        else:
            store.load(records)
        gc.collect()
        added = len(gc.get_objects()) - before
        assert added <= len(records) + 50, (fill, added, len(records))
        assert {f.id for f in store.facts_of(["e1"])} == {"f0", "f1"}
        assert [m.entity_id for m in store.mentions(episode_ids=["p7"])] == ["e7"]


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
