"""Rerankers as pure functions (RRF, MMR, normalisation), the cross-encoder seam, and the episode-context reranker."""

from __future__ import annotations

import itertools
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tkg import FixedClock, HashEmbedder, Memory, ScriptedLLM
from tkg.episode_context import time_phrase
from tkg.errors import ConfigurationError, LLMError
from tkg.ranking import mmr, normalized, reorder, rrf
from tkg.rerankers import CrossEncoder, EmbeddingScorer, LLMScorer, TermOverlapScorer
from tkg.search_config import EpisodeContext, Method, Reranker, SearchConfig, TargetConfig
from tkg.storage import Hit


def test_rrf_constant_and_order():
    a, b = [Hit("x", 9), Hit("y", 8)], [Hit("y", 1), Hit("z", 0.5)]
    fused = rrf([a, b], k=60)
    assert [h.id for h in fused] == ["y", "x", "z"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert rrf([a, b], k=1)[0].score == pytest.approx(1 / 3 + 1 / 2)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=6), max_size=4))
def test_rrf_scores_are_sorted_and_cover_every_item(lists):
    fused = rrf([[Hit(i, 1.0) for i in items] for items in lists])
    assert {h.id for h in fused} == {i for items in lists for i in items}
    assert [h.score for h in fused] == sorted((h.score for h in fused), reverse=True)


def test_mmr_is_greedy_and_penalises_duplicates():
    rng = np.random.default_rng(0)
    base = rng.normal(size=8).astype(np.float32)
    base /= np.linalg.norm(base)
    other = rng.normal(size=8).astype(np.float32)
    other /= np.linalg.norm(other)
    vectors = np.stack([base, base, other])
    query = (0.9 * base + 0.1 * other).astype(np.float32)
    assert [h.id for h in mmr(query, ["a", "dup", "b"], vectors, 1.0, 3)] == ["a", "dup", "b"]
    assert [h.id for h in mmr(query, ["a", "dup", "b"], vectors, 0.3, 3)] == ["a", "b", "dup"]
    assert mmr(query, [], vectors[:0], 0.5, 3) == []


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.floats(0.0, 1.0))
def test_mmr_scores_fall_down_the_list(seed: int, n: int, lam: float):
    """Each score is the candidate's marginal value when it was taken: never above one taken before it (a
    candidate unlike those taken -- a negative cosine -- rose above the first, so min_score dropped the best)."""
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, 6)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    query = vectors[0] * 0.5 + rng.normal(size=6).astype(np.float32)
    query /= np.linalg.norm(query)
    scores = [h.score for h in mmr(query, [str(i) for i in range(n)], vectors, lam, n)]
    assert all(b <= a + 1e-6 for a, b in itertools.pairwise(scores)), scores


def test_normalized_and_reorder():
    assert normalized([Hit("a", 3.0), Hit("b", 1.0), Hit("c", 2.0)]) == {"a": 1.0, "b": 0.0, "c": 0.5}
    assert normalized([Hit("a", 2.0)]) == {"a": 1.0}
    assert reorder([Hit("a", 1), Hit("b", 1), Hit("c", 1)], {"c": 2.0, "b": 0.0}) == [
        Hit("c", 2.0),
        Hit("a", 0.0),
        Hit("b", 0.0),
    ]


def test_scorers_follow_the_seam():
    for scorer in (TermOverlapScorer(), EmbeddingScorer(HashEmbedder(dim=32))):
        assert isinstance(scorer, CrossEncoder)
        scores = scorer.score("alice works at acme", ["alice works at acme", "the weather is nice"])
        assert len(scores) == 2 and scores[0] > scores[1]
        assert scorer.score("q", []) == []
    assert TermOverlapScorer().score("the of", ["anything"]) == [0.0]


def test_llm_scorer_uses_one_call_and_checks_indexes():
    llm = ScriptedLLM([{"grades": [{"index": 2, "relevance": 1.0}]}, {"grades": [{"index": 5, "relevance": 1.0}]}])
    assert LLMScorer(llm).score("q", ["a", "b", "c"]) == [0.0, 0.0, 1.0]
    assert len(llm.calls) == 1 and "[2] c" in llm.calls[0].user
    with pytest.raises(LLMError):
        LLMScorer(llm).score("q", ["a"])


def test_time_phrases():
    assert time_phrase("What did I do last weekend?") == "last weekend"
    assert time_phrase("Where was I on 3rd of May 2023?") == "3rd of May 2023"
    assert time_phrase("Which book did I read in March?") == "March"
    assert time_phrase("How many days ago did I start?") is None


def _conversation() -> Memory:
    memory = Memory(embedder=HashEmbedder(dim=64), clock=FixedClock("2024-07-01T00:00:00Z"))
    sessions = [
        ("2024-05-01T10:00:00Z", ["Ann: do you still have the violin", "Bob: yes, I practise every evening"]),
        ("2024-06-10T10:00:00Z", ["Bob: what happened at work", "Ann: I got promoted to lead engineer"]),
        ("2024-06-20T10:00:00Z", ["Ann: the weather is lovely", "Bob: let us walk in the park"]),
    ]
    for when, turns in sessions:
        for text in turns:
            memory.add_episode(text, group_id="c", reference_time=when)
    return memory


def _context(**weights: float) -> SearchConfig:
    context = EpisodeContext(
        **{"session_weight": 0.0, "neighbour_weight": 0.0, "entity_weight": 0.0, "time_weight": 0.0, **weights}
    )  # type: ignore[arg-type]
    return SearchConfig(episodes=TargetConfig(reranker=Reranker.EPISODE_CONTEXT, context=context, limit=6))


def test_episode_context_neighbours_lift_the_answering_turn():
    memory = _conversation()
    plain = memory.search("violin", group_ids="c", config=_context())
    assert plain.episodes[0].record.content == "Ann: do you still have the violin"
    lifted = memory.search("violin", group_ids="c", config=_context(neighbour_weight=0.5))
    contents = [s.record.content for s in lifted.episodes]
    # the reply, which shares no word with the query, is now found next to the question it answers
    assert contents[:2] == ["Ann: do you still have the violin", "Bob: yes, I practise every evening"]


def test_episode_context_sessions_entities_and_time():
    memory = _conversation()
    session = memory.search("what happened at work", group_ids="c", config=_context(session_weight=1.0))
    assert {s.record.content for s in session.episodes[:2]} == {
        "Bob: what happened at work",
        "Ann: I got promoted to lead engineer",
    }
    by_ann = memory.search("Ann weather park", group_ids="c", config=_context(entity_weight=1.0))
    assert by_ann.episodes[0].record.content == "Ann: the weather is lovely"
    timed = memory.search(
        "what did we talk about two months ago",
        group_ids="c",
        config=_context(time_weight=5.0),
        reference_time="2024-07-01T00:00:00Z",
    )
    assert timed.episodes[0].record.reference_time.month == 5
    with pytest.raises(ConfigurationError):
        EpisodeContext(session_gap=timedelta(seconds=-1))


def _sessions(sessions: list[tuple[str, list[str]]]) -> Memory:
    memory = Memory(embedder=HashEmbedder(dim=64), clock=FixedClock("2024-07-01T00:00:00Z"))
    for when, turns in sessions:
        for i, text in enumerate(turns):
            memory.add_episode(text, group_id="c", reference_time=f"{when}:{i:02d}Z")
    return memory


def test_episode_context_expansion_finds_the_answers_vocabulary():
    memory = _sessions(
        [
            ("2024-05-01T10:00", ["Ann: my violin teacher plays in the orchestra", "Bob: we bought fresh bread"]),
            ("2024-05-08T10:00", ["Bob: the violin solo with the orchestra was superb", "Ann: the cat sleeps a lot"]),
            ("2024-05-15T10:00", ["Ann: the orchestra tour starts in autumn", "Bob: my bike has a flat tyre"]),
        ]
    )
    target = "Ann: the orchestra tour starts in autumn"
    plain = [s.record.content for s in memory.search("violin", group_ids="c", config=_context()).episodes]
    expanded = memory.search("violin", group_ids="c", config=_context(expansion_terms=3, expansion_docs=2))
    contents = [s.record.content for s in expanded.episodes]
    # "orchestra" is in both violin turns and not in the query: the turn that has only it comes next
    assert set(contents[:2]) == {
        "Ann: my violin teacher plays in the orchestra",
        "Bob: the violin solo with the orchestra was superb",
    }
    assert contents[2] == target
    assert plain.index(target) > 2  # without the expansion a distractor is ahead of it (hash vectors)
    with pytest.raises(ConfigurationError):
        EpisodeContext(expansion_docs=1)
    with pytest.raises(ConfigurationError):
        EpisodeContext(expansion_terms=-1)


def test_episode_context_session_decay_spreads_evidence_over_sessions():
    memory = _sessions(
        [
            ("2024-05-01T10:00", ["Ann: violin lesson today", "Ann: the violin strings broke", "Bob: violin shop?"]),
            ("2024-06-01T10:00", ["Bob: we have violin concert tickets", "Ann: great"]),
        ]
    )

    def sessions_of(config: SearchConfig) -> list[int]:
        return [s.record.reference_time.month for s in memory.search("violin", group_ids="c", config=config).episodes]

    assert sessions_of(_context(session_weight=1.0))[:3] == [5, 5, 5]  # one strong session takes the top
    assert sessions_of(_context(session_weight=1.0, session_decay=2.0))[:2] == [5, 6]
    with pytest.raises(ConfigurationError):
        EpisodeContext(session_decay=-0.1)


def test_episode_context_session_as_document():
    # The first session says "hiking", "boots" and "tent" in three turns; the second says "hiking" three times in
    # one turn. As a sum of its best turns the second session wins the word that repeats; as a document, the
    # session that covers the whole query does.
    memory = _sessions(
        [
            ("2024-05-01T10:00", ["Ann: hiking next week", "Bob: bring boots", "Ann: and a tent", "Bob: ok"]),
            ("2024-06-01T10:00", ["Ann: hiking hiking hiking, always hiking", "Bob: hm", "Ann: so", "Bob: yes"]),
        ]
    )
    query = "hiking boots tent"

    def scores(**weights: object) -> dict[str, float]:
        config = _context(session_weight=1.0, **weights).with_limit(10)  # type: ignore[arg-type]
        return {s.record.content: s.score for s in memory.search(query, group_ids="c", config=config).episodes}

    as_document, by_turns = scores(session_document=True), scores()
    assert len(as_document) == len(by_turns) == 8
    # The document score ranks the covering session first: its turns gain more than the repeating session's.
    assert as_document["Bob: ok"] - as_document["Bob: hm"] > by_turns["Bob: ok"] - by_turns["Bob: hm"]
    assert as_document["Bob: ok"] > as_document["Bob: hm"]


def test_episode_context_a_session_without_bounds_is_no_evidence():
    # 130 turns imported without times of their own: all stamped at the same instant, one endless "session".
    # The session signal cannot weigh it as a unit, so it changes nothing; the neighbour signal still works.
    memory = Memory(embedder=HashEmbedder(dim=64), clock=FixedClock("2024-07-01T00:00:00Z"))
    for i in range(130):
        text = f"Ann: the violin lesson number {i}" if i % 40 == 7 else f"Bob: small talk about item {i}"
        memory.add_episode(text, group_id="c")

    def scores(**weights: float) -> dict[str, float]:
        config = _context(**weights).with_limit(20)
        return {s.record.content: s.score for s in memory.search("violin", group_ids="c", config=config).episodes}

    assert scores(session_weight=1.0) == scores()
    assert scores(session_weight=1.0, session_document=True) == scores()  # type: ignore[arg-type]
    assert scores(neighbour_weight=0.5) != scores()
    # The same turns in real sessions (an hour apart every 10 turns): now the session signal counts.
    dated = Memory(embedder=HashEmbedder(dim=64), clock=FixedClock("2024-07-01T00:00:00Z"))
    for i in range(130):
        text = f"Ann: the violin lesson number {i}" if i % 40 == 7 else f"Bob: small talk about item {i}"
        dated.add_episode(text, group_id="c", reference_time=f"2024-06-{1 + i // 10:02d}T10:{i % 10:02d}:00Z")
    config = _context(session_weight=1.0).with_limit(20)
    plain = _context().with_limit(20)
    assert [s.score for s in dated.search("violin", group_ids="c", config=config).episodes] != [
        s.score for s in dated.search("violin", group_ids="c", config=plain).episodes
    ]


def test_a_view_of_the_past_builds_conversation_sessions_from_the_episodes_it_sees():
    """A turn recorded on 3 May, said between two turns of 1 May, joined them into one session in a view known on
    2 May, which does not see it: the view ranked differently from the memory as it stood then."""
    turns = [
        ("Ann: I adopted a cat named Miso", "2024-05-01T10:00:00Z"),
        ("Bob: my dog hates the vet", "2024-05-01T11:00:00Z"),
        ("Ann: the cat Miso sleeps all day", "2024-05-01T12:00:00Z"),
    ]
    config = SearchConfig(
        episodes=TargetConfig(
            methods=(Method.COSINE,),
            reranker=Reranker.EPISODE_CONTEXT,
            candidate_factor=5,
            min_similarity=-1.0,
            context=EpisodeContext(bm25_weight=0.0, neighbours=0, entity_weight=0.0, time_weight=0.0),
        )
    )

    def ranked(late: bool, **when: str) -> list[tuple[str, float]]:
        clock = FixedClock("2024-05-02T00:00:00Z")
        memory = Memory(embedder=HashEmbedder(dim=64), clock=clock)
        for text, said in turns:
            memory.add_episode(text, group_id="g", extract=False, reference_time=said)
        clock.set("2024-05-03T00:00:00Z")
        if late:
            said = "2024-05-01T10:30:00Z"  # between the first two turns
            memory.add_episode("Cid: we talked about pets", group_id="g", extract=False, reference_time=said)
        found = memory.search("who hates the vet", group_ids=["g"], config=config, **when).episodes
        return [(s.record.content, round(s.score, 6)) for s in found]

    assert ranked(True, known_at="2024-05-02T12:00:00Z") == ranked(False, known_at="2024-05-02T12:00:00Z")
    assert ranked(True, as_of="2024-05-01T10:15:00Z") == ranked(False, as_of="2024-05-01T10:15:00Z")
