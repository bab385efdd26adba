"""Forgetting a whole group (a privacy request): everything of the group is erased on every backend, nothing of
the other groups changes, a durable memory stays erased after a reopen, and the group then reads as unknown."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from tkg import (
    FactInput,
    FixedClock,
    HashEmbedder,
    Kind,
    Memory,
    MemoryConfig,
    Ontology,
    RelationType,
    Store,
    UnknownGroupError,
)
from tkg.errors import ValidationError
from tkg.search_config import Method, SearchConfig, TargetConfig

EMB = HashEmbedder(dim=32)
HOMES = Ontology(relations={"LIVES_IN": RelationType(single_valued=True)})  # a new home ends the old one


def fill(memory: Memory, group: str) -> None:
    memory.add_facts(
        [
            FactInput("Ann", "LIVES_IN", "Oslo", valid_at="2020-01-01T00:00:00Z"),
            FactInput("Ann", "LIVES_IN", "Rome", valid_at="2022-01-01T00:00:00Z"),  # ends Oslo: history
            FactInput("Ann", "KNOWS", "Bob"),
            FactInput("Bob", "WORKS_AT", "Acme"),
        ],
        group_id=group,
    )
    memory.add_episode("Ann: Bob and I went hiking.", group_id=group, extract=False)
    memory.refresh_communities(group)


def everything(memory: Memory, group: str) -> dict[str, list[object]]:
    return {kind.value: sorted(memory.records(kind, [group]), key=lambda r: r.id) for kind in Kind}  # type: ignore[attr-defined]


def test_delete_group_erases_one_group_and_nothing_else(make_store: Callable[[int], Store]) -> None:
    memory = Memory(make_store(EMB.dim), embedder=EMB, clock=FixedClock("2025-01-01T00:00:00Z"), ontology=HOMES)
    fill(memory, "ann")
    fill(memory, "other")
    before = everything(memory, "other")
    held = {kind: len(records) for kind, records in everything(memory, "ann").items()}
    assert held["fact"] == 4 and held["community"] >= 1 and held["mention"] > 0

    erased = memory.delete_group("ann")

    assert erased == held  # every record of the group, counted by kind
    assert all(not records for records in everything(memory, "ann").values())
    assert "ann" not in memory.groups()
    assert everything(memory, "other") == before  # the other group, record for record
    found = memory.search("where does Ann live?", group_ids=["ann"])
    assert not (found.facts or found.entities or found.episodes or found.communities)
    assert memory.search("where does Ann live?", group_ids=["other"]).facts
    assert memory.delete_group("ann") == {kind.value: 0 for kind in Kind}  # erasing nothing is no error
    strict = memory.with_config(dataclasses.replace(memory.config, strict_groups=True))
    with pytest.raises(UnknownGroupError):
        strict.search("Ann", group_ids=["ann"])
    with pytest.raises(ValidationError):
        memory.delete_group("")
    fill(memory, "ann")  # the group can be used again, from nothing
    assert len(memory.get_all(["ann"])) == 3


def test_a_durable_memory_stays_erased_after_reopening_and_compaction(tmp_path: Path) -> None:
    path = tmp_path / "m.tkg"
    config = MemoryConfig()
    with Memory.open(path, embedder=EMB, config=config, ontology=HOMES) as memory:
        fill(memory, "ann")
        fill(memory, "other")
        memory.compact()  # the group is in the snapshot now
        memory.delete_group("ann")  # ... and its erasure in the journal
    with Memory.open(path, embedder=EMB, config=config, ontology=HOMES) as reopened:
        assert reopened.groups() == ["other"]
        reopened.compact()
    with Memory.open(path, embedder=EMB, config=config, ontology=HOMES) as again:
        assert again.groups() == ["other"] and len(again.get_all(["other"])) == 3


def _kept_and_erased(memory: Memory) -> None:
    memory.add_facts(
        [FactInput("Ann", "LIKES", f"Tea{i}", fact=f"Ann likes green tea {i}") for i in range(5)], group_id="keep"
    )
    secret = [FactInput("Bob", "HAS", f"Thing{i}", fact=f"Bob has xylodiagnosisq {i}") for i in range(5)]
    memory.add_facts(secret, group_id="erase")  # the highest slots of every kind


def test_an_erased_group_leaves_no_word_in_the_snapshot_and_search_works_after_reopening(tmp_path: Path) -> None:
    """After delete_group and a compaction, the snapshot's BM25 section held the erased texts' words (its main
    index kept their postings, marked stale), and a memory reopened from it failed every BM25 search (the stale
    positions lay past the tables a load sizes to the records it holds: ValueError, IndexError)."""
    path = tmp_path / "m.tkg"
    clock = FixedClock("2025-01-01T00:00:00Z")
    fresh = Memory(embedder=EMB, clock=clock)
    fresh.add_facts(
        [FactInput("Ann", "LIKES", f"Tea{i}", fact=f"Ann likes green tea {i}") for i in range(5)], group_id="keep"
    )
    expected = [(h.record.fact, h.score) for h in fresh.search("green tea", group_ids=["keep"]).facts]
    with Memory.open(path, embedder=EMB, clock=clock) as memory:
        _kept_and_erased(memory)
        memory.compact()  # the snapshot holds a built BM25 main index of both groups
    with Memory.open(path, embedder=EMB, clock=clock) as memory:
        memory.delete_group("erase")
        memory.compact()
    assert b"xylodiagnosisq" not in path.read_bytes()
    for _ in range(2):  # reopened, and reopened from a snapshot written by a reopened memory
        with Memory.open(path, embedder=EMB, clock=clock) as memory:
            assert [(h.record.fact, h.score) for h in memory.search("green tea", group_ids=["keep"]).facts] == expected
            words = SearchConfig(facts=TargetConfig(methods=(Method.BM25,)))
            assert memory.search("xylodiagnosisq", group_ids=["erase", "keep"], config=words).facts == []
            episodes = memory.search("Ann likes", group_ids=["keep"], targets=["episodes"])  # the other BM25 path
            assert all(e.record.group_id == "keep" for e in episodes.episodes)
            memory.compact()


def test_a_snapshot_written_with_stale_bm25_documents_still_loads_and_searches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file an earlier tkg wrote, its BM25 main index holding removed documents: a load drops them."""
    import tkg.backends.memory.text as text

    path = tmp_path / "m.tkg"
    clock = FixedClock("2025-01-01T00:00:00Z")
    with Memory.open(path, embedder=EMB, clock=clock) as memory:
        _kept_and_erased(memory)
        memory.compact()
        expected = [(h.record.fact, h.score) for h in memory.search("green tea", group_ids=["keep"]).facts]
    with monkeypatch.context() as patch:
        patch.setattr(text, "_current_only", lambda state: state)  # as exports were before
        with Memory.open(path, embedder=EMB, clock=clock) as memory:
            memory.delete_group("erase")
            memory.compact()
    assert b"xylodiagnosisq" in path.read_bytes()  # the old layout, stale postings kept
    with Memory.open(path, embedder=EMB, clock=clock) as memory:
        assert [(h.record.fact, h.score) for h in memory.search("green tea", group_ids=["keep"]).facts] == expected
        memory.compact()
    assert b"xylodiagnosisq" not in path.read_bytes()
