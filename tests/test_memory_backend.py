"""In-memory backend specifics beyond the Store protocol: index maintenance at scale."""

from __future__ import annotations

from conftest import T0

from tkg.backends.memory import InMemoryStore
from tkg.embedders import HashEmbedder
from tkg.models import Entity, Kind
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
