"""Issue 14, items 4 and 5: dates on the speaker's calendar, and what the LLM or the caller say that cannot be
stored (an LLM's fault fails the episode for a retry; the caller's is refused at the door)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tkg import (
    BackgroundIngestor,
    FixedClock,
    HashEmbedder,
    IngestionStatus,
    Kind,
    Memory,
    MemoryConfig,
    RulesLLM,
    ScriptedLLM,
)
from tkg.errors import ExtractionFailedError, ValidationError
from tkg.inputs import FactInput
from tkg.llm import LLMPolicy, Prompt
from tkg.llm.schema import GraphExtraction
from tkg.models import MAX_NAME_CHARS, EpisodeStatus
from tkg.storage import Store

EMB = HashEmbedder(dim=32)


def memory_with(answer: Callable[[Prompt], dict[str, Any]], store: Store | None = None) -> Memory:
    def handler(prompt: Prompt, model: Any) -> Any:
        if model is GraphExtraction:
            return answer(prompt)
        return {}

    return Memory(
        store,
        embedder=EMB,
        llm=ScriptedLLM(handler=handler),
        clock=FixedClock("2024-06-01T00:00:00Z"),
        config=MemoryConfig(llm_policy=LLMPolicy(max_attempts=1, backoff_initial=0.0), communities=None),
    )


def moved(valid_from: str | None, *, name: str = "Berlin", sentence: str = "Ann moved to Berlin") -> dict[str, Any]:
    return {
        "entities": [{"name": "Ann"}, {"name": name}],
        "facts": [
            {"source": "Ann", "target": name, "relation": "MOVED_TO", "fact": sentence, "valid_from": valid_from}
        ],
    }


@pytest.mark.parametrize(
    ("said_at", "phrase", "day"),
    [
        ("2024-05-01T01:00:00+02:00", "yesterday", datetime(2024, 4, 30, tzinfo=UTC)),  # 30 April on her clock
        ("2024-04-30T23:30:00-05:00", "yesterday", datetime(2024, 4, 29, tzinfo=UTC)),  # still 30 April there
        ("2024-05-04T10:00:00+09:00", "last weekend", datetime(2024, 4, 27, tzinfo=UTC)),  # said on a Saturday
        ("2024-05-01T01:00:00+02:00", "last Friday", datetime(2024, 4, 26, tzinfo=UTC)),
        ("2024-05-01T01:00:00+14:00", "in March", datetime(2024, 3, 1, tzinfo=UTC)),
    ],
)
def test_calendar_phrases_fall_on_the_speakers_own_day(said_at: str, phrase: str, day: datetime) -> None:
    memory = memory_with(lambda prompt: moved(phrase))
    result = memory.add_episode("Ann: I moved to Berlin.", group_id="g", reference_time=said_at)
    assert [f.valid_at for f in result.facts] == [day]
    episode = result.episode
    assert episode.reference_time.tzinfo is UTC and episode.local_reference.isoformat() == said_at
    # the offset is part of the episode: it survives a save and a load
    assert memory.get(Kind.EPISODE, episode.id).reference_offset == episode.reference_offset  # type: ignore[attr-defined]


def test_structured_facts_resolve_phrases_on_the_callers_day() -> None:
    memory = memory_with(lambda prompt: moved(None))
    result = memory.add_facts(
        [FactInput("Ann", "MOVED_TO", "Berlin", valid_at="yesterday")],
        group_id="g",
        reference_time="2024-05-01T01:00:00+02:00",
    )
    assert result.facts[0].valid_at == datetime(2024, 4, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    "answer",
    [
        moved("0000"),
        moved("9999-12-31"),
        moved("2099-13-45"),
        moved("now", name="Ber\x00lin"),
        moved("now", sentence="Ann moved to \ud800Berlin"),
        {"entities": [{"name": "Ann", "summary": "Ann was born in \x00"}], "facts": []},
        moved("now", name="Berlin " * 100),  # a name longer than a database keeps as a key (MAX_NAME_CHARS)
        moved("-44"),  # 45 BC: was stored as 1 June 2044, with no warning
        moved("-2020-03-01"),  # was 1 March 2020
    ],
    ids=[
        "year-zero",
        "end-of-time",
        "month-13",
        "nul",
        "lone-surrogate",
        "nul-in-summary",
        "name-too-long",
        "negative-year",
        "negative-date",
    ],
)
def test_an_unstorable_answer_is_the_llms_failure_and_retry_works(
    make_store: Callable[[int], Store], answer: dict[str, Any]
) -> None:
    answers = [answer]

    def next_answer(prompt: Prompt) -> dict[str, Any]:
        return answers.pop(0) if answers else moved("2020-01-01")

    memory = memory_with(next_answer, make_store(EMB.dim))
    with pytest.raises(ExtractionFailedError) as failed:
        memory.add_episode("Ann: I moved to Berlin.", group_id="g")
    episode_id = failed.value.episode_id
    stored = memory.get(Kind.EPISODE, episode_id)
    assert stored.status is EpisodeStatus.FAILED and "cannot be stored" in stored.error  # type: ignore[attr-defined]
    assert memory.records(Kind.FACT) == [] and memory.records(Kind.ENTITY) == []  # nothing else written
    retried = memory.retry(episode_id)
    assert retried.status is EpisodeStatus.EXTRACTED
    assert [f.valid_at for f in retried.facts] == [datetime(2020, 1, 1, tzinfo=UTC)]


def test_a_background_episode_with_an_unstorable_answer_fails_instead_of_staying_queued() -> None:
    memory = memory_with(lambda prompt: moved("9999-12-31"))
    with BackgroundIngestor(memory, workers=1) as ingestor:
        status = ingestor.wait(ingestor.submit("Ann: I moved to Berlin.", group_id="g"), timeout=30)
    assert status.state == "failed"
    stored = memory.get(Kind.EPISODE, status.episode_id)
    assert stored.status is EpisodeStatus.FAILED  # type: ignore[attr-defined]
    assert memory.queued_episodes() == []
    # as the stored record tells it, and retry() works: answered badly is worth trying again (it said False)
    assert status.retryable and IngestionStatus.of(stored).retryable  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad", ["Ann: I moved to Ber\x00lin.", "Ann: I moved to \udc00Berlin."], ids=["nul", "surrogate"]
)
def test_the_callers_unstorable_text_is_refused_at_the_door(bad: str) -> None:
    memory = memory_with(lambda prompt: moved("now"))
    with pytest.raises(ValidationError):
        memory.add_episode(bad, group_id="g")
    with pytest.raises(ValidationError):
        memory.queue_episode(bad, group_id="g")
    with pytest.raises(ValidationError):
        memory.add_facts([FactInput("Ann", "MOVED_TO", bad)], group_id="g")
    assert memory.records(Kind.EPISODE) == [] and memory.stats()["groups"] == []


@pytest.mark.parametrize("relation", ["!!!", "é", " - "])
def test_a_relation_with_no_letter_or_digit_is_refused_from_the_caller_and_read_as_relates_to_from_the_llm(
    relation: str,
) -> None:
    """The README promised a refusal; the caller's "!!!" was stored as RELATES_TO without a word."""
    memory = memory_with(lambda prompt: {**moved("now"), "facts": [{**moved("now")["facts"][0], "relation": relation}]})
    with pytest.raises(ValidationError, match="no letter or digit"):
        memory.add_facts([FactInput("Bob", relation, "Boston")], group_id="g")
    assert memory.records(Kind.EPISODE) == []
    result = memory.add_episode("Ann: I moved to Berlin.", group_id="g")
    assert [f.relation for f in result.facts] == ["RELATES_TO"]
    assert any("no letter A-Z" in w for w in result.warnings)


def test_a_name_longer_than_a_database_keeps_as_a_key_is_refused_at_the_door_on_every_backend(
    make_store: Callable[[int], Store],
) -> None:
    """PostgreSQL refused the write (a name is a key of its name index, at most ~2.7 KB) where memory took it."""
    memory = memory_with(lambda prompt: moved("now"), make_store(EMB.dim))
    long = "Berlin " * 100
    for fact in (FactInput(long, "LIKES", "Tea"), FactInput("Ann", "LIKES", long)):
        with pytest.raises(ValidationError, match="a name is at most 500"):
            memory.add_facts([fact], group_id="g")
    memory.add_facts([FactInput("B" * MAX_NAME_CHARS, "LIKES", "Tea")], group_id="g")  # the longest is kept
    assert [e.name for e in memory.records(Kind.ENTITY)] == ["B" * MAX_NAME_CHARS, "Tea"]


def test_the_offset_must_be_a_real_one() -> None:
    memory = memory_with(lambda prompt: moved("now"))
    result = memory.add_episode("Ann: hi", group_id="g", reference_time=datetime(2024, 5, 1, tzinfo=UTC) + timedelta(0))
    assert result.episode.reference_offset == 0


@pytest.mark.parametrize("bad", [5, None, b"m.tkg", "", ["m.tkg"]])
def test_a_file_path_that_is_no_path_is_refused_with_tkgs_error(bad: Any) -> None:
    memory = Memory(embedder=EMB)
    for call in (
        lambda: memory.save(bad),
        lambda: Memory.load(bad, embedder=EMB),
        lambda: Memory.open(bad, embedder=EMB),
    ):
        with pytest.raises(ValidationError, match="file path"):
            call()


@pytest.mark.parametrize("bad", [["x"], {"x": 1}, {"x"}, 5, None])
def test_an_episode_id_that_is_no_string_is_refused_with_tkgs_error_by_every_door_of_the_queue(bad: Any) -> None:
    memory = Memory(embedder=EMB, llm=RulesLLM())
    background = BackgroundIngestor(memory)
    doors = (memory.retry, memory.process_queued, memory.requeue, memory.remove_episode, memory.invalidate_fact)
    for door in (*doors, memory.episode_mentions, background.status, background.future):
        with pytest.raises(ValidationError, match="an id is a string"):
            door(bad)
    background.close()
    assert memory.records(Kind.EPISODE) == []


def test_get_many_refuses_one_string_for_a_list_of_ids() -> None:
    memory = Memory(embedder=EMB)
    memory.add_facts([FactInput("Ann", "LIKES", "Tea")], group_id="g")
    fact = memory.records(Kind.FACT)[0]
    assert memory.get_many(Kind.FACT, [fact.id]) == [fact]
    with pytest.raises(ValidationError, match="not one string"):
        memory.get_many(Kind.FACT, fact.id)


@pytest.mark.parametrize(
    ("fact", "field"),
    [
        (FactInput(" ", "LIKES", "Tea"), "subject"),
        (FactInput("Ann", "", "Tea"), "relation"),
        (FactInput("Ann", "LIKES", "Tea", object_label=" "), "object_label"),
    ],
)
def test_an_empty_part_of_a_fact_is_named_in_the_error(fact: FactInput, field: str) -> None:
    memory = Memory(embedder=EMB)
    with pytest.raises(ValidationError, match=f"a fact's {field}") as refused:
        memory.add_facts([fact], group_id="g")
    assert "FactInput(" not in str(refused.value)  # the message an HTTP client reads, not a Python repr
    assert memory.groups() == []
