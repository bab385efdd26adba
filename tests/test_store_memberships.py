"""Conformance of ``Store.memberships``: what every backend must answer (run against each, see conftest.py)."""

from __future__ import annotations

from conftest import T0

from tkg.embedders import HashEmbedder
from tkg.models import Community, Entity, Kind, Membership
from tkg.storage import WriteBatch

EMB = HashEmbedder(dim=16)


def _records() -> list:
    entities = [Entity(id=f"e{i}", group_id="g", name=f"Entity {i}", created_at=T0) for i in range(4)]
    communities = [
        Community(id=f"c{i}", group_id="g", name=f"Community {i}", created_at=T0, name_embedding=EMB.embed(["c"])[0])
        for i in range(2)
    ]
    members = [
        Membership(community_id="c0", entity_id="e0", group_id="g", created_at=T0),
        Membership(community_id="c0", entity_id="e1", group_id="g", created_at=T0),
        Membership(community_id="c1", entity_id="e2", group_id="g", created_at=T0),
    ]
    return [*entities, *communities, *members]


def ids(found: list[Membership]) -> list[str]:
    return [m.id for m in found]


def test_memberships_by_community_and_entity(make_store) -> None:
    store = make_store(16)
    store.write(WriteBatch(puts=_records()))
    assert ids(store.memberships()) == ["c0>e0", "c0>e1", "c1>e2"]
    assert ids(store.memberships(community_ids=["c0"])) == ["c0>e0", "c0>e1"]
    assert ids(store.memberships(entity_ids=["e2", "e1", "e3"])) == ["c0>e1", "c1>e2"]
    assert ids(store.memberships(community_ids=["c0"], entity_ids=["e1", "e2"])) == ["c0>e1"]
    assert store.memberships(community_ids=["missing"]) == []
    assert store.memberships(entity_ids=[]) == []


def test_memberships_follow_puts_and_deletes(make_store) -> None:
    store = make_store(16)
    store.write(WriteBatch(puts=_records()))
    # Move e1 from c0 to c1 and drop c0's last member, atomically.
    store.write(
        WriteBatch(
            puts=[Membership(community_id="c1", entity_id="e1", group_id="g", created_at=T0)],
            deletes=[(Kind.MEMBERSHIP, "c0>e1"), (Kind.MEMBERSHIP, "c0>e0"), (Kind.COMMUNITY, "c0")],
        )
    )
    assert ids(store.memberships(community_ids=["c0"])) == []
    assert ids(store.memberships(community_ids=["c1"])) == ["c1>e2", "c1>e1"]
    assert ids(store.memberships(entity_ids=["e1"])) == ["c1>e1"]
    # Putting the same membership again replaces it; it stays listed once.
    store.write(WriteBatch(puts=[Membership(community_id="c1", entity_id="e1", group_id="g", created_at=T0)]))
    assert ids(store.memberships(entity_ids=["e1"])) == ["c1>e1"]
