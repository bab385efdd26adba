"""Ending a fact by hand (Memory.invalidate_fact), on every backend: the fact stays, "as of" before the end finds
it, each change is recorded with the end it replaced, a restatement it covered holds again where the end uncovers
it, and bad requests change nothing."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tkg import FactInput, FixedClock, HashEmbedder, Kind, Memory, Ontology, RelationType, Store
from tkg.errors import NotFoundError, ValidationError
from tkg.invalidation import ENDED_BY_HAND

EMB = HashEmbedder(dim=32)
HOMES = Ontology(relations={"LIVES_IN": RelationType(single_valued=True)})


def t(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def current(memory: Memory, **view: object) -> set[str]:
    return {f.fact for f in memory.get_all("g", **view)}  # type: ignore[arg-type]


def snapshot(memory: Memory) -> list[str]:
    fields = ("id", "fact", "valid_at", "invalid_at", "expired_at", "invalidated_by", "prior_invalid_at", "attributes")
    return sorted(repr([getattr(f, name) for name in fields]) for f in memory.records(Kind.FACT, "g"))


@pytest.fixture
def setup(make_store: Callable[[int], Store]) -> tuple[Memory, FixedClock]:
    clock = FixedClock("2024-01-01T00:00:00Z")
    memory = Memory(make_store(EMB.dim), embedder=EMB, clock=clock, ontology=HOMES)
    memory.add_facts(
        [
            FactInput("Ann", "WORKS_AT", "Acme", valid_at="2020-01-01T00:00:00Z"),
            FactInput("Ann", "LIVES_IN", "Oslo", valid_at="2019-01-01T00:00:00Z"),
            FactInput("Ann", "LIVES_IN", "Rome", valid_at="2021-01-01T00:00:00Z"),
        ],
        group_id="g",
    )
    clock.set("2024-06-01T00:00:00Z")
    return memory, clock


def test_an_ended_fact_keeps_its_history(setup: tuple[Memory, FixedClock]) -> None:
    memory, clock = setup
    acme = next(f for f in memory.get_all("g") if f.relation == "WORKS_AT")
    ended = memory.invalidate_fact(acme.id, at="2023-03-01T00:00:00Z")
    assert ended.id == acme.id and ended.invalid_at == t("2023-03-01") and ended.valid_at == acme.valid_at
    assert ended.attributes[ENDED_BY_HAND] == [
        {"at": "2023-03-01T00:00:00+00:00", "recorded_at": "2024-06-01T00:00:00+00:00", "previous_end": None}
    ]
    assert "Ann works at Acme" not in current(memory)
    assert "Ann works at Acme" in current(memory, as_of="2022-01-01T00:00:00Z")
    assert "Ann works at Acme" not in current(memory, as_of="2023-06-01T00:00:00Z")
    assert "Ann works at Acme" in current(memory, include_invalidated=True)
    assert len(memory.records(Kind.FACT, "g")) == 3  # nothing deleted

    # a second, earlier end is a second entry, naming the end it replaced
    clock.set("2024-07-01T00:00:00Z")
    memory.invalidate_fact(acme.id, at="2022-06-01T00:00:00Z", note={"why": "user correction"})
    assert "Ann works at Acme" not in current(memory, as_of="2023-01-01T00:00:00Z")
    assert "Ann works at Acme" in current(memory, as_of="2022-01-01T00:00:00Z")
    entries = memory.get(Kind.FACT, acme.id).attributes[ENDED_BY_HAND]  # type: ignore[union-attr]
    assert [(e["previous_end"], e.get("note")) for e in entries] == [
        (None, None),
        ("2023-03-01T00:00:00+00:00", {"why": "user correction"}),
    ]

    # Transaction time: a view known before an end was recorded does not know it yet -- the fact ends where it
    # ended then (open before 2024-06, 2023-03 until 2024-07), in a scan, in search and in the fact shown.
    def known(at: str, as_of: str) -> tuple[bool, bool]:
        listed = "Ann works at Acme" in current(memory, as_of=as_of, known_at=at)
        found = memory.search("Ann works at Acme", group_ids="g", as_of=as_of, known_at=at, targets=["facts"])
        return listed, "Ann works at Acme" in {s.record.fact for s in found.facts}

    assert known("2024-05-01T00:00:00Z", as_of="2024-01-01T00:00:00Z") == (True, True)
    assert known("2024-06-15T00:00:00Z", as_of="2023-01-01T00:00:00Z") == (True, True)
    assert known("2024-06-15T00:00:00Z", as_of="2023-06-01T00:00:00Z") == (False, False)
    assert known("2024-07-15T00:00:00Z", as_of="2023-01-01T00:00:00Z") == (False, False)
    shown = memory.facts_about(acme.source_id, include_invalidated=True, known_at="2024-06-15T00:00:00Z")
    then = next(f for f in shown if f.id == acme.id)
    assert then.invalid_at == t("2023-03-01") and len(then.attributes[ENDED_BY_HAND]) == 1


def test_a_restatement_after_the_end_holds_again(setup: tuple[Memory, FixedClock]) -> None:
    """Ann knows Bob from 2020, said again from 2022 (a restatement: kept, superseded by the first). Ended by hand
    in 2021, the first no longer covers 2022: the restatement holds from then. A contradiction already learnt is
    not undone: ending Rome does not mean Ann lives in Oslo again."""
    memory, clock = setup
    memory.add_facts([FactInput("Ann", "KNOWS", "Bob", valid_at="2020-01-01T00:00:00Z")], group_id="g")
    memory.add_facts([FactInput("Ann", "KNOWS", "Bob", valid_at="2022-01-01T00:00:00Z")], group_id="g")
    knows = sorted((f for f in memory.records(Kind.FACT, "g") if f.relation == "KNOWS"), key=lambda f: f.valid_at)
    assert [f.invalidated_by for f in knows] == [None, knows[0].id]  # type: ignore[union-attr]
    clock.set("2024-07-01T00:00:00Z")
    memory.invalidate_fact(knows[0].id, at="2021-01-01T00:00:00Z")
    assert "Ann knows Bob" in current(memory)
    assert "Ann knows Bob" not in current(memory, as_of="2021-06-01T00:00:00Z")
    assert "Ann knows Bob" in current(memory, as_of="2020-06-01T00:00:00Z")
    again = memory.get(Kind.FACT, knows[1].id)
    assert again.invalidated_by is None and again.valid_at == t("2022-01-01")  # type: ignore[union-attr]

    rome = next(f for f in memory.get_all("g") if f.fact == "Ann lives in Rome")
    memory.invalidate_fact(rome.id, at="2023-01-01T00:00:00Z")
    assert not {"Ann lives in Rome", "Ann lives in Oslo"} & current(memory)
    assert "Ann lives in Rome" in current(memory, as_of="2022-06-01T00:00:00Z")


def test_bad_requests_change_nothing(setup: tuple[Memory, FixedClock], tmp_path: Path) -> None:
    memory, _ = setup
    acme = next(f for f in memory.get_all("g") if f.relation == "WORKS_AT")
    before = snapshot(memory)
    with pytest.raises(NotFoundError):
        memory.invalidate_fact("no-such-fact")
    with pytest.raises(ValidationError, match="it holds from 2020-01-01"):
        memory.invalidate_fact(acme.id, at="2019-01-01T00:00:00Z")
    with pytest.raises(ValidationError, match=r"naive|offset"):
        memory.invalidate_fact(acme.id, at="2023-01-01T00:00:00")
    memory.invalidate_fact(acme.id, at="2023-01-01T00:00:00Z")
    after = snapshot(memory)
    with pytest.raises(ValidationError, match="already ends at 2023-01-01"):
        memory.invalidate_fact(acme.id, at="2023-06-01T00:00:00Z")
    assert snapshot(memory) == after != before


def test_the_end_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "m.tkg"
    clock = FixedClock("2024-01-01T00:00:00Z")
    with Memory.open(path, embedder=EMB, clock=clock, create=True) as memory:
        fact = memory.add_facts([FactInput("Ann", "WORKS_AT", "Acme")], group_id="g").facts[0]
        clock.set("2024-02-01T00:00:00Z")
        memory.invalidate_fact(fact.id)
    reopened = Memory.open(path, embedder=EMB, clock=clock)
    assert reopened.get_all("g") == []
    assert [f.invalid_at for f in reopened.get_all("g", include_invalidated=True)] == [t("2024-02-01")]
    assert current(reopened, as_of="2024-01-15T00:00:00Z") == {"Ann works at Acme"}
    reopened.close()
