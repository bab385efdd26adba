"""Snapshots that carry the in-memory indexes: loaded, not rebuilt, with the same answers; bad index sections
are caught; format-1 files still load."""

from __future__ import annotations

import hashlib
import os
import struct
from datetime import timedelta

import msgpack
import numpy as np
import pytest
from conftest import T0

from tkg import FactInput, FixedClock, HashEmbedder, Memory
from tkg.backends.memory import InMemoryStore
from tkg.backends.memory.persist import export_indexes
from tkg.errors import SnapshotFormatError
from tkg.models import Entity, Fact, Kind
from tkg.snapshot import MAGIC, TRAILER, open_snapshot, read, read_meta, save, write_v1
from tkg.storage import WriteBatch
from tkg.timeline import make_scope

EMB = HashEmbedder(dim=16)
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


def _store() -> InMemoryStore:
    """Enough records that both graphs and bm25 main indexes exist, plus a fresh tail, a replaced vector, a
    deleted record (a hole in the slots) and a superseded bm25 document."""
    store = InMemoryStore(dim=16, vector_tail=64)
    for index in store._texts.values():
        index._min_rebuild = 50
    entities = [
        Entity(
            id=f"e{i}", group_id="g", name=f"{WORDS[i % 8]} {i}", created_at=T0, name_embedding=EMB.embed([str(i)])[0]
        )
        for i in range(300)
    ]
    store.write(WriteBatch(puts=entities))
    facts = [
        Fact(
            id=f"f{i}",
            group_id="g",
            source_id=f"e{i % 300}",
            target_id=f"e{(i * 7) % 300}",
            relation="KNOWS",
            fact=f"{WORDS[i % 8]} knows {WORDS[(i * 3) % 8]} number {i}",
            created_at=T0 + timedelta(days=i % 30),
            valid_at=T0 - timedelta(days=i),
            invalid_at=None if i % 5 else T0,
            expired_at=None if i % 5 else T0 + timedelta(days=40),
            embedding=EMB.embed([f"fact {i}"])[0],
        )
        for i in range(400)
    ]
    store.write(WriteBatch(puts=facts))
    renamed = Entity(id="e3", group_id="g", name="zulu renamed", created_at=T0, name_embedding=EMB.embed(["z"])[0])
    store.write(WriteBatch(puts=[renamed], deletes=[(Kind.FACT, "f10")]))
    store.write(WriteBatch(puts=[Entity(id="late", group_id="g", name="late tail", created_at=T0)]))
    return store


QUERIES = ["alpha", "bravo knows", "zulu", "number 7", "late"]


def _answers(store: InMemoryStore) -> list[object]:
    scope = make_scope(T0 + timedelta(days=60), ["g"])
    out: list[object] = []
    for kind in (Kind.FACT, Kind.ENTITY):
        for q in QUERIES:
            out.append(store.text_search(kind, q, 20, scope))
            out.append(store.vector_search(kind, EMB.embed([q])[0], 20, scope))
    return out


def _same(a: list[object], b: list[object]) -> None:
    for x, y in zip(a, b, strict=True):
        assert [h.id for h in x] == [h.id for h in y]  # type: ignore[attr-defined]
        assert [h.score for h in x] == pytest.approx([h.score for h in y], abs=1e-5)  # type: ignore[attr-defined]


@pytest.mark.parametrize("flushed", [True, False], ids=["flushed", "with-tails"])
def test_index_carrying_snapshot_loads_indexes_and_answers_like_the_saved_store(tmp_path, flushed):
    store = _store()
    if flushed:  # fresh BM25 statistics: a rebuild from the records must then answer exactly the same
        store.flush()
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    loaded = InMemoryStore(dim=16)
    report = open_snapshot(path).restore_into(loaded)
    assert set(report["graphs"].values()) == {"loaded"} and set(report["text"].values()) == {"loaded"}
    expected = _answers(store)
    _same(_answers(loaded), expected)
    if flushed:
        _, contents = read(path)
        rebuilt = InMemoryStore(dim=16)
        rebuilt.load(contents)
        _same(_answers(rebuilt), expected)
    for kind in Kind:
        assert list(loaded.scan(kind)) == list(store.scan(kind)), kind
    # the loaded store keeps working: writes after the load land in the restored indexes
    # a direction no stored entity has (16-d hash embeddings of single tokens collide: "n" is "236")
    unique = np.arange(1, 17, dtype=np.float32)
    extra = Entity(id="new", group_id="g", name="alpha newcomer", created_at=T0, name_embedding=unique)
    loaded.write(WriteBatch(puts=[extra], deletes=[(Kind.ENTITY, "late")]))
    scope = make_scope(T0, ["g"])
    assert "new" in {h.id for h in loaded.text_search(Kind.ENTITY, "newcomer", 5, scope)}
    assert loaded.vector_search(Kind.ENTITY, unique, 1, scope)[0].id == "new"
    assert not loaded.text_search(Kind.ENTITY, "late tail", 5, scope)


def test_memory_round_trip_reports_loaded_indexes(tmp_path):
    memory = Memory(embedder=HashEmbedder(dim=16), clock=FixedClock("2024-05-01T00:00:00Z"))
    memory.add_facts([FactInput(f"P{i}", "WORKS_AT", f"Org{i % 7}") for i in range(600)], group_id="g")
    memory.save(tmp_path / "m.tkg")
    restored = InMemoryStore(dim=16)
    loaded = Memory.load(tmp_path / "m.tkg", embedder=HashEmbedder(dim=16), store=restored)
    assert set(restored.stats()["restored"]["graphs"].values()) == {"loaded"}
    found = loaded.search("P5 works", group_ids=["g"]).facts
    assert [f.record.id for f in found] == [f.record.id for f in memory.search("P5 works", group_ids=["g"]).facts]


def _rewrite_section(path, name, mutate) -> None:
    """Replace one section's bytes, with valid checksums, as a writer bug would; the file is reassembled."""
    data = path.read_bytes()
    table_offset, table_length, _ = TRAILER.unpack(data[-TRAILER.size :])
    table = msgpack.unpackb(data[table_offset : table_offset + table_length], raw=False)
    out = bytearray(data[: len(MAGIC) + 2])
    for section in table["sections"]:
        body = data[section["offset"] : section["offset"] + section["length"]]
        if section["name"] == name:
            body = mutate(body)
            section["sha256"] = hashlib.sha256(body).digest()
        section["offset"], section["length"] = len(out), len(body)
        out += body
    packed = msgpack.packb(table, use_bin_type=True)
    path.write_bytes(bytes(out) + packed + TRAILER.pack(len(out), len(packed), hashlib.sha256(packed).digest()))


def test_mismatched_index_sections_are_rebuilt_not_used(tmp_path):
    store = _store()
    store.flush()  # so that a rebuilt BM25 index has the same statistics as the saved one
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    expected = _answers(store)

    # a valid graph of other vectors (both of its sections replaced)
    other = InMemoryStore(dim=16, vector_tail=64)
    other.write(
        WriteBatch(
            puts=[
                Entity(id=f"x{i}", group_id="g", name=f"x{i}", created_at=T0, name_embedding=EMB.embed([f"x{i}"])[0])
                for i in range(301)
            ]
        )
    )
    other_sections = export_indexes(other).sections
    for name in ("hnsw/entity", "hnswdata/entity"):
        body = other_sections[name]
        _rewrite_section(path, name, lambda raw, body=body: body if isinstance(body, bytes) else body.tobytes())

    def shuffled_bm25(raw: bytes) -> bytes:
        state = msgpack.unpackb(raw, raw=False)
        slots = np.frombuffer(state["slots"]["data"], dtype=state["slots"]["dtype"]).copy()
        slots[0] = 10**6  # a slot no record has
        state["slots"]["data"] = slots.tobytes()
        return msgpack.packb(state, use_bin_type=True)  # type: ignore[no-any-return]

    _rewrite_section(path, "bm25/fact", shuffled_bm25)

    loaded = InMemoryStore(dim=16)
    report = open_snapshot(path).restore_into(loaded)
    assert report["graphs"]["entity"] == "rebuilt" and report["graphs"]["fact"] == "loaded"
    assert report["text"]["fact"] == "rebuilt" and report["text"]["entity"] == "loaded"
    _same(_answers(loaded), expected)


def test_implausible_slots_drop_every_index(tmp_path):
    store = _store()
    store.flush()
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    _rewrite_section(path, "slots/fact", lambda raw: raw[8:] + raw[:8])  # no longer increasing
    loaded = InMemoryStore(dim=16)
    report = open_snapshot(path).restore_into(loaded)
    assert set(report["graphs"].values()) == {"rebuilt"} and set(report["text"].values()) == {"rebuilt"}
    _same(_answers(loaded), _answers(store))


@pytest.mark.parametrize(
    "section", ["hnsw/fact", "hnswdata/fact", "scale/entity", "bm25/entity", "vectors/fact", "records/fact"]
)
def test_corrupt_section_raises_and_leaves_no_temp_files(tmp_path, section):
    store = _store()
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    data = bytearray(path.read_bytes())
    table_offset, table_length, _ = TRAILER.unpack(data[-TRAILER.size :])
    table = msgpack.unpackb(bytes(data[table_offset : table_offset + table_length]), raw=False)
    place = next(s for s in table["sections"] if s["name"] == section)
    data[place["offset"] + place["length"] // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotFormatError, match=f"checksum mismatch in section {section}"):
        read(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tkg"]


def test_format_1_snapshots_still_load(tmp_path):
    store = _store()
    store.flush()
    path = tmp_path / "old.tkg"
    write_v1(store, path, {"dim": 16, "embedder": EMB.name})
    assert path.read_bytes()[len(MAGIC) : len(MAGIC) + 2] == struct.pack(">H", 1)
    assert read_meta(path) == {"dim": 16, "embedder": EMB.name}  # format 1 has no table: read whole
    restored = InMemoryStore(dim=16)
    loaded = Memory.load(path, embedder=EMB, store=restored)
    assert restored.stats()["restored"]["format"] == 1
    for kind in Kind:
        assert list(loaded.records(kind)) == list(store.scan(kind)), kind
    _same(_answers(restored), _answers(store))


def test_records_share_one_copy_of_each_vector(tmp_path):
    store = _store()
    fact = store.get(Kind.FACT, ["f1"])[0]
    assert fact is not None and fact.embedding is not None
    assert not fact.embedding.flags.writeable and fact.embedding.base is not None  # a view of the index's rows
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    loaded = InMemoryStore(dim=16)
    open_snapshot(path).restore_into(loaded)
    f1, f2 = loaded.get(Kind.FACT, ["f1", "f2"])
    assert np.shares_memory(f1.embedding, f2.embedding.base)  # type: ignore[union-attr]


def _as_format_2(path, store: InMemoryStore) -> None:
    """Rewrite a format-3 file the way format 2 wrote it: hnswlib's own index file in ``hnsw/<kind>``, no
    ``scale`` or ``hnswdata`` sections, version 2 in the header."""
    data = path.read_bytes()
    table_offset, table_length, _ = TRAILER.unpack(data[-TRAILER.size :])
    table = msgpack.unpackb(data[table_offset : table_offset + table_length], raw=False)
    out = bytearray(MAGIC + struct.pack(">H", 2))
    sections = []
    for section in table["sections"]:
        part, kind = section["name"].split("/", 1)
        if part in ("scale", "hnswdata"):
            continue
        body = data[section["offset"] : section["offset"] + section["length"]]
        if part == "hnsw":
            graph_file = path.parent / f"{kind}.hnsw"
            assert store._vectors[Kind(kind)].save_graph(graph_file)
            body = graph_file.read_bytes()
            graph_file.unlink()
        sections.append({**section, "offset": len(out), "length": len(body), "sha256": hashlib.sha256(body).digest()})
        out += body
    table["sections"] = sections
    packed = msgpack.packb(table, use_bin_type=True)
    path.write_bytes(bytes(out) + packed + TRAILER.pack(len(out), len(packed), hashlib.sha256(packed).digest()))


@pytest.mark.parametrize("flushed", [True, False], ids=["flushed", "with-tails"])
def test_format_2_snapshots_still_load_their_indexes(tmp_path, flushed):
    store = _store()
    if flushed:
        store.flush()
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    _as_format_2(path, store)
    assert path.read_bytes()[len(MAGIC) : len(MAGIC) + 2] == struct.pack(">H", 2)
    loaded = InMemoryStore(dim=16)
    report = open_snapshot(path).restore_into(loaded)
    assert report["format"] == 2
    assert set(report["graphs"].values()) == {"loaded"} and set(report["text"].values()) == {"loaded"}
    _same(_answers(loaded), _answers(store))
    for kind in Kind:
        assert list(loaded.scan(kind)) == list(store.scan(kind)), kind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tkg"]  # the temporary graph files are gone


def test_format_3_graph_sections_are_smaller_than_hnswlib_files(tmp_path):
    store = _store()
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    size = path.stat().st_size
    _as_format_2(path, store)
    # each live vector is stored once (hnswlib's copy is cut out and recomputed on load)
    assert path.stat().st_size - size >= 4 * 16 * (300 + 399) * 0.75


def test_a_graph_whose_links_point_nowhere_is_rebuilt_not_followed(tmp_path):
    store = _store()
    store.flush()
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})

    def bad_link(raw: bytes) -> bytes:
        # element 0's level-0 link list: u32 count, then neighbour ids; point its first link past the graph
        data = bytearray(raw)
        count = max(1, struct.unpack_from("<I", data, 0)[0] & 0xFFFF)
        struct.pack_into("<II", data, 0, count, 10**6)
        return bytes(data)

    _rewrite_section(path, "hnswdata/entity", bad_link)
    loaded = InMemoryStore(dim=16)
    report = open_snapshot(path).restore_into(loaded)
    assert report["graphs"]["entity"] == "rebuilt" and report["graphs"]["fact"] == "loaded"
    _same(_answers(loaded), _answers(store))


def test_loaded_graph_holds_bit_identical_vectors_and_scores(tmp_path):
    store = _store()
    store.flush()
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    loaded = InMemoryStore(dim=16)
    open_snapshot(path).restore_into(loaded)
    for kind in (Kind.ENTITY, Kind.FACT):
        before, after = store._vectors[kind]._graph, loaded._vectors[kind]._graph
        assert before is not None and after is not None
        labels = np.asarray(sorted(before.get_ids_list()), dtype=np.int64)
        live = labels[store._vectors[kind]._in_graph.view()[labels]]
        assert np.array_equal(before.get_items(live, return_type="numpy"), after.get_items(live, return_type="numpy"))
    scope = make_scope(T0 + timedelta(days=60), ["g"])
    for q in QUERIES:
        vector = EMB.embed([q])[0]
        assert loaded.vector_search(Kind.FACT, vector, 10, scope) == store.vector_search(Kind.FACT, vector, 10, scope)


def test_implausible_saved_scales_are_recomputed_not_used(tmp_path):
    store = _store()
    store.flush()
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    _rewrite_section(path, "scale/fact", lambda raw: np.full(len(raw) // 4, 2.0, dtype="<f4").tobytes())
    loaded = InMemoryStore(dim=16)
    open_snapshot(path).restore_into(loaded)
    slots = np.flatnonzero(store._vectors[Kind.FACT].has_vec.view())
    assert np.allclose(loaded._vectors[Kind.FACT].scales(slots), store._vectors[Kind.FACT].scales(slots), rtol=1e-6)
    _same(_answers(loaded), _answers(store))


@pytest.mark.parametrize("positional", [True, False], ids=["preadv", "own-handle"])
def test_vectors_read_beside_the_records_whatever_the_os_offers(tmp_path, monkeypatch, positional):
    # The vectors sections are read on a helper thread: with os.preadv on the same open file, or (Windows, which
    # lacks it) through a handle of its own. Both give the saved store back, and both check the digest.
    if not positional:
        monkeypatch.delattr(os, "preadv", raising=False)
    store = _store()
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    loaded = InMemoryStore(dim=16)
    open_snapshot(path).restore_into(loaded)
    for kind in Kind:
        assert list(loaded.scan(kind)) == list(store.scan(kind)), kind
    _same(_answers(loaded), _answers(store))
    data = bytearray(path.read_bytes())
    table_offset, table_length, _ = TRAILER.unpack(data[-TRAILER.size :])
    table = msgpack.unpackb(bytes(data[table_offset : table_offset + table_length]), raw=False)
    place = next(s for s in table["sections"] if s["name"] == "vectors/entity")
    data[place["offset"] + place["length"] - 1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotFormatError, match="checksum mismatch in section vectors/entity"):
        read(path)
