"""The search function: presets, methods, rerankers, scores, and bad input."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import pytest

from tkg import FixedClock, HashEmbedder, Memory, MemoryConfig, ScriptedLLM
from tkg.backends.memory import InMemoryStore
from tkg.errors import ConfigurationError, NotFoundError, TimestampError, UnknownGroupError, ValidationError
from tkg.memory import FactInput
from tkg.models import Community, Kind, Membership
from tkg.rerankers import TermOverlapScorer
from tkg.search_config import (
    PRESETS,
    BfsOrigin,
    Method,
    Reranker,
    SearchConfig,
    TargetConfig,
    preset,
)
from tkg.storage import WriteBatch
from tkg.timeline import DateRange, Filters

CHAIN = [("Ann", "Bob"), ("Bob", "Cid"), ("Cid", "Dee"), ("Dee", "Eve"), ("Eve", "Fay")]


@pytest.fixture
def store() -> InMemoryStore:
    return InMemoryStore(dim=64)


@pytest.fixture
def memory(store: InMemoryStore) -> Memory:
    # communities=None: the community tests below write their own communities
    m = Memory(
        store,
        embedder=HashEmbedder(dim=64),
        clock=FixedClock("2024-06-01T00:00:00Z"),
        config=MemoryConfig(communities=None),
    )
    m.add_facts(
        [FactInput(a, "KNOWS", b, fact=f"{a} knows {b} from the chess club") for a, b in CHAIN]
        + [
            FactInput("Ann", "WORKS_AT", "Acme", valid_at="2020-01-01T00:00:00Z", invalid_at="2022-01-01T00:00:00Z"),
            FactInput("Ann", "WORKS_AT", "Globex", valid_at="2022-01-01T00:00:00Z", object_label="Organization"),
        ],
        group_id="g",
    )
    m.add_episode("Ann: I joined the chess club at Globex", group_id="g", reference_time="2024-05-01T10:00:00Z")
    m.add_episode("Bob: nice, I play there on Fridays", group_id="g", reference_time="2024-05-01T10:01:00Z")
    m.add_facts([FactInput("Zed", "KNOWS", "Ann", fact="Zed knows Ann from the chess club")], group_id="other")
    return m


def entity_id(memory: Memory, name: str, group: str = "g") -> str:
    return memory.find_entities(name, group_ids=group)[0].id


def test_every_preset_runs_and_returns_scores(memory):
    center = entity_id(memory, "Ann")
    for name in PRESETS:
        results = memory.search("who knows Ann from chess", group_ids="g", config=name, center=center)
        for target in preset(name).targets:
            found = getattr(results, target)
            if target != "communities":  # the fixture writes no communities: every other target has matches
                assert found, f"preset {name!r} found no {target}"
            for scored in found:
                assert isinstance(scored.score, float)
                assert scored.record.group_id == "g"  # never another tenant's data
            scores = [s.score for s in found]
            assert scores == sorted(scores, reverse=True), f"preset {name!r}: {target} not best first"


def test_search_does_not_mutate_presets(memory):
    before = dataclasses.replace(PRESETS["hybrid"])
    memory.search("chess", config="hybrid", limit=1)
    assert PRESETS["hybrid"] == before and PRESETS["hybrid"].facts.limit == 10  # type: ignore[union-attr]
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRESETS["hybrid"].facts.limit = 3  # type: ignore[misc, union-attr]


def test_limits_and_targets_narrow_a_config(memory):
    results = memory.search("chess club", group_ids="g", config="full", limit=2, targets=["facts", "entities"])
    assert len(results.facts) == 2 and len(results.entities) <= 2 and results.episodes == []
    with pytest.raises(ValidationError):
        memory.search("chess", config="facts", targets=["episodes"])


def test_bfs_reaches_what_text_search_cannot(memory):
    ann = entity_id(memory, "Ann")
    config = SearchConfig(
        entities=TargetConfig(methods=(Method.BFS,), bfs_origin=BfsOrigin.GIVEN, bfs_depth=2, limit=20),
        facts=TargetConfig(methods=(Method.BFS,), bfs_origin=BfsOrigin.GIVEN, bfs_depth=2, limit=20),
    )
    found = memory.search("unrelated words", group_ids="g", config=config, origins=[ann])
    names = [s.record.name for s in found.entities]
    assert names[0] == "Ann" and set(names) == {"Ann", "Bob", "Cid", "Acme", "Globex"} - {"Acme"}  # Acme ended
    assert [s.score for s in found.entities] == sorted((s.score for s in found.entities), reverse=True)
    assert {s.record.fact for s in found.facts} >= {
        "Ann knows Bob from the chess club",
        "Bob knows Cid from the chess club",
    }
    assert "Cid knows Dee from the chess club" not in {s.record.fact for s in found.facts}  # 3 hops away


def test_bfs_from_recent_episodes_and_from_hits(memory):
    recent = SearchConfig(entities=TargetConfig(methods=(Method.BFS,), bfs_origin=BfsOrigin.RECENT_EPISODES))
    names = {s.record.name for s in memory.search("zzz", group_ids="g", config=recent).entities}
    assert {"Ann", "Bob"} <= names  # the speakers of the latest episodes and their neighbours
    hits = SearchConfig(facts=TargetConfig(methods=(Method.BM25, Method.BFS), limit=10))
    facts = {s.record.fact for s in memory.search("Eve Fay", group_ids="g", config=hits).facts}
    assert "Dee knows Eve from the chess club" in facts  # not matched by text: reached from the hit's ends


def test_node_distance_is_true_shortest_path(memory):
    ann = entity_id(memory, "Ann")
    config = SearchConfig(
        entities=TargetConfig(methods=(Method.BM25,), reranker=Reranker.NODE_DISTANCE, limit=10, max_distance=10)
    )
    found = memory.search("Ann Bob Cid Dee Eve Fay", group_ids="g", config=config, center=ann)
    assert [s.record.name for s in found.entities] == ["Ann", "Bob", "Cid", "Dee", "Eve", "Fay"]
    assert [round(s.score, 3) for s in found.entities] == [1.0, 0.5, 0.333, 0.25, 0.2, 0.167]


def test_episode_mentions_counts_mentions(memory):
    config = SearchConfig(entities=TargetConfig(methods=(Method.BM25,), reranker=Reranker.EPISODE_MENTIONS))
    found = memory.search("Ann Fay", group_ids="g", config=config)
    scores = {s.record.name: s.score for s in found.entities}
    assert scores["Ann"] > scores["Fay"]  # Ann speaks in an episode and is named in two fact episodes


def test_mmr_lambda_one_is_cosine_order_and_lower_lambda_diversifies(memory):
    plain = memory.search(
        "chess club", group_ids="g", config=SearchConfig(facts=TargetConfig(methods=(Method.COSINE,)))
    )
    mmr1 = memory.search(
        "chess club", group_ids="g", config=SearchConfig(facts=TargetConfig(reranker=Reranker.MMR, mmr_lambda=1.0))
    )
    assert [s.record.id for s in mmr1.facts][:3] == [s.record.id for s in plain.facts][:3]
    mmr0 = memory.search(
        "chess club", group_ids="g", config=SearchConfig(facts=TargetConfig(reranker=Reranker.MMR, mmr_lambda=0.1))
    )
    assert [s.record.id for s in mmr0.facts] != [s.record.id for s in mmr1.facts]


class FixedVectors(HashEmbedder):
    """HashEmbedder, with chosen vectors for some texts."""

    def __init__(self, fixed: dict[str, list[float]]) -> None:
        super().__init__(dim=8)
        self.fixed = fixed

    def embed(self, texts):  # type: ignore[no-untyped-def]
        out = super().embed(texts)
        for i, text in enumerate(texts):
            if text in self.fixed:
                out[i] = self.fixed[text]
        return out


def test_mmr_ranks_by_cosine_when_the_store_rounds_its_vectors() -> None:
    """A bfloat16 store hands back vectors whose length is off by up to ~0.2%: MMR ranks by their cosines, not their
    raw products (which put "beta" first and scored a fact against its own text above 1)."""
    alpha = [-0.12994300, -0.57807672, -0.14121883, 0.29090160, 0.44820306, 0.10694343, -0.19989009, -0.54045975]
    beta = [-0.51009905, -0.63558447, -0.13794293, 0.00620171, 0.38422012, 0.21957719, -0.15952651, -0.30899298]
    query = [-0.36378536, -0.60077757, -0.11266589, 0.19072931, 0.51535219, 0.04976683, -0.25070098, -0.35600501]
    embedder = FixedVectors({"Ann alpha": alpha, "Ann beta": beta, "query": query})
    memory = Memory(
        InMemoryStore(dim=8, vector_precision="bfloat16"), embedder=embedder, clock=FixedClock("2024-06-01T00:00:00Z")
    )
    memory.add_facts(
        [FactInput("Ann", "A", "X", fact="Ann alpha"), FactInput("Ann", "B", "Y", fact="Ann beta")], group_id="u"
    )
    mmr1 = SearchConfig(facts=TargetConfig(methods=(Method.COSINE,), reranker=Reranker.MMR, mmr_lambda=1.0))
    plain = SearchConfig(facts=TargetConfig(methods=(Method.COSINE,)))
    ranked = memory.search("query", group_ids=["u"], config=mmr1).facts
    assert [s.record.fact for s in ranked] == [
        s.record.fact for s in memory.search("query", group_ids=["u"], config=plain).facts
    ]
    assert [s.record.fact for s in ranked] == ["Ann alpha", "Ann beta"]
    assert all(
        s.score <= 1.0
        for text in ("Ann alpha", "Ann beta")
        for s in memory.search(text, group_ids=["u"], config=mmr1).facts
    )


def test_cross_encoder_seam_scores_and_min_score(memory, store):
    config = SearchConfig(facts=TargetConfig(reranker=Reranker.CROSS_ENCODER, min_score=0.5))
    found = memory.search("Globex", group_ids="g", config=config, cross_encoder=TermOverlapScorer())
    assert [s.record.fact for s in found.facts] == ["Ann works at Globex"] and found.facts[0].score == 1.0
    # without a scorer and without an LLM: the offline embedding scorer
    assert memory.search("Globex", group_ids="g", config="cross_encoder").facts
    # with an LLM: one grading call through the LLM seam
    llm = ScriptedLLM(handler=lambda prompt, model: {"grades": [{"index": 0, "relevance": 0.7}]})
    graded = Memory(store, embedder=memory.embedder, llm=llm, clock=memory.clock)
    assert graded.search("Globex", group_ids="g", config="cross_encoder").facts[0].score == 0.7
    assert any(p.name == "rerank" for p in llm.calls)
    # through the memory's guard, counted in its totals (one grading call per target)
    assert graded.usage.by_prompt == {"rerank": sum(p.name == "rerank" for p in llm.calls)}


def test_a_cross_encoder_score_of_nan_is_refused(memory):
    """A NaN breaks every comparison of the sort: the passage scored NaN came first whatever the others scored."""

    class Broken:
        def score(self, query, passages):
            return [float("nan"), *[0.5] * (len(passages) - 1)]

    config = SearchConfig(facts=TargetConfig(reranker=Reranker.CROSS_ENCODER))
    with pytest.raises(ValidationError, match="NaN"):
        memory.search("Ann", group_ids="g", config=config, cross_encoder=Broken())


def test_invalidated_facts_only_on_request(memory):
    now = {s.record.fact for s in memory.search("Ann works", group_ids="g", config="facts").facts}
    assert "Ann works at Acme" not in now and "Ann works at Globex" in now
    both = memory.search("Ann works", group_ids="g", config="facts", include_invalidated=True).facts
    assert {"Ann works at Acme", "Ann works at Globex"} <= {s.record.fact for s in both}
    then = memory.search("Ann works", group_ids="g", config="facts", as_of="2021-01-01T00:00:00Z").facts
    assert "Ann works at Acme" in {s.record.fact for s in then}


def test_filters_through_memory_search(memory):
    labelled = memory.search("Globex Ann", group_ids="g", filters=Filters(labels=frozenset({"Organization"})))
    assert [s.record.name for s in labelled.entities] == ["Globex"]
    relation = memory.search("Ann", group_ids="g", filters=Filters(relations=frozenset({"WORKS_AT"})))
    assert relation.facts and all(s.record.relation == "WORKS_AT" for s in relation.facts)
    dated = memory.search(
        "Ann works",
        group_ids="g",
        include_invalidated=True,
        filters=Filters(dates=(DateRange("invalid_at", end="2023-01-01T00:00:00Z"),)),
    )
    assert [s.record.fact for s in dated.facts] == ["Ann works at Acme"]


# -- bad input ----------------------------------------------------------------------------------------------------
def test_bad_input_gives_clear_errors_or_empty_results(memory):
    with pytest.raises(ValidationError, match="empty"):
        memory.search("   ")
    with pytest.raises(ValidationError, match="max_query_chars"):
        memory.search("x" * 100_000)
    with pytest.raises(NotFoundError):
        memory.search("chess", config="node_distance", center="no-such-entity")
    with pytest.raises(NotFoundError):  # another tenant's entity is reported like a missing one
        memory.search("chess", group_ids="g", config="node_distance", center=entity_id(memory, "Zed", "other"))
    with pytest.raises(ValidationError, match="center"):
        memory.search("chess", config="node_distance")
    missing = memory.search("Ann", group_ids="g", filters=Filters(labels=frozenset({"Planet"})))
    assert missing.entities == [] and missing.facts  # only entities are narrowed by labels
    everything = memory.search("chess", group_ids="g", limit=10_000)
    assert 0 < len(everything.facts) <= len(memory.records(Kind.FACT))
    with pytest.raises(TimestampError):
        memory.search("chess", as_of=datetime(2024, 1, 1))
    with pytest.raises(TimestampError):
        memory.search("chess", known_at=datetime(2024, 1, 1))
    with pytest.raises(TimestampError):
        memory.search("chess", filters=Filters(dates=(DateRange("created_at", start=datetime(2024, 1, 1)),)))
    assert memory.search("chess", group_ids=["nobody"]).facts == []
    with pytest.raises(UnknownGroupError):
        memory.with_config(dataclasses.replace(memory.config, strict_groups=True)).search("chess", group_ids=["nobody"])
    with pytest.raises(ValidationError):
        memory.search("chess", limit=True)
    with pytest.raises(ValidationError):
        memory.search("chess", config=42)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        memory.search("chess", config="no-such-preset")


def test_config_validation():
    with pytest.raises(ConfigurationError):
        TargetConfig(methods=())
    with pytest.raises(ConfigurationError):
        TargetConfig(limit=0)
    with pytest.raises(ConfigurationError):
        TargetConfig(mmr_lambda=1.5)
    with pytest.raises(ConfigurationError):
        TargetConfig(methods=("grep",))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        SearchConfig(episodes=TargetConfig(methods=(Method.BFS,)))
    with pytest.raises(ConfigurationError):
        SearchConfig(facts=TargetConfig(reranker=Reranker.EPISODE_CONTEXT))
    with pytest.raises(ConfigurationError):
        SearchConfig()
    assert TargetConfig(reranker="episode_context").context is not None  # type: ignore[arg-type]


def test_communities_by_text_and_by_bfs(memory, store):
    t = memory.clock.now()
    emb = memory.embedder

    def community(cid: str, name: str, members: list[str]) -> list:
        vec = emb.embed([name])[0]
        return [
            Community(id=cid, group_id="g", name=name, created_at=t, summary=f"{name} summary", name_embedding=vec),
            *[Membership(cid, entity_id(memory, m), "g", t) for m in members],
        ]

    store.write(
        WriteBatch(puts=community("c1", "chess players", ["Ann", "Bob"]) + community("c2", "quiet group", ["Cid"]))
    )
    text = SearchConfig(communities=TargetConfig(methods=(Method.BM25,)))
    assert [s.record.id for s in memory.search("chess players", group_ids="g", config=text).communities] == ["c1"]
    walk = SearchConfig(communities=TargetConfig(methods=(Method.BM25, Method.BFS), bfs_depth=1))
    found = memory.search("chess players", group_ids="g", config=walk).communities
    assert [s.record.id for s in found] == ["c1", "c2"]  # Cid is one hop from Bob, a member of c1
    assert "<COMMUNITIES>" in memory.context("chess players", group_ids="g", config=walk)


def test_episode_mentions_counts_every_saying_of_a_statement() -> None:
    """The paper's episode-mentions reranker ranks a fact by how often it was said. A statement said again on a
    later day is a fact of its own, superseded by the one that holds (so is a rewording the LLM judged the same):
    its saying counts for the fact shown. It counted only the shown fact's own episodes, so "I PLAYS tennis" said
    on three days scored as "I PLAYS golf" said once."""
    from tkg.llm import Prompt
    from tkg.llm.rules import extract
    from tkg.llm.schema import FactDecision, GraphExtraction, Resolution

    def handler(prompt: Prompt, model: object) -> object:
        if model is GraphExtraction:  # "tennis weekly": a rewording about tennis
            said = extract(str(prompt.inputs["content"]), prompt.inputs.get("speaker"))
            return GraphExtraction.model_validate_json(said.model_dump_json().replace('"tennis weekly"', '"tennis"'))
        decisions = [
            FactDecision(new=n, duplicates=[c["number"] for c in item["candidates"] if "tennis" in c["fact"]][:1])
            for n, item in enumerate(prompt.inputs.get("facts", []), start=1)
        ]
        return Resolution(facts=decisions)

    clock = FixedClock("2024-06-01T00:00:00Z")
    memory = Memory(
        embedder=HashEmbedder(dim=64),
        llm=ScriptedLLM(handler=handler),
        clock=clock,
        config=MemoryConfig(communities=None),
    )
    said = ["I PLAYS tennis.", "I PLAYS golf.", "I PLAYS tennis.", "I PLAYS tennis weekly."]
    for day, text in enumerate(said, start=1):
        clock.advance(hours=1)
        memory.add_episode(f"Ann: {text}", group_id="g", reference_time=f"2024-05-0{day}T10:00:00Z")
    stored = memory.get_all(["g"], include_invalidated=True)
    assert len(stored) == 4 and max(len(f.episodes) for f in stored) == 1  # each saying is a fact of its own
    then = clock.now()

    def ranked(**view: object) -> list[tuple[str, float]]:
        found = memory.search("Ann plays", group_ids=["g"], config="episode_mentions", targets=["facts"], **view)
        return [(hit.record.fact, hit.score) for hit in found.facts]

    assert ranked() == [("Ann plays tennis", 3.0), ("Ann plays golf", 1.0)]
    clock.advance(days=1)
    memory.add_episode("Ann: I PLAYS golf.", group_id="g", reference_time="2024-05-09T10:00:00Z")
    memory.add_episode("Ann: I PLAYS golf.", group_id="g", reference_time="2024-05-10T10:00:00Z")
    memory.add_episode("Ann: I PLAYS golf.", group_id="g", reference_time="2024-05-11T10:00:00Z")
    assert ranked()[0] == ("Ann plays golf", 4.0)
    assert ranked(known_at=then) == [("Ann plays tennis", 3.0), ("Ann plays golf", 1.0)]  # as the memory knew then


def test_episode_mentions_counts_the_rewordings_of_a_single_valued_statement() -> None:
    """One slot of a single-valued relation with the same object is one statement however it is worded (the
    history's rule): each saying counts (the count re-implemented "same statement" as verbatim or a direct verdict,
    and scored 1 where 4 were said)."""
    from tkg import Ontology, RelationType

    def said(sentence: str) -> dict[str, object]:
        fact = {"source": "Ann", "target": "Paris", "relation": "LIVES_IN", "fact": sentence}
        return {"entities": [{"name": "Ann"}, {"name": "Paris"}], "facts": [fact]}

    wordings = ["Ann lives in Paris", "Ann resides in Paris", "Ann is based in Paris", "Ann resides in Paris"]
    memory = Memory(
        embedder=HashEmbedder(dim=64),
        llm=ScriptedLLM([said(w) for w in wordings]),
        clock=FixedClock("2024-06-01T00:00:00Z"),
        ontology=Ontology(relations={"LIVES_IN": RelationType(single_valued=True)}),
        config=MemoryConfig(communities=None),
    )
    for day, wording in enumerate(wordings, start=1):
        memory.add_episode(f"Ann: {wording}.", group_id="g", reference_time=f"2024-05-0{day}T10:00:00Z")
    found = memory.search("Ann Paris", group_ids=["g"], config="episode_mentions", targets=["facts"])
    assert [(hit.record.fact, hit.score) for hit in found.facts] == [("Ann lives in Paris", 4.0)]
