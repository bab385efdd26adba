"""Property-based tests of the invalidation invariants: a stateful machine over random add / add_facts / remove /
end-by-hand sequences driven by the rule-based LLM double, and batching against sequential ingestion."""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from helpers_truth import held, settling_last_checked
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import tkg.models
from tkg import FixedClock, HashEmbedder, Kind, Memory, MemoryConfig
from tkg.errors import ValidationError
from tkg.invalidation import overlaps, own_end
from tkg.llm import LLMPolicy
from tkg.llm.rules import RulesLLM
from tkg.memory import FactInput
from tkg.models import Entity, Episode, Fact, Mention
from tkg.ontology import Ontology, RelationType

PEOPLE = ["Alice", "Bob", "Carol"]
PLACES = ["Paris", "Rome", "Oslo", "Acme", "Jazz"]
RELATIONS = ["LIVES_IN", "WORKS_AT", "LIKES"]
SINGLE = {"LIVES_IN", "WORKS_AT"}
ONTOLOGY = Ontology(relations={r: RelationType(single_valued=True) for r in SINGLE})

statements = st.tuples(
    st.sampled_from(PEOPLE),
    st.sampled_from(RELATIONS),
    st.sampled_from(PLACES),
    st.integers(2010, 2024),
    st.one_of(st.none(), st.integers(0, 4)),  # years until it ended (None: still holds)
)
Statement = tuple[str, str, str, int, int | None]


@pytest.fixture(autouse=True, scope="module")
def _settling_last_as_the_whole_component() -> Iterator[list[str]]:
    """A new fact settled from the statements it contradicts alone changes what settling its whole component
    would (checked on every one, in every test here)."""
    with settling_last_checked() as taken:
        yield taken


def new_memory() -> Memory:
    return Memory(
        embedder=HashEmbedder(dim=32),
        llm=RulesLLM(exclusive=SINGLE),
        clock=FixedClock(datetime(2025, 1, 1, tzinfo=UTC), tick=timedelta(minutes=1)),
        config=MemoryConfig(llm_policy=LLMPolicy(backoff_initial=0.0)),
        ontology=ONTOLOGY,
    )


def message(statement: Statement) -> str:
    who, rel, what, year, span = statement
    until = "" if span is None else f" until {year + span}"
    return f"{who}: I {rel} {what} since {year}{until}."


def state(memory: Memory) -> dict[str, dict[str, Any]]:
    """Every record by kind and id: the graph (communities are derived and refreshed, not reverted). A fact's
    ``expired_at`` is transaction bookkeeping: when a removal undoes a change of supersession it is learnt again,
    so only whether it is set counts."""
    return {
        kind.value: {
            r.id: dataclasses.replace(r, expired_at=r.created_at) if isinstance(r, Fact) and r.expired_at else r
            for r in memory.records(kind)
        }
        for kind in Kind
        if kind not in (Kind.COMMUNITY, Kind.MEMBERSHIP)
    }


class _CountedIds:
    """Stands for the ``uuid`` module in :mod:`tkg.models`: ids in creation order, so that a run the machine
    replays (its picks order facts by id) does what it did."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(int=next(self._next))


class TruthMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self._ids = mock.patch.object(tkg.models, "uuid", _CountedIds())
        self._ids.start()
        self.memory = new_memory()
        self.ever: set[str] = set()
        self.removed_facts: set[str] = set()
        #: Views of past transaction times: (a time, every fact as the memory held it then).
        self.views: list[tuple[datetime, dict[str, tuple[Any, ...]]]] = []

    def _record(self) -> None:
        self.ever |= {f.id for f in self.memory.records(Kind.FACT)}
        self.views.append((self.memory.clock.now(), held(self.memory)))

    @rule(statement=statements)
    def add_episode(self, statement: Statement) -> None:
        result = self.memory.add_episode(message(statement), group_id="g")
        assert result.usage.calls <= 2
        self._record()

    @rule(batch=st.lists(statements, min_size=1, max_size=3))
    def add_facts(self, batch: list[Statement]) -> None:
        self.memory.add_facts(
            [
                FactInput(
                    w,
                    r,
                    o,
                    valid_at=datetime(y, 1, 1, tzinfo=UTC),
                    invalid_at=None if span is None else datetime(y + span, 1, 1, tzinfo=UTC),
                )
                for w, r, o, y, span in batch
            ],
            group_id="g",
        )
        self._record()

    @rule(pick=st.integers(0, 1000))
    def remove(self, pick: int) -> None:
        episodes = [e.id for e in sorted(self.memory.records(Kind.EPISODE), key=lambda e: e.created_at)]
        if not episodes:
            return
        episode = self.memory.get(Kind.EPISODE, episodes[pick % len(episodes)])
        facts = {f.id: f for f in self.memory.records(Kind.FACT) if isinstance(f, Fact)}
        result = self.memory.remove_episode(episode.id)
        self.removed_facts |= set(result.deleted_facts)
        # As if never added: what the memory held before it, and before the facts it took away, stands.
        cut = min([episode.created_at, *(facts[i].created_at for i in result.deleted_facts)])
        self.views = [(at, then) for at, then in self.views if at < cut]

    @rule(pick=st.integers(0, 1000), months=st.integers(0, 60))
    def end_by_hand(self, pick: int, months: int) -> None:
        """End a random fact by hand some months after it starts; refused (and nothing written) when it already
        ends by then."""
        facts = sorted((f for f in self.memory.records(Kind.FACT) if isinstance(f, Fact)), key=lambda f: f.id)
        if not facts:
            return
        fact = facts[pick % len(facts)]
        at = (fact.valid_at or datetime(2010, 1, 1, tzinfo=UTC)) + timedelta(days=30 * months)
        before = state(self.memory)
        try:
            ended = self.memory.invalidate_fact(fact.id, at=at)
        except ValidationError:
            assert state(self.memory) == before
            return
        assert own_end(ended) == at
        self.views.append((self.memory.clock.now(), held(self.memory)))

    @rule(statement=statements)
    def add_then_remove_restores_the_graph(self, statement: Statement) -> None:
        before = state(self.memory)
        added = self.memory.add_episode(message(statement), group_id="g")
        self.memory.remove_episode(added.episode.id)
        assert state(self.memory) == before

    def teardown(self) -> None:
        if hasattr(self, "_ids"):
            self._ids.stop()

    @invariant()
    def a_view_of_a_past_time_shows_what_the_memory_held_then(self) -> None:
        for at, then in self.views:
            assert held(self.memory, at) == then, at

    @invariant()
    def time_intervals_are_ordered(self) -> None:
        for fact in self.memory.records(Kind.FACT):
            assert isinstance(fact, Fact)
            if fact.valid_at is not None and fact.invalid_at is not None:
                assert fact.invalid_at >= fact.valid_at, fact

    @invariant()
    def expired_exactly_when_superseded(self) -> None:
        for fact in self.memory.records(Kind.FACT):
            assert isinstance(fact, Fact)
            assert (fact.expired_at is None) == (fact.invalidated_by is None), fact
            if fact.expired_at is not None:
                assert fact.expired_at >= fact.created_at
                assert fact.invalid_at is not None
                # superseding only ever shortens a fact, never extends it past its own end
                assert fact.prior_invalid_at is None or fact.invalid_at <= fact.prior_invalid_at, fact

    @invariant()
    def single_valued_relations_hold_one_object_at_a_time(self) -> None:
        live = [f for f in self.memory.records(Kind.FACT) if isinstance(f, Fact) and f.expired_at is None]
        for i, a in enumerate(live):
            for b in live[i + 1 :]:
                if a.relation in SINGLE and a.relation == b.relation and a.source_id == b.source_id:
                    assert a.target_id == b.target_id or not overlaps(a, b), (a, b)

    @invariant()
    def nothing_is_deleted_except_by_remove_episode(self) -> None:
        present = {f.id for f in self.memory.records(Kind.FACT)}
        assert self.ever - self.removed_facts <= present

    @invariant()
    def provenance_and_mentions_point_to_existing_records(self) -> None:
        episodes = {e.id for e in self.memory.records(Kind.EPISODE) if isinstance(e, Episode)}
        entities = {e.id for e in self.memory.records(Kind.ENTITY) if isinstance(e, Entity)}
        for fact in self.memory.records(Kind.FACT):
            assert isinstance(fact, Fact)
            assert fact.episodes and set(fact.episodes) <= episodes
            assert {fact.source_id, fact.target_id} <= entities
        for mention in (m for e in sorted(episodes) for m in self.memory.episode_mentions(e)):
            assert isinstance(mention, Mention) and mention.entity_id in entities


TruthMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=12, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestTruthMachine = TruthMachine.TestCase


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(st.tuples(st.sampled_from(["g", "h"]), statements), min_size=1, max_size=8))
def test_batching_does_not_change_the_result(batch: list[tuple[str, Statement]]) -> None:
    items = [{"content": message(s), "group_id": g} for g, s in batch]
    bulk, sequential = new_memory(), new_memory()
    bulk.add_episodes(items)
    for item in items:
        sequential.add_episode(**item)

    def canon(memory: Memory) -> list[tuple[Any, ...]]:
        names = {e.id: (e.group_id, e.name) for e in memory.records(Kind.ENTITY) if isinstance(e, Entity)}

        def when(t: datetime | None) -> str:
            return "-" if t is None else t.isoformat()

        return sorted(
            (
                names[f.source_id],
                f.relation,
                names[f.target_id],
                when(f.valid_at),
                when(f.invalid_at),
                when(f.expired_at),
                len(f.episodes),
            )
            for f in memory.records(Kind.FACT)
            if isinstance(f, Fact)
        )

    assert canon(bulk) == canon(sequential)
    assert bulk.usage.calls == sequential.usage.calls
