"""In-memory backend specifics beyond the Store protocol: index maintenance at scale."""

from __future__ import annotations

import gc

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
