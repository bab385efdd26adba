"""In-memory backend specifics beyond the Store protocol: the igraph view and index maintenance at scale."""

from __future__ import annotations

from conftest import T0

from tkg.backends.memory import InMemoryStore
from tkg.embedders import HashEmbedder
from tkg.models import Entity, Fact, Kind
from tkg.storage import WriteBatch
from tkg.timeline import make_scope

EMB = HashEmbedder(dim=16)


def test_entity_graph_is_weighted_by_admitted_facts():
    store = InMemoryStore(dim=16)
    store.write(WriteBatch(puts=[Entity(id=f"e{i}", group_id="g", name=f"N{i}", created_at=T0) for i in range(4)]))
    facts = [
        Fact(id="f1", group_id="g", source_id="e0", target_id="e1", relation="R", fact="a", created_at=T0),
        Fact(id="f2", group_id="g", source_id="e1", target_id="e0", relation="R", fact="b", created_at=T0),
        Fact(
            id="f3",
            group_id="g",
            source_id="e2",
            target_id="e3",
            relation="R",
            fact="c",
            created_at=T0,
            valid_at=T0,
            invalid_at=T0,
            expired_at=T0,
        ),
    ]
    store.write(WriteBatch(puts=facts))
    graph, ids = store.entity_graph("g", make_scope(T0, ["g"]))
    assert ids == ["e0", "e1", "e2", "e3"]
    assert graph.ecount() == 1 and graph.es["weight"] == [2]  # both directions count; the ended fact weighs nothing
    assert len(graph.community_label_propagation(weights="weight")) >= 2


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
