"""Snapshots: exact round trips (property-based), atomic saves, and clear errors for bad files."""

from __future__ import annotations

import os
import struct
from datetime import timedelta

import pytest
from conftest import T0
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkg import FactInput, FixedClock, HashEmbedder, Memory, ScriptedLLM
from tkg.backends.memory import InMemoryStore
from tkg.errors import ConfigurationError, SnapshotError, SnapshotFormatError, SnapshotVersionError
from tkg.models import Community, Entity, Episode, Fact, Kind, Membership, Mention, Verdict
from tkg.snapshot import MAGIC, open_snapshot, read, read_meta, save
from tkg.storage import WriteBatch

EMB = HashEmbedder(dim=16)
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12).filter(str.strip)
days = st.integers(-3000, 3000).map(lambda d: T0 + timedelta(days=d, microseconds=d * 7 % 1_000_000))
maybe_days = st.none() | days
# Keys include the codecs' tags: a user's map that looks like a tagged value must come back as that map.
attribute_keys = st.text(max_size=5) | st.sampled_from(["__dt__", "__map__", "__float__", "__bytes__"])
attributes = st.dictionaries(
    attribute_keys,
    st.recursive(
        st.none() | st.integers(-5, 5) | st.text(max_size=5) | days | st.binary(max_size=4),
        lambda inner: st.lists(inner, max_size=2) | st.dictionaries(attribute_keys, inner, max_size=2),
        max_leaves=4,
    ),
    max_size=3,
)


@st.composite
def graphs(draw):
    n_entities = draw(st.integers(1, 8))
    groups = ["g", "h"]
    entities = []
    for i in range(n_entities):
        name = draw(names)
        entities.append(
            Entity(
                id=f"e{i}",
                group_id=groups[i % 2],
                name=name,
                created_at=draw(days),
                summary=draw(st.text(max_size=20)),
                labels=("Entity", *draw(st.lists(st.sampled_from(["Person", "Place"]), max_size=2, unique=True))),
                attributes=draw(attributes),
                aliases=tuple(draw(st.lists(names, max_size=2))),
                name_embedding=draw(st.none()) if i == 0 else EMB.embed([name])[0],
            )
        )
    episodes = [
        Episode(
            id=f"ep{i}",
            group_id=groups[i % 2],
            content=draw(names),
            source=draw(st.sampled_from(["message", "text", "json"])),
            reference_time=draw(days),
            created_at=draw(days),
            source_description=draw(st.text(max_size=8)),
            embedding=EMB.embed(["x"])[0],
        )
        for i in range(draw(st.integers(0, 3)))
    ]
    facts = []
    for i in range(draw(st.integers(0, 10))):
        a = draw(st.integers(0, n_entities - 1))
        same_group = [j for j in range(n_entities) if j % 2 == a % 2]
        b = draw(st.sampled_from(same_group))
        valid = draw(maybe_days)
        invalid = None if valid is None else draw(st.none() | st.just(valid + timedelta(days=draw(st.integers(0, 99)))))
        created = draw(days)
        expired = draw(st.none() | st.just(created + timedelta(hours=draw(st.integers(0, 99)))))
        text = draw(names)
        facts.append(
            Fact(
                id=f"f{i}",
                group_id=groups[a % 2],
                source_id=f"e{a}",
                target_id=f"e{b}",
                relation=draw(st.sampled_from(["KNOWS", "WORKS_AT", "R_2"])),
                fact=text,
                created_at=created,
                valid_at=valid,
                invalid_at=invalid,
                expired_at=expired,
                episodes=tuple(e.id for e in episodes if e.group_id == groups[a % 2]),
                attributes=draw(attributes),
                embedding=EMB.embed([text])[0],
                verdicts=(
                    {f"f{j}": draw(st.sampled_from(list(Verdict))) for j in range(i) if draw(st.booleans())}
                    if draw(st.integers(0, 3))
                    # a verdict on one fact whose id is a tag of the codec: the map is wrapped when written
                    else {draw(st.sampled_from(["__map__", "__dt__"])): draw(st.sampled_from(list(Verdict)))}
                ),
            )
        )
    mentions = [
        Mention(e.id, f"e{j}", e.group_id, T0)
        for e in episodes
        for j in range(n_entities)
        if groups[j % 2] == e.group_id
    ]
    community = Community(
        id="c1", group_id="g", name="core", created_at=T0, summary="s", name_embedding=EMB.embed(["core"])[0]
    )
    members = [Membership("c1", f"e{j}", "g", T0) for j in range(0, n_entities, 2)]
    return [*episodes, *entities, community, *facts, *mentions, *members]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=graphs())
def test_any_graph_survives_a_round_trip_exactly(tmp_path, records):
    store = InMemoryStore(dim=16)
    store.write(WriteBatch(puts=records))
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    meta, decoded = read(path)
    restored = InMemoryStore(dim=16)
    restored.load(decoded)
    assert meta == {"dim": 16}
    for kind in Kind:
        assert list(restored.scan(kind)) == list(store.scan(kind)), kind
    # Verdicts come back as Verdict members, not as their text (equal to it): code compares them by identity,
    # and a loaded "compatible" taken for a link made every fact of a hot entity one statement component.
    assert all(type(v) is Verdict for fact in restored.scan(Kind.FACT) for v in fact.verdicts.values())


def _memory(clock_start: str = "2024-05-01T00:00:00Z", store: InMemoryStore | None = None) -> Memory:
    return Memory(store, embedder=HashEmbedder(dim=16), clock=FixedClock(clock_start))


def _saved(tmp_path) -> tuple[Memory, os.PathLike[str]]:
    memory = _memory()
    memory.add_facts([FactInput("Alice", "WORKS_AT", "Acme"), FactInput("Bob", "LIVES_IN", "Paris")], group_id="g")
    path = tmp_path / "m.tkg"
    memory.save(path)
    return memory, path


def test_memory_save_load_round_trip_and_search(tmp_path):
    memory, path = _saved(tmp_path)
    loaded = Memory.load(path, embedder=HashEmbedder(dim=16), clock=FixedClock("2024-05-02T00:00:00Z"))
    assert loaded.stats()["records"] == memory.stats()["records"]
    assert loaded.search("Alice Acme", group_ids=["g"]).facts[0].record.fact == "Alice works at Acme"
    assert read_meta(path) == read(path)[0] and read_meta(path)["dim"] == 16  # from the table of contents alone


@pytest.mark.parametrize(
    ("mangle", "error"),
    [
        (lambda b: b[: len(b) // 2], SnapshotFormatError),  # truncated
        (lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]), SnapshotFormatError),  # corrupt payload
        (lambda b: b[:10], SnapshotFormatError),  # truncated header
        (lambda b: b"PK\x03\x04 a zip file, not ours" + b[30:], SnapshotFormatError),  # foreign
        (lambda b: b"", SnapshotFormatError),  # empty
        (lambda b: MAGIC + struct.pack(">H", 99) + b[len(MAGIC) + 2 :], SnapshotVersionError),  # newer format
    ],
)
def test_bad_files_raise_clear_errors_and_change_nothing(tmp_path, mangle, error):
    memory, path = _saved(tmp_path)
    bad = tmp_path / "bad.tkg"
    bad.write_bytes(mangle(path.read_bytes()))
    before = bad.read_bytes()
    with pytest.raises(error):
        Memory.load(bad, embedder=HashEmbedder(dim=16))
    with pytest.raises(error):
        read_meta(bad)
    assert bad.read_bytes() == before
    assert memory.search("Alice", group_ids=["g"]).facts  # the live memory is untouched


def test_missing_file_and_wrong_embedder(tmp_path):
    _, path = _saved(tmp_path)
    with pytest.raises(SnapshotError, match="does not exist"):
        Memory.load(tmp_path / "nope.tkg", embedder=HashEmbedder(dim=16))
    with pytest.raises(ConfigurationError, match="16-d"):
        Memory.load(path, embedder=HashEmbedder(dim=32))
    with pytest.raises(ConfigurationError, match="embedded with"):
        Memory.load(path, embedder=HashEmbedder(dim=16, trigrams=False))
    assert Memory.load(path, embedder=HashEmbedder(dim=16, trigrams=False), check_embedder=False)


def test_crash_during_save_keeps_previous_snapshot(tmp_path, monkeypatch):
    memory, path = _saved(tmp_path)
    before = path.read_bytes()
    memory.add_facts([FactInput("Carol", "KNOWS", "Dave")], group_id="g")

    def crash(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk on fire"):
        memory.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.tkg"]  # no temp file left behind


@pytest.mark.parametrize("value", [object(), 2**70], ids=["object", "int-over-64-bits"])
def test_unserialisable_attribute_fails_before_touching_the_file(tmp_path, value):
    store = InMemoryStore(dim=16)
    memory = _memory(store=store)
    memory.add_facts([FactInput("Alice", "WORKS_AT", "Acme")], group_id="g")
    path = tmp_path / "m.tkg"
    memory.save(path)
    before = path.read_bytes()
    entity = next(iter(memory.records(Kind.ENTITY)))
    import dataclasses

    store.write(WriteBatch(puts=[dataclasses.replace(entity, attributes={"x": value})]))
    with pytest.raises(SnapshotError):
        memory.save(path)
    assert path.read_bytes() == before


def test_llm_memory_snapshot_keeps_extraction(tmp_path):
    llm = ScriptedLLM(
        [
            {
                "entities": [{"name": "Max", "label": "Animal"}],
                "facts": [{"source": "Ann", "target": "Max", "relation": "OWNS", "fact": "Ann owns a dog named Max"}],
            }
        ]
    )
    memory = Memory(embedder=HashEmbedder(dim=16), llm=llm, clock=FixedClock("2024-05-01T00:00:00Z"))
    memory.add_episode("Ann: I adopted a dog named Max.", group_id="g")
    memory.save(tmp_path / "m.tkg")
    loaded = Memory.load(tmp_path / "m.tkg", embedder=HashEmbedder(dim=16))
    fact = loaded.search("dog", group_ids=["g"]).facts[0].record
    assert fact.fact == "Ann owns a dog named Max" and fact.episodes


# --------------------------------------------------------------------------------------------------------------
# the fast restore path (InMemoryStore.restore_snapshot) rebuilds exactly the state that writing the records built
def _internals(store: InMemoryStore) -> dict[str, object]:
    """Everything the in-memory store derives from its records, with codes replaced by what they stand for."""
    groups = {code: name for name, code in store._group_codes.items()}
    relations = {code: name for name, code in store._relation_codes.items()}
    out: dict[str, object] = {}
    for kind, table in store._tables.items():
        # trailing deleted slots are not restored (nothing refers to them)
        records = [table.record(slot) for slot in range(len(table.rows))]
        size = max((i + 1 for i, r in enumerate(records) if r is not None), default=0)
        out[f"{kind}.records"] = [None if r is None else r.id for r in records[:size]]
        out[f"{kind}.slot_of"] = {r.id: table.slot_of[r.id] for r in records if r is not None}  # live ones
        out[f"{kind}.live"] = table.live
        out[f"{kind}.alive"] = table.alive.view()[:size].tolist()
        alive = table.alive.view()[:size]
        out[f"{kind}.group"] = [
            groups[c] if a else None for c, a in zip(table.group.view()[:size].tolist(), alive, strict=True)
        ]
        for name in ("created", "valid", "invalid", "expired", "prior"):
            column = getattr(table, name).view()[:size]
            out[f"{kind}.{name}"] = [int(v) if a else None for v, a in zip(column, alive, strict=True)]
        if kind is Kind.FACT:
            out[f"{kind}.relation"] = [
                relations[c] if a else None for c, a in zip(table.relation.view()[:size], alive, strict=True)
            ]
        out[f"{kind}.labels"] = {
            label: sorted(int(s) for s in column.view()[:size].nonzero()[0] if alive[s])
            for label, column in table.labels.items()
            if column.view()[:size][alive].any()
        }
    for name in (
        "_adjacent",
        "_episode_facts",
        "_mentions_by_episode",
        "_mentions_by_entity",
        "_members_by_community",
        "_members_by_entity",
        "_names",
        "_timeline",
        "_group_counts",
    ):
        out[name] = dict(getattr(store, name).items())
    for kind, index in store._vectors.items():
        live = index.has_vec.view().nonzero()[0]
        out[f"{kind}.vectors"] = [(int(s), index._stored(s).tobytes(), float(index._scale[s])) for s in live]
    return out


def _times_are_utc(records: list) -> bool:  # type: ignore[type-arg]
    import dataclasses
    from datetime import UTC, datetime

    for record in records:
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if isinstance(value, datetime) and value.tzinfo is not UTC:
                return False
    return True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=graphs(), deleted=st.sets(st.integers(0, 9), max_size=4))
def test_restored_store_equals_the_saved_one_record_for_record_and_index_for_index(tmp_path, records, deleted):
    store = InMemoryStore(dim=16, vector_tail=4)  # small tail: some vectors in the HNSW graph, some not
    store.write(WriteBatch(puts=records))
    # holes in the slots, and a fact whose vector was replaced (its old one stays, deleted, in the graph)
    store.write(WriteBatch(deletes=[(Kind.FACT, f"f{i}") for i in deleted]))
    facts = list(store.scan(Kind.FACT))
    if facts:
        import dataclasses

        store.write(WriteBatch(puts=[dataclasses.replace(facts[0], embedding=EMB.embed(["changed"])[0])]))
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    restored = InMemoryStore(dim=16, vector_tail=4)
    report = open_snapshot(path).restore_into(restored)
    assert report["format"] == 3
    for kind in Kind:
        loaded = list(restored.scan(kind))
        assert loaded == list(store.scan(kind)), kind
        assert _times_are_utc(loaded)
        for a, b in zip(loaded, store.scan(kind), strict=True):
            for name in ("labels", "aliases", "episodes"):
                assert type(getattr(a, name, ())) is tuple and getattr(a, name, ()) == getattr(b, name, ())
            assert getattr(a, "attributes", None) == getattr(b, "attributes", None)
    assert _internals(restored) == _internals(store)


def test_loaded_memory_behaves_like_the_saved_one(tmp_path):
    from datetime import UTC, datetime

    stores = {"saved": InMemoryStore(dim=16), "loaded": InMemoryStore(dim=16)}
    memory = _memory(store=stores["saved"])
    memory.add_facts(
        [
            FactInput(f"Person {i}", "WORKS_AT", f"Org {i % 5}", valid_at=f"202{i % 4}-01-01T00:00:00Z")
            for i in range(40)
        ],
        group_id="g",
    )
    memory.add_facts([FactInput("Person 1", "WORKS_AT", "Org 9", valid_at="2024-02-01T00:00:00Z")], group_id="g")
    memory.add_facts([FactInput("Zed", "KNOWS", "Yan")], group_id="h")
    path = tmp_path / "m.tkg"
    memory.save(path)
    loaded = Memory.load(
        path, embedder=HashEmbedder(dim=16), clock=FixedClock("2024-05-01T00:00:00Z"), store=stores["loaded"]
    )
    queries = ["Person 1 works", "Org 3", "Zed knows"]
    points = [
        {},
        {"as_of": datetime(2022, 6, 1, tzinfo=UTC)},
        {"known_at": datetime(2024, 4, 30, tzinfo=UTC)},
        {"as_of": datetime(2021, 6, 1, tzinfo=UTC), "known_at": datetime(2024, 4, 30, tzinfo=UTC)},
    ]

    def answers(m: Memory) -> list[object]:
        out: list[object] = []
        for q in queries:
            for at in points:
                found = m.search(q, group_ids=["g", "h"], **at)  # type: ignore[arg-type]
                # by content, not id: the records written after the load get fresh random ids
                out.append([(f.record.fact, f.record.valid_at, f.score) for f in found.facts])
                out.append([(e.record.name, e.score) for e in found.entities])
        return out

    assert answers(loaded) == answers(memory)  # same hits, bit-identical scores
    # further writes and removals behave the same on both
    for m, store in ((memory, stores["saved"]), (loaded, stores["loaded"])):
        m.add_facts([FactInput("Person 2", "KNOWS", "Newcomer")], group_id="g")
        fact = m.search("Person 3 works", group_ids=["g"]).facts[0].record
        store.write(WriteBatch(deletes=[(Kind.FACT, fact.id)]))
    assert answers(loaded) == answers(memory)
    assert loaded.stats()["records"] == memory.stats()["records"]
