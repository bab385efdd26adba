"""The Mem0-compatible facade (tkg.compat.mem0), through the scenarios Mem0's own suite covers: add (string,
messages, infer on and off), get, get_all, search, update, delete, delete_all, history, reset, scopes and metadata
filters; tkg's doubles stand in for the LLM. And the property that anything added is found in its scope and never
in another."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkg import FixedClock, HashEmbedder, Kind, Ontology, RelationType
from tkg import Memory as TkgMemory
from tkg.compat.mem0 import Memory, MemoryNotFoundError
from tkg.compat.mem0_filters import matches, scope_group, scope_of
from tkg.errors import ConfigurationError, EmbeddingError, ValidationError
from tkg.llm.rules import RulesLLM

ROOT = Path(__file__).resolve().parent.parent
HOMES = Ontology(relations={"LIVES_IN": RelationType(single_valued=True)})


def offline(clock: FixedClock | None = None) -> Memory:
    return Memory(memory=TkgMemory(embedder=HashEmbedder(dim=64), clock=clock or FixedClock("2024-05-01T00:00:00Z")))


def with_llm(clock: FixedClock) -> Memory:
    llm = RulesLLM(exclusive={"LIVES_IN"})
    return Memory(memory=TkgMemory(embedder=HashEmbedder(dim=64), llm=llm, clock=clock, ontology=HOMES))


def texts(result: dict[str, list[dict[str, Any]]]) -> list[str]:
    return [item["memory"] for item in result["results"]]


# -- add and read, no LLM (Mem0's infer=False) ---------------------------------------------------------------


def test_add_keeps_messages_and_reads_them_back() -> None:
    m = offline()
    added = m.add(
        [
            {"role": "system", "content": "You are helpful."},  # skipped, as in Mem0
            {"role": "user", "content": "I'm not a fan of thrillers but I love sci-fi movies."},
            {"role": "assistant", "content": "Got it, sci-fi it is.", "name": "Robo"},
        ],
        user_id="alice",
        metadata={"category": "movies"},
        infer=False,
    )
    events = [(r["event"], r["role"], r["actor_id"], r["memory"]) for r in added["results"]]
    assert events == [
        ("ADD", "user", None, "I'm not a fan of thrillers but I love sci-fi movies."),
        ("ADD", "assistant", "Robo", "Got it, sci-fi it is."),
    ]
    first = added["results"][0]
    got = m.get(first["id"])
    assert got is not None
    assert {k: got[k] for k in ("id", "memory", "user_id", "metadata", "hash")} == {
        "id": first["id"],
        "memory": first["memory"],
        "user_id": "alice",
        "metadata": {"category": "movies"},
        "hash": first["hash"],
    }
    assert sorted(texts(m.get_all(filters={"user_id": "alice"}))) == sorted(r["memory"] for r in added["results"])
    assert m.get_all(user_id="alice") == m.get_all(filters={"user_id": "alice"})  # Mem0's older form
    hits = m.search("which movies does she like? sci-fi", filters={"user_id": "alice"}, top_k=1)["results"]
    assert hits[0]["memory"].startswith("I'm not a fan") and hits[0]["score"] > 0
    assert m.get("nope") is None
    assert m.search("movies", filters={"user_id": "bob"}) == {"results": []}  # a user never seen: empty


def test_scopes_combine_as_in_mem0() -> None:
    m = offline()
    m.add("user only", user_id="u1")
    m.add("user and agent", user_id="u1", agent_id="a1")
    m.add("agent and run", agent_id="a1", run_id="r1")
    m.add("other user", user_id="u2", agent_id="a1")
    assert sorted(texts(m.get_all(filters={"user_id": "u1"}))) == ["user and agent", "user only"]
    assert sorted(texts(m.get_all(filters={"agent_id": "a1"}))) == ["agent and run", "other user", "user and agent"]
    assert texts(m.get_all(filters={"user_id": "u1", "agent_id": "a1"})) == ["user and agent"]
    assert texts(m.get_all(filters={"run_id": "r1"})) == ["agent and run"]
    item = m.get_all(filters={"run_id": "r1"})["results"][0]
    assert (item["agent_id"], item["run_id"], "user_id" in item) == ("a1", "r1", False)
    m.delete_all(user_id="u1")
    assert texts(m.get_all(filters={"agent_id": "a1"})) == ["agent and run", "other user"]
    m.reset()
    assert m.get_all(filters={"agent_id": "a1"}) == {"results": []}


def test_metadata_filters() -> None:
    m = offline()
    m.add("likes jazz", user_id="u", metadata={"topic": "music", "year": 2021, "tags": "jazz,live"})
    m.add("likes rome", user_id="u", metadata={"topic": "travel", "year": 2023})
    m.add("no metadata", user_id="u")

    def found(**condition: Any) -> list[str]:
        return sorted(texts(m.get_all(filters={"user_id": "u", **condition})))

    assert found(topic="music") == ["likes jazz"]
    assert found(topic={"in": ["music", "travel"]}) == ["likes jazz", "likes rome"]
    assert found(topic={"ne": "music"}) == ["likes rome", "no metadata"]
    assert found(year={"gte": 2022}) == ["likes rome"]
    assert found(tags={"icontains": "JAZZ"}) == ["likes jazz"]
    assert found(topic="*") == ["likes jazz", "likes rome"]
    assert found(OR=[{"topic": "music"}, {"year": {"gt": 2022}}]) == ["likes jazz", "likes rome"]
    assert found(NOT=[{"topic": "music"}]) == ["likes rome", "no metadata"]
    hits = m.search("likes", filters={"user_id": "u", "topic": "travel"})
    assert texts(hits) == ["likes rome"]
    with pytest.raises(ValidationError, match="unknown filter operator"):
        m.get_all(filters={"user_id": "u", "year": {"between": [1, 2]}})
    # a malformed filter is refused whether or not a memory would reach it: in a scope never written, or behind
    # a condition that fails first
    for read in (m.get_all, lambda filters: m.search("likes", filters=filters)):
        for filters, match in (
            ({"user_id": "nobody", "year": {"between": [1, 2]}}, "unknown filter operator"),
            ({"user_id": "u", "topic": "none", "year": {"in": 2022}}, "takes a list"),
            ({"user_id": "u", "OR": {"topic": "music"}}, "takes a list of filters"),
            ({"user_id": "u", "AND": [{"topic": "none"}, {"NOT": [{"year": {"nin": "x"}}]}]}, "takes a list"),
        ):
            with pytest.raises(ValidationError, match=match):
                read(filters=filters)


def test_a_metadata_filter_finds_a_match_that_ranks_below_many_others() -> None:
    m = offline()
    for n in range(60):
        m.add(f"I drink green tea every morning, cup {n}.", user_id="u", metadata={"category": "a"}, infer=False)
    m.add("Tea is fine I guess.", user_id="u", metadata={"category": "b"}, infer=False)
    hits = m.search("green tea every morning", filters={"user_id": "u", "category": "b"}, top_k=5)
    assert texts(hits) == ["Tea is fine I guess."]  # filtered, as Mem0 does, not cut off by the first page
    assert len(m.search("green tea every morning", user_id="u", top_k=5)["results"]) == 5


# -- extraction, contradiction, update, delete, history ------------------------------------------------------


def test_a_deleted_fact_is_still_listed_as_known_before_the_delete() -> None:
    clock = FixedClock("2024-05-01T00:00:00Z")
    m = with_llm(clock)
    added = m.add([{"role": "user", "name": "Ann", "content": "I LIKES tea."}], user_id="ann")["results"][0]
    clock.set("2024-06-01T00:00:00Z")
    m.delete(added["id"])
    assert texts(m.get_all(user_id="ann")) == []
    assert texts(m.get_all(user_id="ann", known_at="2024-05-15T00:00:00Z")) == ["Ann likes tea"]
    assert texts(m.search("tea", user_id="ann", known_at="2024-05-15T00:00:00Z")) == ["Ann likes tea"]
    assert texts(m.search("tea", user_id="ann")) == []
    # what the memory expected then of a later time: it did not know the delete was coming
    later = {"as_of": "2024-07-01T00:00:00Z", "known_at": "2024-05-15T00:00:00Z"}
    assert texts(m.get_all(user_id="ann", **later)) == ["Ann likes tea"]
    assert texts(m.get_all(user_id="ann", as_of="2024-07-01T00:00:00Z")) == []


def test_facts_with_an_llm_and_a_contradiction_ends_the_older() -> None:
    clock = FixedClock("2024-05-01T00:00:00Z")
    m = with_llm(clock)
    ann = {"role": "user", "name": "Ann"}
    first = m.add([{**ann, "content": "I LIVES_IN Paris since 2019."}], user_id="ann")
    assert [(r["event"], r["memory"], r["kind"]) for r in first["results"]] == [("ADD", "Ann lives in Paris", "fact")]
    paris = first["results"][0]["id"]
    clock.set("2024-06-01T00:00:00Z")
    second = m.add([{**ann, "content": "I LIVES_IN Rome since 2024."}], user_id="ann")
    events = {(r["event"], r["memory"]) for r in second["results"]}
    assert events == {("ADD", "Ann lives in Rome"), ("DELETE", "Ann lives in Paris")}
    ended = next(r for r in second["results"] if r["event"] == "DELETE")
    assert ended["id"] == paris and ended["invalid_at"].startswith("2024-01-01")
    assert texts(m.get_all(filters={"user_id": "ann"})) == ["Ann lives in Rome"]
    assert sorted(texts(m.get_all(filters={"user_id": "ann"}, show_expired=True))) == [
        "Ann lives in Paris",
        "Ann lives in Rome",
    ]
    assert texts(m.get_all(filters={"user_id": "ann"}, as_of="2022-01-01T00:00:00Z")) == ["Ann lives in Paris"]
    assert [e["event"] for e in m.history(paris)] == ["ADD", "DELETE"]
    again = m.add([{**ann, "content": "I LIVES_IN Rome since 2024."}], user_id="ann")
    assert [r["event"] for r in again["results"]] == ["NOOP"]


def test_update_delete_and_history_keep_every_version() -> None:
    clock = FixedClock("2024-05-01T00:00:00Z")
    m = with_llm(clock)
    fact_id = m.add("I LIKES Jazz since 2020.", user_id="ann", metadata={"source": "chat"})["results"][0]["id"]
    assert m.get(fact_id)["memory"] == "User likes Jazz"
    clock.set("2024-06-01T00:00:00Z")
    updated = m.update(fact_id, text="User likes jazz and blues", metadata={"mood": "good"})
    new_id = updated["id"]
    assert updated["message"] == "Memory updated successfully!" and new_id != fact_id
    current = m.get_all(filters={"user_id": "ann"})["results"]
    assert [(r["id"], r["memory"], r["metadata"]) for r in current] == [
        (new_id, "User likes jazz and blues", {"source": "chat", "mood": "good"})
    ]
    assert m.get(fact_id)["id"] == new_id  # the old id reads the newest version, as in Mem0
    # nothing lost: the old version is there, as of before the update and in the tkg memory
    before = m.get_all(filters={"user_id": "ann"}, as_of="2024-05-15T00:00:00Z")
    assert texts(before) == ["User likes Jazz"]
    clock.set("2024-07-01T00:00:00Z")
    m.delete(fact_id)  # the old id deletes the newest version
    assert m.get_all(filters={"user_id": "ann"}) == {"results": []}
    shown = m.get_all(filters={"user_id": "ann"}, show_expired=True)
    assert sorted(texts(shown)) == ["User likes Jazz", "User likes jazz and blues"]
    history = m.history(fact_id)
    assert history == m.history(new_id)[: len(history)] or [e["event"] for e in history] == [
        e["event"] for e in m.history(new_id)
    ]
    assert [(e["event"], e["old_memory"], e["new_memory"]) for e in history] == [
        ("ADD", None, "User likes Jazz"),
        ("UPDATE", "User likes Jazz", "User likes jazz and blues"),
        ("DELETE", "User likes jazz and blues", None),
    ]
    assert [e["updated_at"][:10] for e in history] == ["2024-05-01", "2024-06-01", "2024-07-01"]
    assert {e["created_at"][:10] for e in history} == {"2024-05-01"}  # as Mem0: when the memory was created
    assert history[-1]["is_deleted"] and history[-1]["invalid_at"].startswith("2024-07-01")
    assert history[0]["valid_at"].startswith("2020-01-01") and {"expired_at", "invalid_at"} <= history[0].keys()
    with pytest.raises(MemoryNotFoundError, match="ended already"):
        m.delete(new_id)
    with pytest.raises(ValueError):  # as Mem0's callers catch it
        m.delete("no-such-id")
    assert m.history("no-such-id") == []


def test_a_metadata_update_of_a_fact_that_has_not_started_is_kept() -> None:
    """A fact that starts in the future restated with new metadata is the same fact (same text, same times): the
    update keeps its id, and its metadata shows in every read, in history, and in a later version; a view known
    before the update shows the metadata of then."""
    clock = FixedClock("2024-05-01T00:00:00Z")
    m = with_llm(clock)
    fact_id = m.add("I LIKES Jazz since 2030.", user_id="ann", metadata={"source": "chat"})["results"][0]["id"]
    clock.set("2024-06-01T00:00:00Z")
    assert m.update(fact_id, metadata={"checked": True})["id"] == fact_id
    both = {"source": "chat", "checked": True}
    assert m.get(fact_id)["metadata"] == both
    then = "2030-06-01T00:00:00Z"  # when it holds
    assert [r["metadata"] for r in m.get_all(filters={"user_id": "ann"}, as_of=then)["results"]] == [both]
    found = m.search("jazz", filters={"user_id": "ann", "checked": True}, as_of=then)["results"]
    assert [(r["id"], r["metadata"]) for r in found] == [(fact_id, both)]
    earlier = m.get_all(filters={"user_id": "ann"}, as_of=then, known_at="2024-05-15T00:00:00Z")["results"]
    assert [r["metadata"] for r in earlier] == [{"source": "chat"}]
    history = m.history(fact_id)
    assert [(e["event"], e["old_memory"], e["new_memory"], e["updated_at"][:10]) for e in history] == [
        ("ADD", None, "User likes Jazz", "2024-05-01"),
        ("UPDATE", "User likes Jazz", "User likes Jazz", "2024-06-01"),
    ]
    clock.set("2024-07-01T00:00:00Z")
    newer = m.update(fact_id, text="User likes jazz a lot")["id"]
    assert newer != fact_id and m.get(fact_id)["metadata"] == both


def test_updating_a_fact_keeps_its_known_end() -> None:
    clock = FixedClock("2024-05-01T00:00:00Z")
    m = with_llm(clock)
    item = m.add("I WORKS_AT Acme since 2020 until 2030.", user_id="ann")["results"][0]
    assert item["invalid_at"] == "2030-01-01T00:00:00+00:00"
    clock.set("2024-06-01T00:00:00Z")
    m.update(item["id"], metadata={"checked": True})
    got = m.get(item["id"])
    assert (got["valid_at"], got["invalid_at"]) == ("2024-06-01T00:00:00+00:00", "2030-01-01T00:00:00+00:00")
    assert got["metadata"] == {"checked": True}
    assert m.get_all(user_id="ann", as_of="2031-01-01T00:00:00Z")["results"] == []  # it never said 2031


def test_get_all_as_of_a_time_lists_only_messages_said_by_then() -> None:
    m = offline()
    m.add("first note", user_id="u", timestamp="2023-01-01T00:00:00Z")
    m.add("second note", user_id="u", timestamp="2023-06-01T00:00:00Z")
    assert texts(m.get_all(user_id="u", as_of="2023-03-01T00:00:00Z")) == ["first note"]
    assert texts(m.get_all(user_id="u", as_of="2022-01-01T00:00:00Z")) == []
    assert sorted(texts(m.get_all(user_id="u"))) == ["first note", "second note"]


def test_updating_a_kept_message_keeps_its_id_and_old_text() -> None:
    clock = FixedClock("2024-05-01T00:00:00Z")
    m = offline(clock)
    memory_id = m.add("I love India.", user_id="u")["results"][0]["id"]
    assert m.get(memory_id)["updated_at"] == m.get(memory_id)["created_at"]  # as Mem0: updated when created
    clock.set("2024-05-02T00:00:00Z")
    assert m.update(memory_id=memory_id, data="I love India, it is my favorite country.")["id"] == memory_id
    assert m.get(memory_id)["memory"] == "I love India, it is my favorite country."
    # as in Mem0, the memory keeps its creation time and says when it was updated
    got = m.get(memory_id)
    assert (got["created_at"], got["updated_at"]) == ("2024-05-01T00:00:00+00:00", "2024-05-02T00:00:00+00:00")
    assert m.get_all(user_id="u")["results"][0]["updated_at"] == "2024-05-02T00:00:00+00:00"
    assert [(e["event"], e["old_memory"], e["new_memory"]) for e in m.history(memory_id)] == [
        ("ADD", None, "I love India."),
        ("UPDATE", "I love India.", "I love India, it is my favorite country."),
    ]
    clock.set("2024-05-03T00:00:00Z")
    m.update(memory_id=memory_id, data="I love India and Peru.")

    def known(at: str) -> list[tuple[str, str, str | None]]:
        return [(i["memory"], i["created_at"], i["updated_at"]) for i in m.get_all(user_id="u", known_at=at)["results"]]

    # the memory as it read at each time: not yet kept, then each version in turn
    assert known("2024-04-30T00:00:00Z") == []
    assert known("2024-05-01T12:00:00Z") == [
        ("I love India.", "2024-05-01T00:00:00+00:00", "2024-05-01T00:00:00+00:00")
    ]
    assert known("2024-05-02T12:00:00Z") == [
        ("I love India, it is my favorite country.", "2024-05-01T00:00:00+00:00", "2024-05-02T00:00:00+00:00")
    ]
    assert known("2024-05-03T12:00:00Z") == [
        ("I love India and Peru.", "2024-05-01T00:00:00+00:00", "2024-05-03T00:00:00+00:00")
    ]
    with pytest.raises(ValidationError):
        m.update(memory_id, text="bad\x00text")
    assert m.get(memory_id)["memory"] == "I love India and Peru."  # a refused update: unchanged
    m.delete(memory_id)
    assert m.get(memory_id) is None


def test_an_update_the_embedder_refuses_leaves_the_message() -> None:
    class Flaky(HashEmbedder):
        broken = False

        def embed(self, texts: Any) -> Any:
            if self.broken:
                raise EmbeddingError("the embedding service is down")
            return super().embed(texts)

    embedder = Flaky(dim=64)
    m = Memory(memory=TkgMemory(embedder=embedder, clock=FixedClock("2024-05-01T00:00:00Z")))
    memory_id = m.add("I love India.", user_id="u")["results"][0]["id"]
    embedder.broken = True
    with pytest.raises(EmbeddingError):
        m.update(memory_id, text="I love Peru.")
    embedder.broken = False
    assert m.get(memory_id)["memory"] == "I love India."


def test_bad_calls_are_refused_with_tkg_errors() -> None:
    m = offline()
    with pytest.raises(ValidationError, match="at least one of user_id"):
        m.add("x")
    with pytest.raises(ValidationError, match="whitespace"):
        m.add("x", user_id="a b")
    with pytest.raises(ValidationError, match="at least one of user_id"):
        m.search("x")
    with pytest.raises(ValidationError, match="content"):
        m.add([{"role": "user", "content": ""}], user_id="u")
    with pytest.raises(ValidationError, match="tkg's own"):
        m.add("x", user_id="u", metadata={"tkg.replaces": "y"})
    with pytest.raises(ValidationError, match="procedural"):
        m.add("x", agent_id="a", memory_type="procedural_memory")
    with pytest.raises(ValidationError, match="threshold"):
        m.search("x", filters={"user_id": "u"}, threshold=2)
    with pytest.raises(ValidationError, match="threshold"):
        m.search("x", filters={"user_id": "u"}, threshold="0.5")
    for filters in (["user_id", "u"], "user_id=u"):
        with pytest.raises(ValidationError, match="filters must be a dict"):
            m.search("x", filters=filters)  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match="filters must be a dict"):
            m.get_all(filters=filters)  # type: ignore[arg-type]
    for timestamp in (1e20, float("inf"), float("nan"), -1e13):
        with pytest.raises(ValidationError, match="Unix seconds"):
            m.add("x", user_id="u", timestamp=timestamp)
    with pytest.raises(ValidationError, match="64 bits"):
        m.add("x", user_id="u", metadata={"order": 2**70})
    assert m.get_all(filters={"user_id": "u"}) == {"results": []}  # nothing was written


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"llm": "openai", "embedder": {"provider": "hash"}}, "must be a dict"),
        ({"embedder": "hash"}, "must be a dict"),
        ({"embedder": {"provider": "hsah"}}, "embedder provider 'hsah'"),
        ({"embedder": {"provider": "huggingface"}}, "embedder provider 'huggingface'"),
    ],
)
def test_a_config_tkg_cannot_follow_is_refused(config: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Memory.from_config(config)


@pytest.mark.parametrize(
    ("settings_", "match"),
    [
        ({"model": "m", "embedding_dims": 0}, "embedding_dims"),
        ({"model": "m", "embedding_dims": "8"}, "embedding_dims"),
        ({"model": "m", "embedding_dims": True}, "embedding_dims"),
        ({"model": 3, "embedding_dims": 8}, "model"),
        ({"model": "m", "dims": 8}, "unknown key"),
        ("text-embedding-3-small", "must be a dict"),
    ],
)
def test_an_openai_embedder_config_tkg_cannot_follow_is_refused(settings_: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Memory.from_config({"embedder": {"provider": "openai", "config": settings_}})


def test_an_openai_embedder_config_is_followed() -> None:
    """Mem0's embedder block (model, embedding_dims, api_key, openai_base_url) reaches the endpoint it names."""
    from fake_openai_server import FakeOpenAIServer

    with FakeOpenAIServer() as server:
        config = {
            "embedder": {
                "provider": "openai",
                "config": {
                    "model": "nomic-embed-text",
                    "embedding_dims": 8,
                    "api_key": "sk-test",
                    "openai_base_url": server.base_url,
                },
            }
        }
        m = Memory.from_config(config)
        m.add("I like green tea", user_id="u", infer=False)
        assert m.search("green tea", filters={"user_id": "u"})["results"][0]["memory"] == "I like green tea"
        embed_calls = [body for path, body in server.requests if path == "/v1/embeddings"]
        assert embed_calls and all(body["model"] == "nomic-embed-text" for body in embed_calls)
        assert all("dimensions" not in body for body in embed_calls)  # a model that cannot shorten is not asked
        # text-embedding-3 models are asked for embedding_dims, as Mem0 asks (they would give 1536 or 3072)
        config["embedder"]["config"]["model"] = "text-embedding-3-large"
        Memory.from_config(config).add("I like green tea", user_id="u", infer=False)
        asked = [body for path, body in server.requests if path == "/v1/embeddings"][len(embed_calls) :]
        assert asked and all(body["dimensions"] == 8 for body in asked)


def test_timestamp_is_the_messages_time() -> None:
    m = offline()
    item = m.add("we met yesterday", user_id="u", timestamp="2023-03-02T10:00:00Z")["results"][0]
    assert item["valid_at"] == "2023-03-02T10:00:00+00:00"
    assert m.add("unix time", user_id="u", timestamp=0)["results"][0]["valid_at"] == "1970-01-01T00:00:00+00:00"


def test_threshold_uses_cosine_similarity() -> None:
    m = offline()
    m.add("the quick brown fox", user_id="u")
    m.add("completely unrelated words here", user_id="u")
    assert texts(m.search("quick brown fox", filters={"user_id": "u"}, threshold=0.5)) == ["the quick brown fox"]
    # the memory's text, not the "User: the quick brown fox" its episode embeds (0.78: refused at 0.8)
    assert texts(m.search("quick brown fox", filters={"user_id": "u"}, threshold=0.88)) == ["the quick brown fox"]
    assert m.search("quick brown fox", filters={"user_id": "u"}, threshold=0.89) == {"results": []}  # cosine 0.885


# -- scopes as groups, and the property --------------------------------------------------------------------


def test_scope_groups_round_trip_and_escape() -> None:
    for scope in ({"user_id": "alice"}, {"user_id": "a.b:c_d", "run_id": "42"}, {"agent_id": "é-名"}):
        group = scope_group(scope)
        assert scope_of(group) == scope
    assert scope_of("default") is None and scope_of("mem0.x:1") is None
    assert matches({"a": 1}, {"a": {"lt": 2, "gt": 0}}) and not matches({"a": "x"}, {"a": {"gt": 1}})


ids = st.sampled_from(["u1", "u2", "a b".replace(" ", "_"), "42", "é"])
scopes = st.fixed_dictionaries({}, optional={"user_id": ids, "agent_id": ids, "run_id": ids}).filter(bool)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(adds=st.lists(st.tuples(scopes, st.integers(0, 10**6)), min_size=1, max_size=6), probe=scopes)
def test_what_is_added_is_found_in_its_scope_and_never_outside(
    adds: list[tuple[dict[str, str], int]], probe: dict[str, str]
) -> None:
    m = offline()
    placed: list[tuple[dict[str, str], str]] = []
    for scope, n in adds:
        text = f"note {n} {len(placed)}"
        m.add(text, infer=False, **scope)
        placed.append((scope, text))
    listed = set(texts(m.get_all(filters=probe, top_k=1000)))
    expected = {text for scope, text in placed if all(scope.get(k) == v for k, v in probe.items())}
    assert listed == expected
    for scope, text in placed:
        assert text in texts(m.get_all(filters=scope, top_k=1000))


# -- a Mem0 user's script, with only the import line changed --------------------------------------------------

MEM0_QUICKSTART = """
from mem0 import Memory

m = Memory()
messages = [
    {"role": "user", "content": "I'm planning to watch a movie tonight. Any recommendations?"},
    {"role": "assistant", "content": "How about thriller movies? They can be quite engaging."},
    {"role": "user", "content": "I'm not a big fan of thriller movies but I love sci-fi movies."},
    {"role": "assistant", "content": "Got it! I'll avoid thriller recommendations and suggest sci-fi movies."},
]
result = m.add(messages, user_id="alice", metadata={"category": "movies"})
related_memories = m.search("Should I watch a thriller?", filters={"user_id": "alice"}, top_k=3)
memories_str = "\\n".join(f"- {entry['memory']}" for entry in related_memories["results"])
all_memories = m.get_all(filters={"user_id": "alice"})
memory_id = all_memories["results"][0]["id"]
specific_memory = m.get(memory_id)
m.update(memory_id=memory_id, text="I love India, it is my favorite country.")
history = m.history(memory_id=memory_id)
m.delete(memory_id=memory_id)
m.delete_all(user_id="alice")
m.reset()
print(len(result["results"]), len(memories_str.splitlines()), [h["event"] for h in history])
"""


def test_a_mem0_quickstart_runs_with_only_the_import_changed(tmp_path: Path) -> None:
    script = tmp_path / "quickstart.py"
    script.write_text(
        textwrap.dedent(MEM0_QUICKSTART).replace("from mem0 import Memory", "from tkg.compat.mem0 import Memory")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TKG_", "OPENAI_"))}
    run = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "4 3 ['ADD', 'UPDATE']"


def test_the_readme_mem0_section_shows_the_import_line() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Coming from Mem0", 1)[1].split("\n## ", 1)[0]
    assert "from tkg.compat.mem0 import Memory" in section
    for call in ("add(", "search(", "get_all(", "get(", "update(", "delete(", "delete_all(", "history(", "reset("):
        assert f"`m.{call}" in section or f"m.{call}" in section, call


def test_now_is_utc() -> None:  # items' times are UTC ISO strings, comparable as text
    m = offline()
    created = m.add("x", user_id="u")["results"][0]["created_at"]
    assert datetime.fromisoformat(created).tzinfo is not None and datetime.fromisoformat(created).utcoffset() == (
        datetime.now(UTC).utcoffset()
    )


def test_scope_ids_inside_and_or_not_filters_read_each_memory_s_own_scope() -> None:
    """A user_id or agent_id inside AND / OR / NOT is matched against the scope each memory was added in: NOT
    let another user's memories through, and OR / AND found nothing."""
    m = offline()
    m.add("alice likes tea", user_id="alice", agent_id="a", infer=False)
    m.add("bob likes tea", user_id="bob", agent_id="a", infer=False)
    m.add("alice likes tea with bot b", user_id="alice", agent_id="b", infer=False)
    cases = [
        ({"agent_id": "a", "NOT": [{"user_id": "bob"}]}, ["alice likes tea"]),
        (
            {"user_id": "alice", "OR": [{"agent_id": "a"}, {"agent_id": "b"}]},
            ["alice likes tea", "alice likes tea with bot b"],
        ),
        ({"user_id": "alice", "AND": [{"agent_id": "a"}]}, ["alice likes tea"]),
        ({"user_id": "alice", "NOT": [{"agent_id": {"in": ["a", "c"]}}]}, ["alice likes tea with bot b"]),
    ]
    for filters, expected in cases:
        assert sorted(texts(m.get_all(filters=filters))) == expected, filters
        assert sorted(texts(m.search("tea", filters=filters))) == expected, filters


def test_a_deleted_fact_is_not_found_by_get_nor_updated_again() -> None:
    """After delete, get() is None (as in Mem0), also for a fact that had not started yet; updating or deleting it
    again is MemoryNotFoundError and writes nothing (a future fact was taken as current: a ValidationError, after
    its new version had been written)."""
    clock = FixedClock("2024-05-01T00:00:00Z")
    m = with_llm(clock)
    ids = [
        m.add(f"I LIKES {what}.", user_id="ann")["results"][0]["id"] for what in ("Jazz since 2020", "Opera since 2030")
    ]
    clock.set("2024-06-01T00:00:00Z")
    for fid in ids:
        assert m.get(fid) is not None
        m.delete(fid)
        assert m.get(fid) is None
        before = m.get_all(user_id="ann", show_expired=True)["results"]
        with pytest.raises(MemoryNotFoundError, match="ended already"):
            m.update(fid, text="User likes it a lot")
        with pytest.raises(MemoryNotFoundError, match="ended already"):
            m.delete(fid)
        assert m.get_all(user_id="ann", show_expired=True)["results"] == before
        assert [e["event"] for e in m.history(fid)][-1] == "DELETE"
    assert m.get_all(user_id="ann")["results"] == []


def test_a_metadata_update_of_a_fact_not_started_yet_sets_updated_at() -> None:
    clock = FixedClock("2024-05-01T00:00:00Z")
    m = with_llm(clock)
    fid = m.add("I LIKES Jazz since 2030.", user_id="ann")["results"][0]["id"]
    clock.set("2024-06-01T00:00:00Z")
    assert m.update(fid, metadata={"checked": True})["id"] == fid  # the same fact, restated
    item = m.get(fid)
    assert item is not None and item["metadata"] == {"checked": True}
    assert (item["created_at"], item["updated_at"]) == ("2024-05-01T00:00:00+00:00", "2024-06-01T00:00:00+00:00")


def test_extracted_memories_keep_their_message_s_role_and_actor() -> None:
    """Mem0 keeps the actor and role of the message a memory came from: filters on them found only kept
    messages, history said actor_id None, and an update lost them."""
    clock = FixedClock("2024-05-01T00:00:00Z")
    m = with_llm(clock)
    added = m.add([{"role": "user", "name": "Ann", "content": "I LIVES_IN Paris since 2019."}], user_id="ann")
    [item] = added["results"]
    assert (item["role"], item["actor_id"]) == ("user", "Ann")
    for condition in ({"actor_id": "Ann"}, {"role": "user"}):
        assert texts(m.get_all(filters={"user_id": "ann", **condition})) == ["Ann lives in Paris"]
        assert texts(m.search("Paris", filters={"user_id": "ann", **condition})) == ["Ann lives in Paris"]
    assert m.get_all(filters={"user_id": "ann", "actor_id": "Bob"}) == {"results": []}
    clock.set("2024-06-01T00:00:00Z")
    new_id = m.update(item["id"], "Ann lives in Paris, near the Louvre")["id"]
    assert (m.get(new_id)["role"], m.get(new_id)["actor_id"]) == ("user", "Ann")
    rows = m.history(new_id)
    assert [(r["event"], r["role"], r["actor_id"]) for r in rows] == [
        ("ADD", "user", "Ann"),
        ("UPDATE", "user", "Ann"),
    ]
    assert [r["updated_at"][:10] for r in rows] == ["2024-05-01", "2024-06-01"]  # each row: when it was made
    assert {r["created_at"] for r in rows} == {rows[0]["updated_at"]}  # the memory's creation, on every row
    kept = m.add({"role": "assistant", "name": "Robo", "content": "Noted."}, user_id="ann", infer=False)
    assert [(r["event"], r["role"], r["actor_id"]) for r in m.history(kept["results"][0]["id"])] == [
        ("ADD", "assistant", "Robo")
    ]


def test_updating_a_kept_message_keeps_its_kind_and_the_speaker_s_offset() -> None:
    """An update rebuilt the episode from its UTC time as a message: the speaker's +05:45 became +00:00 (and
    "yesterday" another day), a JSON document became a message."""
    m = offline()
    said = m.add("I moved here yesterday", user_id="u", timestamp="2024-05-01T01:00:00+05:45", infer=False)
    memory_id = said["results"][0]["id"]
    assert said["results"][0]["valid_at"] == "2024-05-01T01:00:00+05:45"
    m.update(memory_id, metadata={"k": 1})
    episode = m.tkg.get(Kind.EPISODE, memory_id)
    assert episode.local_reference.isoformat() == "2024-05-01T01:00:00+05:45"
    assert m.get(memory_id)["valid_at"] == "2024-05-01T01:00:00+05:45"
    group = scope_group({"user_id": "u"})
    m.tkg.add_episode(
        '{"b": 1}', source="json", group_id=group, episode_id="doc", reference_time="2024-05-01T10:00:00-03:00"
    )
    m.update("doc", metadata={"k": 2})
    doc = m.tkg.get(Kind.EPISODE, "doc")
    assert (doc.source.value, doc.content, doc.reference_offset) == ("json", '{"b": 1}', -3 * 3600)


@pytest.mark.parametrize("key", ["OR", "NOT", "AND"])
def test_an_empty_list_of_filters_is_refused(key: str) -> None:
    """As in Mem0: {"OR": []} matched nothing and {"NOT": []} everything, without a word."""
    m = offline()
    m.add("hello", user_id="u")
    with pytest.raises(ValidationError, match="at least one"):
        m.get_all(filters={"user_id": "u", key: []})


def test_a_memory_not_found_is_named_as_mem0_names_it() -> None:
    m = offline()
    for call in (lambda: m.delete("non-existent-id"), lambda: m.update("non-existent-id", "x")):
        with pytest.raises(ValueError, match="Memory with id non-existent-id not found"):
            call()


def test_async_memory_awaits_every_call() -> None:
    """Mem0's AsyncMemory: the same calls, awaited, with the same answers."""
    import asyncio

    from tkg.compat.mem0 import AsyncMemory

    async def main() -> tuple[list[str], list[str], str | None, list[str]]:
        tkg_memory = TkgMemory(embedder=HashEmbedder(dim=64), clock=FixedClock("2024-05-01T00:00:00Z"))
        async with AsyncMemory(memory=tkg_memory) as m:
            first = (await m.add("I love tennis", user_id="u"))["results"][0]["id"]
            await asyncio.gather(*(m.add(f"note {i}", user_id="u") for i in range(3)))
            found = texts(await m.search("tennis", filters={"user_id": "u"}, top_k=1))
            await m.update(first, "I love squash")
            got = await m.get(first)
            events = [e["event"] for e in await m.history(first)]
            listed = sorted(texts(await m.get_all(filters={"user_id": "u"})))
            await m.delete(first)
            assert await m.get(first) is None
            await m.delete_all(user_id="u")
            assert (await m.get_all(filters={"user_id": "u"}))["results"] == []
            return found, events, got["memory"] if got else None, listed

    found, events, memory, listed = asyncio.run(main())
    assert (found, events, memory) == (["I love tennis"], ["ADD", "UPDATE"], "I love squash")
    assert listed == ["I love squash", "note 0", "note 1", "note 2"]


def test_filters_on_created_and_updated_times() -> None:
    """Filters on created_at / updated_at matched nothing; they compare as times (a date is its midnight UTC)."""
    clock = FixedClock("2024-05-01T10:00:00Z")
    m = offline(clock)
    m.add("first", user_id="u")
    clock.set("2024-06-01T10:00:00Z")
    m.add("second", user_id="u")

    def found(condition: dict[str, Any]) -> list[str]:
        return sorted(texts(m.get_all(filters={"user_id": "u", **condition})))

    assert found({"created_at": {"gte": "2024-05-15"}}) == ["second"]
    assert found({"created_at": {"lt": "2024-05-15T00:00:00+00:00"}}) == ["first"]
    assert found({"updated_at": {"gt": "2024-05-01T09:00:00-02:00"}}) == ["second"]  # 11:00 UTC
    assert found({"created_at": {"gte": "not a date"}}) == []
    assert texts(m.search("second", filters={"user_id": "u", "created_at": {"gte": "2024-05-15"}})) == ["second"]


def test_threshold_embeds_a_kept_message_s_text_once_and_only_when_its_vector_fails() -> None:
    """Judging kept messages on their own text embedded every message a search found, on every search (a paid
    embedder's cost); now only those their stored vector does not pass, each text once."""

    class Counting(HashEmbedder):
        texts = 0

        def embed(self, texts: list[str]) -> Any:
            Counting.texts += len(texts)
            return super().embed(texts)

    m = Memory(memory=TkgMemory(embedder=Counting(dim=64), clock=FixedClock("2024-05-01T00:00:00Z")))
    for i in range(40):
        m.add(f"note about topic {i}", user_id="u")
    m.add("usb cable", user_id="u")
    Counting.texts = 0
    assert len(texts(m.search("note about topic", filters={"user_id": "u"}, threshold=0.1, limit=20))) == 20
    # the query (search, threshold), and the one message found whose stored vector fails: "usb cable"
    assert Counting.texts == 3
    assert texts(m.search("usb cable", filters={"user_id": "u"}, threshold=0.88)) == ["usb cable"]
    first = Counting.texts
    assert texts(m.search("usb cable", filters={"user_id": "u"}, threshold=0.88)) == ["usb cable"]
    assert Counting.texts - first == 2  # the second time, the messages' texts are known


def test_filters_on_a_list_of_tags() -> None:
    """contains, icontains, in and nin on list-valued metadata matched nothing (or everything, for nin)."""
    m = offline()
    m.add("first", user_id="u", metadata={"tags": ["Work", "urgent"]})
    m.add("second", user_id="u", metadata={"tags": ["home"]})
    m.add("third", user_id="u", metadata={"tags": "work and play"})

    def found(condition: dict[str, Any]) -> list[str]:
        return sorted(texts(m.get_all(filters={"user_id": "u", "tags": condition})))

    assert found({"contains": "urgent"}) == ["first"]
    assert found({"icontains": "work"}) == ["first", "third"]  # a tag equal but for case; a text holding it
    assert found({"in": ["home", "urgent"]}) == ["first", "second"]
    assert found({"nin": ["home"]}) == ["first", "third"]


def test_updates_and_deletes_of_one_memory_from_threads_go_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four threads update one memory and a fifth deletes it, each after a pause between reading the latest version
    and writing: they go one at a time, each to the version before it, so at most one version is current and the
    history lists every one."""
    import threading
    import time

    m = with_llm(FixedClock("2024-05-01T00:00:00Z"))
    fact_id = m.add("I LIKES Jazz.", user_id="ann")["results"][0]["id"]
    check = Memory._require_current

    def slow(fact: Any, now: datetime) -> None:
        check(fact, now)
        time.sleep(0.05)  # between the check and the write: another update would pass the same check meanwhile

    monkeypatch.setattr(Memory, "_require_current", staticmethod(slow))
    threads = [
        threading.Thread(target=m.update, args=(fact_id,), kwargs={"text": f"User likes tune {i}"}) for i in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    current = m.get_all(filters={"user_id": "ann"})["results"]
    assert len(current) == 1 and current[0]["memory"].startswith("User likes tune")
    assert [e["event"] for e in m.history(fact_id)] == ["ADD"] + ["UPDATE"] * 4
    refused: list[Exception] = []

    def attempt(call: Any, *args: Any, **kwargs: Any) -> None:
        try:
            call(*args, **kwargs)
        except MemoryNotFoundError as exc:
            refused.append(exc)

    pair = [
        threading.Thread(target=attempt, args=(m.delete, fact_id)),
        threading.Thread(target=attempt, args=(m.update, fact_id), kwargs={"text": "User likes tune 9"}),
    ]
    for thread in pair:
        thread.start()
    for thread in pair:
        thread.join(30)
    # Either the delete ended the latest version and the update found nothing current, or the update replaced it
    # and the delete ended the new one: nothing is current either way.
    assert m.get_all(filters={"user_id": "ann"})["results"] == []
    assert len(refused) == (0 if "tune 9" in str(m.history(fact_id)) else 1)


def test_facades_over_one_memory_update_it_one_at_a_time_and_a_lost_race_is_undone_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two facades over one memory update the same memory at once, each pausing between its read and its writes:
    they go one at a time (one lock per tkg memory), each replacing the version before it. An update whose old
    version another writer ended meanwhile (another process over the same store) is taken back whole and raises."""
    import threading
    import time

    from tkg.errors import TkgError

    memory = TkgMemory(
        embedder=HashEmbedder(dim=64),
        llm=RulesLLM(),
        clock=FixedClock("2024-05-01T00:00:00Z", tick=timedelta(seconds=1)),
    )
    one, two = Memory(memory=memory), Memory(memory=memory)
    fact_id = one.add("I LIKES Jazz.", user_id="ann")["results"][0]["id"]
    check = Memory._require_current

    def slow(fact: Any, now: datetime) -> None:
        check(fact, now)
        time.sleep(0.05)

    monkeypatch.setattr(Memory, "_require_current", staticmethod(slow))
    threads = [
        threading.Thread(target=facade.update, args=(fact_id,), kwargs={"text": text})
        for facade, text in ((one, "User likes A"), (two, "User likes B"))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(one.get_all(filters={"user_id": "ann"})["results"]) == 1
    assert [e["event"] for e in two.history(fact_id)] == ["ADD", "UPDATE", "UPDATE"]
    monkeypatch.setattr(Memory, "_require_current", staticmethod(check))
    facts_before = sorted(f.id for f in memory.records(Kind.FACT))

    def ended_meanwhile(*args: Any, **kwargs: Any) -> None:
        raise ValidationError("fact already ends at 2024-05-01T00:00:09+00:00, not after then")

    monkeypatch.setattr(memory, "invalidate_fact", ended_meanwhile)
    with pytest.raises(TkgError, match="already ends"):
        one.update(fact_id, text="User likes C")
    assert sorted(f.id for f in memory.records(Kind.FACT)) == facts_before  # the new version taken back
    assert "User likes C" not in {f.fact for f in memory.records(Kind.FACT)}


def test_history_rows_carry_the_memory_s_creation_and_the_change_s_time() -> None:
    """As in Mem0's suite (a DELETE row keeps the memory's created_at): every row of a memory's history carries
    when the memory was created; updated_at is when that change was made. Before, created_at was the change's."""
    clock = FixedClock("2024-01-01T00:00:00Z")
    m = offline(clock)
    kept = m.add("I like Python.", user_id="u", infer=False)["results"][0]["id"]
    clock.set("2024-03-01T00:00:00Z")
    m.update(kept, "I like Rust.")
    rows = m.history(kept)
    assert [(r["event"], r["created_at"][:10], r["updated_at"][:10]) for r in rows] == [
        ("ADD", "2024-01-01", "2024-01-01"),
        ("UPDATE", "2024-01-01", "2024-03-01"),
    ]
    assert m.get(kept)["created_at"] == rows[0]["created_at"]
    m2 = with_llm(clock := FixedClock("2024-01-01T00:00:00Z"))
    fact = m2.add("I LIKES Jazz.", user_id="u")["results"][0]["id"]
    clock.set("2024-02-01T00:00:00Z")
    m2.delete(fact)
    rows = m2.history(fact)
    assert [(r["event"], r["created_at"][:10], r["updated_at"][:10]) for r in rows] == [
        ("ADD", "2024-01-01", "2024-01-01"),
        ("DELETE", "2024-01-01", "2024-02-01"),
    ]


def test_a_star_on_a_scope_id_reads_every_id_of_that_kind() -> None:
    """Mem0's "*" means present, on its scope ids too: {"user_id": "u1", "agent_id": "*"} reads what u1 added with
    any agent, not with none (it was taken as the agent id "*", and read nothing). delete_all refuses it: it
    erases named scopes only."""
    m = offline()
    m.add("agent memory", user_id="u1", agent_id="bot", infer=False)
    m.add("other agent", user_id="u1", agent_id="helper", infer=False)
    m.add("user-only memory", user_id="u1", infer=False)
    m.add("someone else", user_id="u2", agent_id="bot", infer=False)
    wanted = {"user_id": "u1", "agent_id": "*"}
    assert sorted(texts(m.get_all(filters=wanted))) == ["agent memory", "other agent"]
    assert sorted(texts(m.search("memory agent", filters=wanted))) == ["agent memory", "other agent"]
    assert sorted(texts(m.get_all(filters={"agent_id": "*"}))) == ["agent memory", "other agent", "someone else"]
    assert sorted(texts(m.get_all(filters={"user_id": "u1"}))) == ["agent memory", "other agent", "user-only memory"]
    with pytest.raises(ValidationError, match="names none"):
        m.delete_all(user_id="*")
    assert len(m.get_all(filters={"user_id": "*"})["results"]) == 4  # nothing erased
    with pytest.raises(ValidationError, match="not an id"):  # a scope only "*" could read, and nothing erase
        m.add("star memory", user_id="*", infer=False)
    assert texts(m.get_all(filters={"agent_id": "*"}, user_id="u2")) == ["someone else"]  # the named id narrows


def test_expiration_date_hides_a_memory_after_that_day_unless_show_expired() -> None:
    """Mem0's expiration_date on add and update (it raised TypeError): kept beside the memory, and from the day
    after, the memory is left out of get_all and search unless show_expired; update sets, changes or clears it;
    a date that is not one is refused, and nothing is added."""
    clock = FixedClock("2024-05-01T00:00:00Z")
    m = with_llm(clock)
    kept = m.add("Renew the passport.", user_id="u", infer=False, expiration_date="2024-05-10")["results"][0]
    fact = m.add("I LIKES Jazz.", user_id="u", expiration_date="2024-06-30")["results"][0]
    m.add("I LIKES Opera.", user_id="u")
    assert (kept["expiration_date"], fact["expiration_date"]) == ("2024-05-10", "2024-06-30")
    assert kept["metadata"] is None  # shown beside the metadata, as Mem0 does

    def shown(**kwargs: Any) -> list[str]:
        return sorted(texts(m.get_all(filters={"user_id": "u"}, **kwargs)))

    def searched(**kwargs: Any) -> list[str]:
        return sorted(texts(m.search("passport jazz opera", filters={"user_id": "u"}, **kwargs)))

    everything = ["Renew the passport.", "User likes Jazz", "User likes Opera"]
    assert shown() == searched() == everything
    clock.set("2024-05-10T23:00:00Z")  # the last day it holds
    assert shown() == everything
    clock.set("2024-05-11T00:00:00Z")
    assert shown() == searched() == ["User likes Jazz", "User likes Opera"]
    assert shown(show_expired=True) == searched(show_expired=True) == everything
    assert shown(as_of="2024-05-05T00:00:00Z") == everything  # read as of a day it held
    assert m.get(kept["id"])["expiration_date"] == "2024-05-10"  # get finds it, as in Mem0
    assert m.get_all(filters={"user_id": "u", "expiration_date": "2024-06-30"})["results"][0]["memory"] == (
        "User likes Jazz"
    )
    m.update(kept["id"], expiration_date="2024-12-31")
    assert shown() == everything
    new_fact = m.update(fact["id"], expiration_date="2024-05-01")["id"]
    assert shown() == ["Renew the passport.", "User likes Opera"]
    m.update(new_fact, expiration_date=None)
    assert shown() == everything and m.get(new_fact)["expiration_date"] is None
    for bad in ("next week", "2024-13-01", 20240501):
        with pytest.raises(ValidationError, match="expiration_date"):
            m.add("Bad date.", user_id="u", infer=False, expiration_date=bad)
    assert set(shown(show_expired=True)) == set(everything)  # with the updated versions of the fact
