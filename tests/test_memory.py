"""The thin slice end to end through Memory, and bad input that must leave memory unchanged."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tkg import (
    EmbeddingError,
    EpisodeError,
    EpisodeStatus,
    ExtractionFailedError,
    FactInput,
    FixedClock,
    HashEmbedder,
    Kind,
    LLMError,
    LLMPolicy,
    Memory,
    MemoryConfig,
    RulesLLM,
    ScriptedLLM,
    SnapshotError,
    TimestampError,
    UnknownGroupError,
    ValidationError,
)
from tkg.errors import ConfigurationError
from tkg.llm.base import Prompt
from tkg.models import Verdict
from tkg.ontology import Ontology, RelationType
from tkg.storage import Store
from tkg.timeline import Filters


def snapshot_of(memory: Memory) -> dict[str, list]:
    return {kind.value: list(memory.records(kind)) for kind in Kind}


def extraction(prompt: Prompt, model):  # a scripted "LLM" that reads the structured inputs
    speaker = prompt.inputs["speaker"]
    words = [w.strip(".,!?") for w in prompt.inputs["content"].split(":", 1)[-1].split()]
    names = [w for w in words if w[:1].isupper() and w != "I"]
    return {
        "entities": [{"name": n} for n in names],
        "facts": [
            {
                "source": speaker,
                "target": n,
                "relation": "MENTIONS",
                "fact": f"{speaker} talked about {n}",
                "valid_from": "last week" if "week" in prompt.inputs["content"] else None,
            }
            for n in names
        ],
    }


@pytest.fixture
def memory() -> Memory:
    return Memory(
        embedder=HashEmbedder(dim=64),
        llm=ScriptedLLM(handler=extraction),
        clock=FixedClock("2024-06-01T12:00:00Z"),
    )


def test_episode_to_graph_to_search_to_context(memory):
    result = memory.add_episode(
        "Alice: I started at Acme in Berlin last week.", group_id="team", reference_time="2024-05-20T09:00:00Z"
    )
    assert result.usage.calls == 1 and result.usage.prompt_chars > 0
    assert {e.name for e in result.entities} == {"Alice", "Acme", "Berlin"}
    assert all(f.valid_at == datetime(2024, 5, 13, tzinfo=UTC) for f in result.facts)  # "last week"
    assert all(f.created_at == datetime(2024, 6, 1, 12, tzinfo=UTC) for f in result.facts)
    assert {m.entity_id for m in memory.episode_mentions(result.episode.id)} == {e.id for e in result.entities}

    second = memory.add_episode("alice: Acme is great.", group_id="team", reference_time="2024-05-21T09:00:00Z")
    # exact normalised names resolve to the same entities, no duplicates
    assert len(memory.records(Kind.ENTITY)) == 3
    assert {e.id for e in second.entities} <= {e.id for e in result.entities}
    assert "EARLIER EPISODES" in memory.llm.calls[1].user and "Berlin" in memory.llm.calls[1].user  # context

    found = memory.search("Acme Berlin", group_ids=["team"])
    assert found.facts and found.entities and found.episodes
    assert memory.search("started in Berlin", group_ids=["team"]).episodes[0].record.content.startswith("Alice: I st")
    text = memory.context("where does Alice work?", group_ids=["team"])
    assert "Alice talked about Acme (2024-05-13 00:00 UTC - present)" in text
    assert "<ENTITIES>" in text


def test_identical_fact_is_reused_with_provenance(memory):
    first = memory.add_facts([FactInput("Ann", "LIKES", "Tea")], group_id="g")
    second = memory.add_facts([FactInput("ann", "LIKES", "tea", fact="Ann likes tea")], group_id="g")
    assert len(memory.records(Kind.FACT)) == 1
    assert second.facts[0].episodes == (first.episode.id, second.episode.id)


def test_structured_facts_without_llm_and_time_travel():
    memory = Memory(embedder=HashEmbedder(dim=64), clock=FixedClock("2024-06-01T00:00:00Z"))
    memory.add_facts(
        [
            {
                "subject": "Alice",
                "relation": "works at",
                "object": "Acme",
                "valid_at": "2019-01-01T00:00:00Z",
                "invalid_at": "2023-01-01T00:00:00Z",
            },
            {"subject": "Alice", "relation": "WORKS_AT", "object": "Globex", "valid_at": "2023-01-01T00:00:00Z"},
        ],
        group_id="g",
    )
    now = {s.record.fact for s in memory.search("Alice works", group_ids="g").facts}
    then = {s.record.fact for s in memory.search("Alice works", group_ids="g", as_of="2021-06-01T00:00:00Z").facts}
    both = {s.record.fact for s in memory.search("Alice works", group_ids="g", include_invalidated=True).facts}
    assert now == {"Alice works at Globex"} and then == {"Alice works at Acme"} and len(both) == 2
    before = memory.search("Alice", group_ids="g", known_at="2024-05-01T00:00:00Z")
    assert before.facts == [] and before.entities == []  # nothing was recorded yet
    alice = memory.find_entities("alice", group_ids="g")[0]
    assert [f.fact for f in memory.facts_about(alice.id)] == ["Alice works at Acme", "Alice works at Globex"]


def test_message_without_llm_keeps_episode_and_speaker():
    memory = Memory(embedder=HashEmbedder(dim=64), clock=FixedClock("2024-06-01T00:00:00Z"))
    result = memory.add_episode("Bob: the deploy is on Friday", group_id="g")
    assert [e.name for e in result.entities] == ["Bob"] and result.facts == []
    assert memory.search("deploy friday", group_ids="g").episodes[0].record.id == result.episode.id


def test_json_episode_is_kept_verbatim(memory):
    memory.llm.push({"entities": [], "facts": []})
    result = memory.add_episode({"order": 17, "item": "Widget"}, source="json", group_id="g")
    assert result.episode.content == '{"order": 17, "item": "Widget"}'  # in the order given (keys were sorted)
    for bad in ({2: "b"}, {"a": [{None: 1}]}):  # were stored as "2" and "null" without a word
        with pytest.raises(ValidationError, match="key that is not a string"):
            memory.add_episode(bad, source="json", group_id="g")
    with pytest.raises(EpisodeError, match="not valid JSON"):
        memory.add_episode("{broken", source="json", group_id="g")


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"content": ""}, EpisodeError, "empty"),
        ({"content": "   \n\t "}, EpisodeError, "empty"),
        ({"content": "x" * 1_048_576}, EpisodeError, "split it"),
        ({"content": "Ann: hi", "reference_time": datetime(2024, 1, 1)}, TimestampError, "naive"),
        ({"content": "Ann: hi", "reference_time": "2024-02-30T00:00:00Z"}, TimestampError, "ISO-8601"),
        ({"content": "Ann: hi", "reference_time": "yesterday-ish"}, TimestampError, "ISO-8601"),
        ({"content": "Ann: hi", "source": "email"}, EpisodeError, "unknown"),
        ({"content": "Ann: hi", "group_id": "bad group!"}, ValidationError, "group_id"),
        ({"content": 42}, EpisodeError, "must be a string"),
        # what a snapshot could not hold, refused at the door rather than by every later save
        ({"content": "Ann: hi", "metadata": {"order": 2**70}}, ValidationError, "wider than 64 bits"),
        ({"content": "Ann: hi", "metadata": {"a": _nested(600)}}, ValidationError, "deeper than 100 levels"),
        ({"content": _nested(3000), "source": "json"}, ValidationError, "deeper than 100 levels"),
        ({"content": "[" * 3000 + "]" * 3000, "source": "json"}, EpisodeError, "deeper than 100 levels"),
        ({"content": "[" * 200 + "]" * 200, "source": "json"}, ValidationError, "deeper than 100 levels"),
        ({"content": {"temp": float("nan")}, "source": "json"}, EpisodeError, "not serialisable"),
        ({"content": '{"x": NaN}', "source": "json"}, EpisodeError, "NaN is not a JSON value"),
        ({"content": '{"x": Infinity}', "source": "json"}, EpisodeError, "Infinity is not a JSON value"),
    ],
)
def test_bad_episodes_are_refused_and_change_nothing(memory, kwargs, error, match):
    memory.add_episode("Ann: hello Bob", group_id="g")
    before = snapshot_of(memory)
    calls = len(memory.llm.calls)
    with pytest.raises(error, match=match):
        memory.add_episode(**{"group_id": "g", **kwargs})
    assert snapshot_of(memory) == before
    assert len(memory.llm.calls) == calls  # refused before spending an LLM call


def test_nesting_up_to_the_limit_is_stored_and_saved(memory, tmp_path):
    deep = _nested(100)
    memory.add_episode("Ann: hi", group_id="g", metadata={"deep": deep[0]})
    memory.add_episode(deep, source="json", group_id="g")
    memory.save(tmp_path / "m.tkg")
    loaded = Memory.load(tmp_path / "m.tkg", embedder=memory.embedder)
    assert snapshot_of(loaded) == snapshot_of(memory)


def test_bad_facts_are_refused(memory):
    before = snapshot_of(memory)
    with pytest.raises(TimestampError, match="naive"):
        memory.add_facts([FactInput("A", "KNOWS", "B", valid_at=datetime(2020, 1, 1))], group_id="g")
    with pytest.raises(ValidationError, match="before valid_at"):
        memory.add_facts(
            [FactInput("A", "KNOWS", "B", valid_at="2021-01-01T00:00:00Z", invalid_at="2020-01-01T00:00:00Z")],
            group_id="g",
        )
    with pytest.raises(ValidationError, match="empty"):
        memory.add_facts([FactInput("A", " ", "B")], group_id="g")
    with pytest.raises(ValidationError):
        memory.add_facts([{"subject": "A"}], group_id="g")
    with pytest.raises(ValidationError):
        memory.add_facts([], group_id="g")
    with pytest.raises(ValidationError, match=r"unknown fact fields \['valid_from'\]"):  # Graphiti's name, not ours
        memory.add_facts([{"subject": "A", "relation": "KNOWS", "object": "B", "valid_from": "2019"}], group_id="g")
    for label in (5, "", "Per\x00son"):
        with pytest.raises(ValidationError, match="label"):
            memory.add_facts([FactInput("A", "KNOWS", "B", subject_label=label)], group_id="g")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="iterable of episodes"):
        memory.add_episodes("Hi!")  # not one episode per character
    for bad in ({"limit": -1}, {"limit": 0}, {"offset": -1}, {"limit": "3"}, {"offset": 1.5}):
        with pytest.raises(ValidationError, match=r"limit|offset"):
            memory.get_all("g", **bad)
    assert snapshot_of(memory) == before


class BrokenEmbedder(HashEmbedder):
    def __init__(self, how: str) -> None:
        super().__init__(dim=64)
        self.how = how

    def embed(self, texts):
        out = super().embed(texts)
        if self.how == "nan":
            out[-1, 0] = np.nan
            return out
        return out[:, :10]


@pytest.mark.parametrize("how", ["nan", "dim"])
def test_bad_embeddings_are_refused_and_change_nothing(how):
    memory = Memory(embedder=HashEmbedder(dim=64), clock=FixedClock("2024-06-01T00:00:00Z"))
    memory.add_facts([FactInput("A", "KNOWS", "B")], group_id="g")
    before = snapshot_of(memory)
    memory.embedder = BrokenEmbedder(how)
    with pytest.raises(EmbeddingError):
        memory.add_facts([FactInput("C", "KNOWS", "D")], group_id="g")
    with pytest.raises(EmbeddingError):
        memory.search("anything", group_ids="g")
    assert snapshot_of(memory) == before


def test_llm_failure_leaves_the_graph_unchanged_and_keeps_the_episode():
    memory = Memory(
        embedder=HashEmbedder(dim=64),
        llm=ScriptedLLM(handler=extraction),
        clock=FixedClock("2024-06-01T12:00:00Z"),
        config=MemoryConfig(llm_policy=LLMPolicy(backoff_initial=0.0)),
    )
    memory.add_episode("Ann: hello Bob", group_id="g")
    before = snapshot_of(memory)
    memory.llm = ScriptedLLM()  # no answers left: raises LLMError
    with pytest.raises(LLMError):
        memory.add_episode("Ann: anything", group_id="g")
    memory.llm = ScriptedLLM([{"entities": "not a list"}] * 4)
    with pytest.raises(LLMError, match="does not fit"):
        memory.add_episode("Ann: anything", group_id="g")
    after = snapshot_of(memory)
    failed = memory.failed_episodes("g")
    assert len(failed) == 2 and all(e.content == "Ann: anything" for e in failed)
    assert {k: v for k, v in after.items() if k != "episode"} == {k: v for k, v in before.items() if k != "episode"}


def test_bad_llm_dates_and_names_are_handled_not_dropped(memory):
    memory.llm = ScriptedLLM(
        [
            {
                "entities": [{"name": "Ann"}],
                "facts": [
                    {"source": "Ann", "target": "Zed", "relation": "met", "fact": "Ann met Zed", "valid_from": "blorp"},
                    {
                        "source": "Ann",
                        "target": "Zed",
                        "relation": "KNOWS",
                        "fact": "Ann knows Zed",
                        "valid_from": "2024-01-01",
                        "valid_until": "2020-01-01",
                    },
                ],
            }
        ]
    )
    result = memory.add_episode("Ann: met Zed", group_id="g", reference_time="2024-03-01T00:00:00Z")
    assert {e.name for e in result.entities} == {"Ann", "Zed"}  # Zed was not extracted, still created
    met = next(f for f in result.facts if f.relation == "MET")
    assert met.valid_at == datetime(2024, 3, 1, tzinfo=UTC)  # unparseable phrase -> episode time, with a warning
    knows = next(f for f in result.facts if f.relation == "KNOWS")
    assert knows.invalid_at is None
    assert len(result.warnings) == 3  # Zed not extracted, "blorp" undatable, end before start


def test_unknown_group_and_bad_search_arguments(memory):
    memory.add_episode("Ann: hello Bob", group_id="g")
    assert memory.search("hello", group_ids=["nobody"]) == memory.search("hello", group_ids=["nobody", "nobody2"])
    assert not memory.search("hello", group_ids=["nobody"]).facts  # a user not seen yet: nothing, no error
    assert memory.search("hello", group_ids=["nobody", "g"]).episodes  # the known group still answers
    strict = memory.with_config(dataclasses.replace(memory.config, strict_groups=True))
    with pytest.raises(UnknownGroupError, match="nobody"):  # the typo guard, when asked for
        strict.search("hello", group_ids=["nobody"])
    with pytest.raises(ValidationError):
        memory.search("  ")
    with pytest.raises(ValidationError):
        memory.search("hello", limit=0)
    with pytest.raises(ValidationError):
        memory.search("hello", targets=["planets"])
    with pytest.raises(TimestampError):
        memory.search("hello", as_of=datetime(2024, 1, 1))


def test_context_respects_character_budget(memory):
    for i in range(20):
        memory.add_facts(
            [FactInput(f"Person{i}", "KNOWS", f"Friend{i}", fact=f"Person{i} knows Friend{i} well")], group_id="g"
        )
    full = memory.context("knows", group_ids="g", limit=20)
    short = memory.context("knows", group_ids="g", limit=20, max_chars=300)
    assert len(short) <= 300 < len(full)
    assert short.splitlines()[2] == full.splitlines()[2]  # best-first: the top fact survives


T = "2024-06-01T12:00:00Z"


def test_an_entity_mentioned_again_with_nothing_new_is_not_written_again():
    """Each episode writes the entities it creates or changes; one only mentioned again stays as stored (a rewrite
    costs every index of the store an update: on PostgreSQL a new row version and a new HNSW entry). It is still
    among the episode's entities, and the new mention links it to the episode."""
    from tkg.backends.memory import InMemoryStore

    class Recording(InMemoryStore):
        def __init__(self) -> None:
            super().__init__(dim=64)
            self.entities_written: list[str] = []

        def write(self, batch):
            self.entities_written += [r.name for r in batch.puts if r.kind is Kind.ENTITY]
            super().write(batch)

    def handler(prompt: Prompt, model):
        answer = extraction(prompt, model)
        if "chess" in prompt.inputs["content"]:
            answer["entities"] = [{"name": "Bob", "summary": "Bob plays chess."}]
        return answer

    store = Recording()
    memory = Memory(store, embedder=HashEmbedder(dim=64), llm=ScriptedLLM(handler=handler), clock=FixedClock(T))
    first = memory.add_episode("Alice: I met Bob.", group_id="team", reference_time=T)
    assert sorted(store.entities_written) == ["Alice", "Bob"]
    store.entities_written.clear()
    again = memory.add_episode("Alice: Bob again.", group_id="team", reference_time=T)
    assert store.entities_written == []
    assert {e.id for e in again.entities} == {e.id for e in first.entities}
    bob = next(e for e in first.entities if e.name == "Bob")
    assert bob.id in {m.entity_id for m in memory.episode_mentions(again.episode.id)}
    changed = memory.add_episode("Alice: Bob and chess.", group_id="team", reference_time=T)
    assert store.entities_written == ["Bob"]  # his summary changed; Alice did not
    assert next(e for e in changed.entities if e.name == "Bob").summary == "Bob plays chess."


def test_an_episode_looks_its_names_up_at_once_and_reads_no_entity_twice():
    """Planning an episode reads the stored entities of all its names in one call and keeps them: placing an
    entity found by name reads it no second time (each read is a round trip on PostgreSQL). Structured facts too."""
    from collections import Counter

    from tkg.backends.memory import InMemoryStore

    class Counting(InMemoryStore):
        def __init__(self) -> None:
            super().__init__(dim=64)
            self.calls: Counter[str] = Counter()

        def entities_by_name(self, group_id, names):
            self.calls["entities_by_name"] += 1
            return super().entities_by_name(group_id, names)

        def get(self, kind, ids):
            if kind is Kind.ENTITY:
                self.calls["entities read by id"] += len(ids)
            return super().get(kind, ids)

    store = Counting()
    memory = Memory(
        store,
        embedder=HashEmbedder(dim=64),
        llm=ScriptedLLM(handler=extraction),
        clock=FixedClock(T),
        config=MemoryConfig(communities=None),
    )
    first = memory.add_episode("Alice: I met Bob and Carol.", group_id="team", reference_time=T)
    store.calls.clear()
    again = memory.add_episode("Alice: Bob and Carol again.", group_id="team", reference_time=T)
    assert store.calls == {"entities_by_name": 1}
    assert {e.id for e in again.entities} == {e.id for e in first.entities}
    store.calls.clear()  # structured facts take the same path without the LLM
    added = memory.add_facts([FactInput("Bob", "KNOWS", "Carol"), FactInput("Alice", "KNOWS", "Bob")], group_id="team")
    assert store.calls == {"entities_by_name": 1}
    assert {e.id for e in added.entities} == {e.id for e in first.entities}


def test_a_statement_restated_in_every_episode_costs_the_same_reads_at_its_tenth_and_its_fortieth_time():
    """A user restates "I KNOWS Bob" in every episode: each restatement is a fact of its own (its own start),
    linked to all the others as one statement, so each new one settles the history of all of them. The component
    is walked a step at a time, the facts of a step followed together: the store reads of an episode do not grow
    with the restatements (an earlier planner asked the store once per linked fact, ~0.5 ms each on PostgreSQL)."""
    from collections import Counter
    from datetime import timedelta

    from tkg.backends.memory import InMemoryStore
    from tkg.llm.rules import RulesLLM

    class Counting(InMemoryStore):
        def __init__(self) -> None:
            super().__init__(dim=64)
            self.calls: Counter[str] = Counter()

        def facts_judging(self, fact_ids, entity_ids):
            self.calls["facts_judging"] += 1
            return super().facts_judging(fact_ids, entity_ids)

        def get(self, kind, ids):
            self.calls["get"] += 1
            return super().get(kind, ids)

        def facts_between(self, pairs):
            self.calls["facts_between"] += 1
            return super().facts_between(pairs)

    store = Counting()
    memory = Memory(
        store, embedder=HashEmbedder(dim=64), llm=RulesLLM(), clock=FixedClock(T), config=MemoryConfig(communities=None)
    )
    start = datetime(2024, 6, 1, tzinfo=UTC)
    reads: dict[int, Counter[str]] = {}
    for i in range(40):
        store.calls.clear()
        memory.add_episode("User: I KNOWS Bob.", group_id="me", reference_time=start + timedelta(hours=i))
        reads[i + 1] = Counter(store.calls)
    (bob,) = memory.find_entities("Bob", group_ids=["me"])
    facts = memory.facts_about(bob.id)
    assert len(facts) == 40  # each restatement is a fact, all but the first superseded by it
    assert sum(f.invalidated_by is None for f in facts) == 1
    assert reads[40] == reads[10], (reads[10], reads[40])


def test_a_statement_judged_beside_another_is_not_asked_about_again_and_holds_one_verdict(
    make_store: Callable[[int], Store],
) -> None:
    """ "I KNOWS Bob" said five times, then "I KNOWS Carol": the LLM is shown Bob's statement (one restatement of
    it) and judges the two compatible. That verdict names the fact shown, not all five (kept on every restatement,
    a statement said N times held N verdicts for each fact judged beside it, read again at each restatement). Then
    Bob again, and Carol again: neither is asked about the other's statement, not even the Carol restatement,
    which meets the Bob fact said after Carol was judged (an earlier planner asked about it)."""
    llm = RulesLLM()
    memory = Memory(
        make_store(64),
        embedder=HashEmbedder(dim=64),
        llm=llm,
        clock=FixedClock(T),
        config=MemoryConfig(communities=None),
    )
    start = datetime(2024, 6, 1, tzinfo=UTC)
    said = ["Bob"] * 5 + ["Carol", "Bob", "Carol"]
    shown: list[list[str]] = []
    for i, who in enumerate(said):
        llm.calls.clear()
        memory.add_episode(f"User: I KNOWS {who}.", group_id="me", reference_time=start + timedelta(hours=i))
        shown.append(
            [c["fact"] for p in llm.calls for item in p.inputs.get("facts", []) for c in item.get("candidates", [])]
        )
    assert shown[5] == ["User knows Bob"]  # Carol, first said: judged against Bob's statement, shown once
    assert shown[6] == [] and shown[7] == []  # Bob again, Carol again: each statement known to the other
    (user,) = memory.find_entities("User", group_ids=["me"])
    every = memory.facts_about(user.id, include_invalidated=True)
    bobs = {f.id for f in every if f.fact == "User knows Bob"}
    carols = [f for f in every if f.fact == "User knows Carol"]
    assert len(bobs) == 6 and len(carols) == 2
    assert [len(bobs.intersection(f.verdicts)) for f in carols] == [1, 0]  # one verdict, on the fact shown
    assert all(v is Verdict.COMPATIBLE for f in carols for v in f.verdicts.values())


def test_an_episode_reads_the_facts_between_its_pairs_in_one_call_and_never_for_a_new_entity():
    """Around a user with many facts, a new fact's neighbourhood is read closest first (its own relation, and
    the others); the facts between the pairs that turns up are read in one call when each side is settled by its
    first read (the related statements' pairs, those of the first facts of its own relation and the new fact's own
    ends), one more per later round, and never for an entity the episode creates: it has no stored fact (each call
    is a round trip on PostgreSQL; earlier planners asked once per related statement and once more per new end,
    then once per side)."""
    from datetime import timedelta

    from tkg.backends.memory import InMemoryStore
    from tkg.llm.rules import RulesLLM

    class Counting(InMemoryStore):
        def __init__(self) -> None:
            super().__init__(dim=64)
            self.between: list[list[tuple[str, str]]] = []
            self.closest = 0

        def facts_between(self, pairs):
            self.between.append(list(pairs))
            return super().facts_between(pairs)

        def closest_facts(self, *args, **kwargs):
            self.closest += 1
            return super().closest_facts(*args, **kwargs)

    store = Counting()
    memory = Memory(
        store, embedder=HashEmbedder(dim=64), llm=RulesLLM(), clock=FixedClock(T), config=MemoryConfig(communities=None)
    )
    relations = ["LIKES", "VISITED", "KNOWS", "OWNS", "READ"]
    start = datetime(2024, 6, 1, tzinfo=UTC)
    settled_first = 0
    for i in range(80):
        store.between.clear()
        store.closest = 0
        thing = f"thing{i % 23}" if i < 60 else f"thing{i}"  # from 60 on, each episode names a new thing
        when = start + timedelta(hours=i)
        memory.add_episode(f"User: I {relations[i % 5]} {thing}.", group_id="me", reference_time=when)
        if i >= 60:
            created = {e.id for e in memory.find_entities(thing, group_ids=["me"])}
            assert len(created) == 1
            assert store.between and len(store.between) <= store.closest - 1, (store.between, store.closest)
            settled_first += store.closest == 2
            assert not created & {end for pairs in store.between for pair in pairs for end in pair}
    assert settled_first >= 10  # most episodes: two closest reads, one read of the facts between


def test_a_new_name_asks_its_entity_candidates_by_cosine_and_bm25_in_one_store_call():
    """A name that matches no entity exactly is resolved against the entities closest to it by cosine and by BM25:
    the two lists are asked of the store in one call (Store.candidates: a database reads them on two connections
    at once), never one after the other."""
    from tkg.backends.memory import InMemoryStore
    from tkg.llm.rules import RulesLLM

    class Counting(InMemoryStore):
        def __init__(self) -> None:
            super().__init__(dim=64)
            self.asked: list[list[tuple[str, str]]] = []
            self.inside = False
            self.alone = 0

        def candidates(self, asks, query, vector, scope):
            self.asked.append([(a.method, str(a.kind)) for a in asks])
            self.inside = True
            try:
                return super().candidates(asks, query, vector, scope)
            finally:
                self.inside = False

        def vector_search(self, kind, vector, k, scope):
            self.alone += not self.inside
            return super().vector_search(kind, vector, k, scope)

        def text_search(self, kind, query, k, scope):
            self.alone += not self.inside
            return super().text_search(kind, query, k, scope)

    store = Counting()
    memory = Memory(
        store, embedder=HashEmbedder(dim=64), llm=RulesLLM(), clock=FixedClock(T), config=MemoryConfig(communities=None)
    )
    memory.add_episode("User: I LIKES green tea.", group_id="me", reference_time=T)
    store.asked.clear()
    store.alone = 0
    memory.add_episode("User: I LIKES black tea.", group_id="me", reference_time=T)
    assert [("cosine", "entity"), ("bm25", "entity")] in store.asked, store.asked
    assert store.alone == 0


def test_bad_arguments_to_reads_and_files_are_tkg_errors(memory, tmp_path):
    memory.add_episode("Ann: hello Bob", group_id="g")
    ann = memory.find_entities("Ann")[0]
    refused = [
        (lambda: memory.episodes(status="bogus"), ValidationError, "unknown status"),
        (lambda: memory.records("bogus"), ValidationError, "unknown record kind"),
        (lambda: memory.search("Ann", group_ids=5), ValidationError, "group_ids"),
        (lambda: memory.get_all(group_ids=5), ValidationError, "group_ids"),
        (lambda: memory.neighbourhood(ann.id, depth="2"), ValidationError, "depth"),
        (lambda: memory.neighbourhood(ann.id, limit=0), ValidationError, "limit"),
        (lambda: memory.add_episodes(5), ValidationError, "iterable of episodes"),
        (lambda: memory.import_jsonl(tmp_path / "missing.jsonl"), ValidationError, "cannot read"),
        (lambda: memory.save(tmp_path), SnapshotError, "cannot save"),
        (lambda: memory.facts_about(5), ValidationError, "entity_id"),
        (lambda: memory.add_episode("Ann: hi", group_id="g", extract="no"), ValidationError, "extract"),
    ]
    before = snapshot_of(memory)
    for call, error, match in refused:
        with pytest.raises(error, match=match):
            call()
    assert snapshot_of(memory) == before and sorted(p.name for p in tmp_path.iterdir()) == []


def _stated(memory: Memory) -> Memory:
    memory.add_facts([FactInput("Ann", "LIKES", "Tea")], group_id="g")
    return memory


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda m: m.add_facts(None), ValidationError),
        (lambda m: m.search("tea", origins=None), ValidationError),
        (lambda m: m.search("tea", config="cross_encoder", cross_encoder=5), ValidationError),
        (lambda m: m.get_all(filters=5), ValidationError),
        (lambda m: m.get_all(include_invalidated="yes"), ValidationError),
        (lambda m: m.get(Kind.FACT, ["id"]), ValidationError),
        (lambda m: m.get_many(Kind.FACT, 5), ValidationError),
        (lambda m: Memory(embedder=None), ConfigurationError),
        (lambda m: Memory(embedder=m.embedder, config={"search_limit": 3}), ConfigurationError),
        (lambda m: Memory(embedder=m.embedder, ontology={}), ConfigurationError),
        (lambda m: Memory(embedder=m.embedder, clock="now"), ConfigurationError),
        (lambda m: Memory(embedder=m.embedder, llm="gpt"), ConfigurationError),
        (lambda m: setattr(m, "llm", 5), ConfigurationError),
        (lambda m: Ontology(entities=None), ConfigurationError),
        (lambda m: Ontology(relations={"LIKES": RelationType(model=5)}), ConfigurationError),  # type: ignore[arg-type]
        (lambda m: Filters(labels=5), ValidationError),
        (lambda m: Filters(dates=5), ValidationError),
    ],
)
def test_a_call_of_the_wrong_shape_is_refused_by_tkg_and_changes_nothing(call: Any, error: type) -> None:
    """Arguments of the wrong type get tkg's own error, naming what was expected (each raised a raw TypeError or
    AttributeError, some only later), and the memory is as it was."""
    memory = _stated(Memory(embedder=HashEmbedder(dim=32), clock=FixedClock("2024-01-01T00:00:00Z")))
    before = [(f.id, f.expired_at) for f in memory.records(Kind.FACT)]
    with pytest.raises(error):
        call(memory)
    assert [(f.id, f.expired_at) for f in memory.records(Kind.FACT)] == before and memory.llm is None


def test_a_memory_opened_with_a_bad_seam_leaves_no_file(tmp_path: Path) -> None:
    """Memory.open with a durability that is not a JournalPolicy, or a bad configuration, is refused before
    any file is made (it left a journal behind), and the path can be opened after."""
    path = tmp_path / "m.tkg"
    with pytest.raises(ConfigurationError, match="durability"):
        Memory.open(path, embedder=HashEmbedder(dim=32), durability="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="config"):
        Memory.open(path, embedder=HashEmbedder(dim=32), config={"x": 1})  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
    with Memory.open(path, embedder=HashEmbedder(dim=32)) as memory:
        assert memory.groups() == []


def test_the_last_episodes_said_before_a_time(make_store) -> None:
    """As Graphiti's retrieve_episodes: the latest n episodes said at or before a time, oldest first, of one group
    or several, on every backend; with a status, from the listing."""
    memory = Memory(make_store(32), embedder=HashEmbedder(dim=32), clock=FixedClock("2024-02-01T00:00:00Z"))
    for day in range(1, 7):
        memory.add_episode(f"Ann: message {day}", group_id="g", reference_time=f"2024-01-0{day}T00:00:00Z")
    memory.add_episode("Bob: other", group_id="h", reference_time="2024-01-03T12:00:00Z")

    def said(**kwargs: Any) -> list[str]:
        return [e.content for e in memory.episodes(**kwargs)]

    assert said(group_ids="g", last=2) == ["Ann: message 5", "Ann: message 6"]
    assert said(group_ids="g", before="2024-01-04T00:00:00Z", last=2) == ["Ann: message 3", "Ann: message 4"]
    assert said(before="2024-01-04T00:00:00Z", last=3) == ["Ann: message 3", "Bob: other", "Ann: message 4"]
    assert said(group_ids=["g", "h"], before="2024-01-02T00:00:00Z") == ["Ann: message 1", "Ann: message 2"]
    assert said(group_ids="g", status="stored", last=1) == ["Ann: message 6"]
    assert said(group_ids="g", last=0) == []
    for group in ("y", "x"):  # a tie across groups (one time, a clock standing still): as the listing orders it
        memory.add_episode(f"X: from {group}", group_id=group, reference_time="2024-02-01T00:00:00Z", extract=False)
    assert said(last=1) == said()[-1:] == said(status="stored", last=1) == ["X: from x"]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValidationError, match="last must be"):
            memory.episodes(last=bad)


class DownEmbedder(HashEmbedder):
    """A HashEmbedder whose service is down for texts naming ``down`` (as tkg's OpenAIEmbedder raises LLMError
    when its endpoint cannot be reached), until ``down`` is cleared."""

    def __init__(self, down: str) -> None:
        super().__init__(dim=64)
        self.down = down

    def embed(self, texts: list[str]) -> Any:
        if self.down and any(self.down in t for t in texts):
            raise LLMError("the embeddings endpoint cannot be reached", retryable=True)
        return super().embed(texts)


def test_an_episode_the_embedder_fails_on_is_stored_failed_and_the_rest_of_its_batch_applies() -> None:
    """The embedder is an outside service like the LLM: when it fails on one episode of a batch, that episode is
    stored as failed (no vector yet) with a result that says so, the episodes after it in its group and those of
    other groups apply, and retry() extracts it once the service is back."""
    embedder = DownEmbedder("Zork")
    clock = FixedClock("2024-06-01T00:00:00Z", tick=timedelta(seconds=1))
    memory = Memory(embedder=embedder, llm=RulesLLM(), clock=clock)
    results = memory.add_episodes(
        [
            {"content": "Ann: I LIVES_IN Paris.", "group_id": "g1"},
            {"content": "Ann: I KNOWS Zork.", "group_id": "g1"},
            {"content": "Ann: I LIVES_IN Oslo.", "group_id": "g1"},
            {"content": "Bob: I WORKS_AT Acme.", "group_id": "g2"},
        ]
    )
    assert [r.status for r in results] == [
        EpisodeStatus.EXTRACTED,
        EpisodeStatus.FAILED,
        EpisodeStatus.EXTRACTED,
        EpisodeStatus.EXTRACTED,
    ]
    assert "embeddings endpoint" in results[1].warnings[0]
    failed = memory.failed_episodes()
    assert [e.content for e in failed] == ["Ann: I KNOWS Zork."] and failed[0].embedding is None
    with pytest.raises(ExtractionFailedError):
        memory.add_episode("Ann: I LIKES Zork.", group_id="g1")  # one alone: the same
    kept = len(memory.records(Kind.EPISODE))
    with pytest.raises(LLMError, match="embeddings endpoint"):  # kept without extraction: nothing to retry, not kept
        memory.add_episode("Ann: a note on Zork.", group_id="g1", extract=False)
    assert len(memory.records(Kind.EPISODE)) == kept
    embedder.down = ""
    for episode in memory.failed_episodes():
        assert memory.retry(episode.id).status is EpisodeStatus.EXTRACTED
    assert memory.failed_episodes() == []
    assert {f.fact for f in memory.get_all("g1")} >= {"Ann knows Zork", "Ann likes Zork", "Ann lives in Oslo"}
