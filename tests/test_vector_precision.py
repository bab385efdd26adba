"""``InMemoryStore(vector_precision="bfloat16")``: the rounding itself, what a store of that precision keeps and
returns, its snapshots (to and from float32 stores), and what it saves. That it answers like the reference store on
vectors it keeps exactly is in tests/test_store_oracle.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
from conftest import T0
from hypothesis import given
from hypothesis import strategies as st

from tkg import FactInput, FixedClock, HashEmbedder, Memory
from tkg.backends.memory import InMemoryStore
from tkg.backends.memory.precision import BFLOAT16, FLOAT32, from_bfloat16, to_bfloat16
from tkg.errors import ValidationError
from tkg.models import Entity, Kind
from tkg.snapshot import open_snapshot, save
from tkg.storage import WriteBatch
from tkg.timeline import make_scope


def test_bfloat16_rounds_to_nearest_with_ties_to_even_and_stays_finite():
    step = 2.0**-7  # bfloat16's spacing in [1, 2)
    values = np.array(
        [1.0, -2.5, 0.0, 1 + step / 2, 1 + 3 * step / 2, 1 + step / 2 + 2**-20, 3.4e38, -3.4e38, 1e-40],
        dtype=np.float32,
    )
    got = from_bfloat16(to_bfloat16(values))
    assert got.dtype == np.float32
    assert got[:3].tolist() == [1.0, -2.5, 0.0]
    assert got[3] == 1.0  # a tie goes to the even mantissa
    assert got[4] == 1 + 2 * step  # ... here upward
    assert got[5] == 1 + step  # past the tie: nearest
    assert np.isfinite(got[6:8]).all() and got[6] == -got[7] and abs(got[6] - 3.4e38) / 3.4e38 < 2**-7
    assert got[8] > 0 and abs(float(got[8]) - 1e-40) <= 2.0**-134  # a subnormal: within half its step, 2^-133


@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=64))
def test_bfloat16_keeps_every_finite_float32_within_half_a_step(xs):
    values = np.array(xs, dtype=np.float32)
    rounded = BFLOAT16.round(values)
    assert np.isfinite(rounded).all()
    normal = np.abs(values) >= np.finfo(np.float32).tiny
    error = np.abs(rounded[normal].astype(np.float64) - values[normal]) / np.abs(values[normal])
    assert (error <= 2.0**-8).all()  # half a step of 7 mantissa bits; more only where it would overflow
    assert np.array_equal(BFLOAT16.round(rounded), rounded)  # rounded values are kept exactly
    assert np.array_equal(FLOAT32.round(values), values)


def _vectors(n: int, dim: int = 16) -> np.ndarray:
    return np.random.default_rng(7).standard_normal((n, dim)).astype(np.float32)


def _entities(n: int, dim: int = 16) -> list[Entity]:
    return [
        Entity(id=f"e{i}", group_id="g", name=f"name {i}", created_at=T0, name_embedding=vector)
        for i, vector in enumerate(_vectors(n, dim))
    ]


def test_a_bfloat16_store_keeps_rounded_vectors_and_scores_with_them():
    store = InMemoryStore(dim=16, vector_tail=8, vector_precision="bfloat16")
    assert store.vector_precision == "bfloat16"
    entities = _entities(60)  # past the tail: the HNSW graph answers too
    store.write(WriteBatch(puts=entities))
    store.flush()
    got = store.get(Kind.ENTITY, [e.id for e in entities])
    for written, read in zip(entities, got, strict=True):
        vector = read.name_embedding
        assert vector.dtype == np.float32 and not vector.flags.writeable
        assert np.array_equal(vector, BFLOAT16.round(written.name_embedding))
        assert not np.array_equal(vector, written.name_embedding)  # random floats need more bits
    query = entities[7].name_embedding
    hits = store.vector_search(Kind.ENTITY, query, 5, make_scope(T0 + timedelta(days=1), ["g"]))
    rounded = {r.id: r.name_embedding.astype(np.float64) for r in got}
    exact = {i: float(v @ query / np.linalg.norm(v) / np.linalg.norm(query)) for i, v in rounded.items()}
    assert hits[0].id == "e7"
    assert [h.score for h in hits] == pytest.approx([exact[h.id] for h in hits], abs=1e-5)
    assert [h.id for h in hits] == sorted(exact, key=lambda i: (-exact[i], i))[:5]


def test_rewriting_a_record_with_the_vector_it_read_back_adds_no_row():
    store = InMemoryStore(dim=16, vector_precision="bfloat16")
    store.write(WriteBatch(puts=_entities(10)))
    index = store._vectors[Kind.ENTITY]
    rows = index._fill  # rows used in the index's last matrix chunk
    again = [replace(e, summary="seen again") for e in store.get(Kind.ENTITY, [f"e{i}" for i in range(10)])]
    store.write(WriteBatch(puts=again))
    assert index._fill == rows
    store.write(WriteBatch(puts=[replace(again[0], name_embedding=-again[0].name_embedding)]))
    assert index._fill == rows + 1


def test_a_bfloat16_store_holds_half_the_vector_bytes():
    stores = {p: InMemoryStore(dim=384, vector_precision=p) for p in ("float32", "bfloat16")}
    entities = _entities(100, dim=384)
    for store in stores.values():
        store.write(WriteBatch(puts=entities))
    full, half = (stores[p].memory_breakdown()["vectors"] for p in ("float32", "bfloat16"))
    assert half < 0.6 * full


@pytest.mark.parametrize("saved, loaded", [("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float32", "bfloat16")])
def test_snapshots_move_between_precisions(tmp_path, saved, loaded):
    store = InMemoryStore(dim=16, vector_tail=8, vector_precision=saved)
    store.write(WriteBatch(puts=_entities(80)))
    store.write(WriteBatch(puts=[Entity(id="bare", group_id="g", name="no vector", created_at=T0)]))
    store.write(WriteBatch(puts=_entities(82)[80:]))  # after a record without a vector
    path = tmp_path / "m.tkg"
    save(store, path, {"dim": 16})
    restored = InMemoryStore(dim=16, vector_precision=loaded)
    report = open_snapshot(path).restore_into(restored)
    assert set(report["graphs"].values()) == {"loaded"}
    ids = [*(f"e{i}" for i in range(82)), "bare"]
    originals = store.get(Kind.ENTITY, ids)
    for before, after in zip(originals, restored.get(Kind.ENTITY, ids), strict=True):
        # bfloat16 values survive any trip; float32 ones are rounded by a bfloat16 store
        if before.name_embedding is None:
            assert after.name_embedding is None
            continue
        expected = BFLOAT16.round(before.name_embedding) if loaded == "bfloat16" else before.name_embedding
        assert np.array_equal(after.name_embedding, expected)
    scope = make_scope(T0 + timedelta(days=1), ["g"])
    for i in (3, 41, 79, 81):
        hits = restored.vector_search(Kind.ENTITY, originals[i].name_embedding, 3, scope)
        assert hits[0].id == f"e{i}"
    # the loaded store keeps working: a new vector lands in the restored index, rounded as the store keeps it
    extra = Entity(id="new", group_id="g", name="new", created_at=T0, name_embedding=np.arange(1, 17, dtype=np.float32))
    restored.write(WriteBatch(puts=[extra]))
    assert restored.vector_search(Kind.ENTITY, extra.name_embedding, 1, scope)[0].id == "new"


def test_a_memory_on_a_bfloat16_store_round_trips(tmp_path):
    memory = Memory(
        InMemoryStore(dim=16, vector_precision="bfloat16"),
        embedder=HashEmbedder(dim=16),
        clock=FixedClock("2024-05-01T00:00:00Z"),
    )
    memory.add_facts([FactInput(f"P{i}", "WORKS_AT", f"Org{i % 7}") for i in range(300)], group_id="g")
    memory.save(tmp_path / "m.tkg")
    loaded = Memory.load(
        tmp_path / "m.tkg", embedder=HashEmbedder(dim=16), store=InMemoryStore(dim=16, vector_precision="bfloat16")
    )
    before = memory.search("P5 works", group_ids=["g"]).facts
    after = loaded.search("P5 works", group_ids=["g"]).facts
    assert [f.record.id for f in after] == [f.record.id for f in before] and before


@pytest.mark.parametrize("bad", ["float16", "", None, 16])
def test_an_unknown_precision_is_refused(bad):
    with pytest.raises(ValidationError, match="vector_precision"):
        InMemoryStore(dim=4, vector_precision=bad)
